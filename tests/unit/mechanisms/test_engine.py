"""The batched diffusion engine: the same releases as one query at a time, column by column."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.mechanisms import engine as engine_module
from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
from service.mechanisms.engine import DiffusionEngine, DiffusionJob, EngineFailure, run_jobs
from service.mechanisms.exact_laplace import rounded_laplace_pair_sum
from service.mechanisms.grid_noise import draw_pair_noise, grid_step
from service.mechanisms.operator import walk_operator
from service.mechanisms.word_stream import numpy_generator, stream_from
from service.privacy.calibration import DiffusionConfig, plan_diffusion
from service.privacy.modes import Mode
from service.privacy.state_grid import INPUT_CLAMP, NOISE_SATURATION, step_noise_plan
from tests.graph_helpers import graph_from_edges, random_graph

P, E = Mode.PERSONALIZED, Mode.EDGE


def _config(mode: Mode, steps: int = 20, noisy: int = 4, scale: float = 1e-3) -> DiffusionConfig:
    return DiffusionConfig(
        mode=mode, beta=0.8, steps=steps, eta=1e-3, noise_scale=scale, noisy_steps=noisy
    )


def test_a_block_releases_what_each_query_alone_releases() -> None:
    """Mixed modes, step counts, warm and cold seeds in one block: each column equals the
    single-query release drawn from the same generator."""
    graph = random_graph(300, 0.03, np.random.default_rng(1))
    specs = [
        (3, _config(P), True), (3, _config(E), False), (10, _config(E, 30, 6), True),
        (11, _config(P, 12, 1, 5e-4), False), (3, _config(P), False), (299, _config(E), True),
    ]  # fmt: skip
    engine = DiffusionEngine(max_batch=16, window_seconds=0.0)
    try:
        with engine._cv:  # hold the loop: all jobs arrive before its first block
            futures = []
            for i, (seed, config, warm) in enumerate(specs):
                prefix = (
                    noise_free_prefix(graph, seed, config.mode, config.beta, config.eta,
                                      config.noise_free_steps) if warm else None
                )  # fmt: skip
                futures.append(
                    engine.submit(graph, seed, config, rng=np.random.default_rng(100 + i),
                                  prefix=prefix)
                )  # fmt: skip
        results = [f.result(timeout=30) for f in futures]
    finally:
        engine.close()
    assert engine.max_width == len(specs)
    for i, ((seed, config, warm), result) in enumerate(zip(specs, results, strict=True)):
        alone = noisy_diffusion(graph, seed, config, rng=np.random.default_rng(100 + i))
        np.testing.assert_allclose(result.scores, alone, rtol=1e-12, atol=1e-15)
        if warm:
            assert result.prefix is None
        else:
            assert result.prefix is not None and not result.prefix.flags.writeable
            expected = noise_free_prefix(
                graph, seed, config.mode, config.beta, config.eta, config.noise_free_steps
            )
            np.testing.assert_allclose(result.prefix, expected, rtol=1e-12, atol=1e-15)


def test_concurrent_queries_on_two_graphs_from_many_threads() -> None:
    graphs = [random_graph(200, 0.04, np.random.default_rng(s)) for s in (2, 3)]
    engine = DiffusionEngine(max_batch=5)
    out: dict[int, np.ndarray] = {}

    def ask(i: int) -> None:
        graph = graphs[i % 2]
        result = engine.compute(graph, i, _config(E), rng=np.random.default_rng(i))
        out[i] = result.scores

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        engine.close()
    assert sorted(out) == list(range(24))
    assert engine.max_width <= 5
    for i, scores in out.items():
        alone = noisy_diffusion(graphs[i % 2], i, _config(E), rng=np.random.default_rng(i))
        np.testing.assert_allclose(scores, alone, rtol=1e-12, atol=1e-15)


def test_an_idle_engine_answers_one_query_and_each_draw_is_fresh() -> None:
    graph = random_graph(100, 0.05, np.random.default_rng(4))
    config = plan_diffusion(0.5, 1e-5, 20, 0.8, 1e-3, E).config
    engine = DiffusionEngine(max_batch=8, window_seconds=10.0)  # a long window never delays idle
    try:
        a = engine.compute(graph, 0, config, rng=np.random.default_rng(1)).scores
        b = engine.compute(graph, 0, config, rng=np.random.default_rng(2)).scores
    finally:
        engine.close()
    assert not np.array_equal(a, b)


def test_queries_submitted_together_start_as_one_block() -> None:
    """Inside together(), submissions wait and reach an idle engine at once: one block as
    wide as the group (a long window would otherwise leave all but the first for later)."""
    graph = random_graph(150, 0.05, np.random.default_rng(5))
    engine = DiffusionEngine(max_batch=16, window_seconds=10.0)
    try:
        with engine.together():
            futures = [
                engine.submit(graph, seed, _config(E), rng=np.random.default_rng(seed))
                for seed in range(6)
            ]
            assert not any(f.done() for f in futures)  # held until the block ends
        results = [f.result(timeout=30) for f in futures]
    finally:
        engine.close()
    assert engine.max_width == 6
    for seed, result in enumerate(results):
        alone = noisy_diffusion(graph, seed, _config(E), rng=np.random.default_rng(seed))
        np.testing.assert_allclose(result.scores, alone, rtol=1e-12, atol=1e-15)


def test_queries_held_for_a_closed_engine_fail_before_any_noise() -> None:
    graph = random_graph(50, 0.1, np.random.default_rng(6))
    engine = DiffusionEngine()
    with engine.together():
        future = engine.submit(graph, 0, _config(E), rng=np.random.default_rng(0))
        engine.close()
    with pytest.raises(EngineFailure) as failed:
        future.result(timeout=5)
    assert not failed.value.noise_drawn


def test_one_personalized_step_needs_no_noise() -> None:
    graph = graph_from_edges([(0, 1), (0, 2), (2, 3)])
    config = plan_diffusion(1.0, 1e-6, 1, 0.8, 0.1, P).config
    engine = DiffusionEngine()
    try:
        prefix = noise_free_prefix(graph, 0, P, 0.8, 0.1, 1)
        result = engine.compute(graph, 0, config, rng=np.random.default_rng(0), prefix=prefix)
    finally:
        engine.close()
    np.testing.assert_array_equal(result.scores, prefix)


def test_a_failure_reports_whether_noise_was_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = random_graph(100, 0.05, np.random.default_rng(5))
    config = _config(E, steps=10, noisy=3)
    calls = {"n": 0}
    real = engine_module.thresholded_step

    def fail_at_step(limit: int):  # type: ignore[no-untyped-def]
        def step(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == limit:
                raise MemoryError("simulated")
            return real(*args, **kwargs)

        return step

    for limit, drawn in ((3, False), (9, True)):  # step 3 is noise-free, step 9 after noise
        calls["n"] = 0
        monkeypatch.setattr(engine_module, "thresholded_step", fail_at_step(limit))
        engine = DiffusionEngine()
        try:
            with pytest.raises(EngineFailure) as failure:
                engine.compute(graph, 1, config, rng=np.random.default_rng(0))
        finally:
            engine.close()
        assert failure.value.noise_drawn is drawn
        assert isinstance(failure.value.error, MemoryError)


def test_the_compiled_grid_step_is_the_documented_arithmetic() -> None:
    """The fused step's grid step on the columns with a slot (clamp, round to the column's
    grid, add the integer noise, clamp to the limit, scale back) is bit for bit
    :func:`grid_step` of the noise-free step, for distinct grids and limits, noise large enough
    to reach both clamps, and n not a multiple of 64; and a block of many columns, some noisy
    and some not, releases what each query alone does."""
    graph = random_graph(301, 0.03, np.random.default_rng(3))
    op = walk_operator(graph)
    n = graph.n
    width = 19
    x = np.abs(np.random.default_rng(4).normal(size=(n, width))) * 1e-3
    x[:40] = 9.0  # with large thresholds, above INPUT_CLAMP after the step: clamped, rounded
    args = {
        "seeds": np.arange(width, dtype=np.int64) * 7,
        "betas": np.linspace(0.5, 0.9, width),
        "etas": np.where(np.arange(width) % 4 == 1, 50.0, 1e-3),
        "personalized": np.arange(width) % 3 == 0,
    }
    slots = np.array([-1 if k in (0, 5, 18) else k % 4 for k in range(width)], dtype=np.int64)
    grids = 2.0 ** -np.arange(20, 20 + width, dtype=np.float64)
    limits = (2.0 / grids).astype(np.int64)
    limits[7] = 3  # a tight clamp
    noise = np.random.default_rng(6).integers(-(2**61), 2**61, size=(4, n), dtype=np.int64)
    noise[:, ::2] //= 2**40  # some small, some saturating
    fused = engine_module.thresholded_step(
        op, x, **args, noise=noise, slots=slots, grids=grids, limits=limits
    )
    plain = engine_module.thresholded_step(op, x, **args)
    assert plain.max() > INPUT_CLAMP
    for k in range(width):
        if slots[k] >= 0:
            expected = grid_step(plain[:, k], noise[slots[k]], grids[k], int(limits[k]))
        else:
            expected = plain[:, k]
        np.testing.assert_array_equal(fused[:, k], expected)
        if slots[k] >= 0:  # on the grid, within the clamp
            units = fused[:, k] / grids[k]
            np.testing.assert_array_equal(units, np.rint(units))
            assert np.abs(units).max() <= limits[k]
    # through the engine: warm and cold columns, noisy and noise-free steps in one block
    config = _config(E, steps=6, noisy=2)
    jobs = [
        DiffusionJob(s, config, np.random.default_rng(700 + s),
                     noise_free_prefix(graph, s, E, 0.8, 1e-3, 4) if s % 2 else None)
        for s in range(width)
    ]  # fmt: skip
    run_jobs(graph, jobs)
    for s, job in enumerate(jobs):
        alone = noisy_diffusion(graph, s, config, rng=np.random.default_rng(700 + s))
        np.testing.assert_array_equal(job.future.result().scores, alone)


def test_pair_noise_is_one_saturated_pair_sum_draw_a_node() -> None:
    """``draw_pair_noise`` is n draws of the pair sum round((L1 + L2) / gamma) at the plan's
    gamma, each clipped at +-NOISE_SATURATION (n = 1 and 301), from the column's word stream
    in order: the draws numpy's SFC64 generator at the stream's state gives."""
    plan = step_noise_plan(1e-3, n=301, max_degree=40, eta=1e-3, beta=0.8)
    for n in (1, 301):
        stream = stream_from(np.random.default_rng(11))
        start = stream.copy()
        out = np.full(n + 1, 7, dtype=np.int64)
        draw_pair_noise(stream, plan, n, out)
        draws = rounded_laplace_pair_sum(numpy_generator(start), plan.s, plan.t, n)
        np.testing.assert_array_equal(out[:n], np.clip(draws, -NOISE_SATURATION, NOISE_SATURATION))
        assert out[n] == 7  # only the n nodes' entries are written
        assert not np.array_equal(stream, start)  # the stream moved past the words read
    assert np.abs(out).max() > 0


def test_reused_step_buffers_stay_exact_while_the_block_width_changes() -> None:
    """Columns join a running block between steps and leave it at different steps (the step
    buffers are reused, re-fitted and swapped): every column still equals its release alone."""
    graph = random_graph(250, 0.04, np.random.default_rng(8))
    specs = [(0, _config(E, 9, 2)), (1, _config(P, 14, 3)), (2, _config(E, 6, 1)),
             (3, _config(E, 12, 4)), (4, _config(P, 7, 2))]  # fmt: skip
    jobs = [DiffusionJob(s, c, np.random.default_rng(40 + s)) for s, c in specs]
    block = engine_module._Block(graph, walk_operator(graph))
    block.admit(jobs[:2])
    for step in range(40):
        if step == 2:
            block.admit(jobs[2:4])  # joins after two steps
        if step == 5:
            block.admit(jobs[4:])
        if not len(block) and step > 5:
            break
        if len(block):
            block.step()
    for (seed, config), job in zip(specs, jobs, strict=True):
        alone = noisy_diffusion(graph, seed, config, rng=np.random.default_rng(40 + seed))
        np.testing.assert_array_equal(job.future.result(timeout=1).scores, alone)


def test_the_warm_up_draws_several_columns_noise_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """warm_engine runs a block wide enough that each thread's columns of one gamma draw in
    one call, so that kernel is compiled (or loaded) before traffic too."""
    calls: list[int] = []
    draw_several = engine_module.draw_pair_noises

    def counted(streams: np.ndarray, plan: object, out: np.ndarray, rows: np.ndarray) -> None:
        calls.append(len(rows))
        draw_several(streams, plan, out, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "draw_pair_noises", counted)
    graph = random_graph(60, 0.1, np.random.default_rng(4))
    engine_module.warm_engine(graph, walk_operator(graph))
    assert calls and min(calls) >= 2
