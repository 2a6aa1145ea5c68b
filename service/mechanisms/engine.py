"""The batched diffusion engine: many queries' diffusions computed together, one block at a time.

Every query is one column of a dense float64 block X (n x B). One diffusion step of the whole
block is one sparse product A Z against the block (split by rows over both cores when it is
large enough: ``SPLIT_WORK`` in operator.py), while each column keeps its own seed,
thresholds, beta, step count, noise scale and its own generator seeded from the OS entropy
source:

    C = min(max(X, 0), T)            T[:, j] = eta_j d  (T[s_j, j] = 1 in personalized mode)
    X = beta * (A (C / d) + C) / 2 + (1 - beta) e_s      (a degree-0 node keeps its mass)
    X[:, j] = clip(round_g(clip(X[:, j])) + g M)     on column j's noisy steps (its
                                     last L_j steps): the grid step (service/privacy/state_grid.py)

Columns join a running block at its next step boundary and leave it when their K-th step is
done, so queries arriving while the engine is busy share the sparse products of the queries
already running, a query arriving when the engine is idle starts at once, and a cold query
(no cached noise-free prefix) runs its K - L noise-free steps in the same block as everyone
else. Noise is drawn only for columns on their noisy steps, each from its own word stream
(seeded by its own generator: :mod:`service.mechanisms.word_stream`), by the exact sampler
(:func:`service.mechanisms.grid_noise.draw_pair_noise`: one draw a node of the pair sum
M = round((L1 + L2) / gamma), the spec's two noise vectors drawn as their sum).
The noise-free prefix x_m of a cold column is handed back with its result (for the protected
prefix cache), never released.

The single-query function :func:`service.mechanisms.diffusion.noisy_diffusion` runs the same
block code with one column, in the caller's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from service.graph.model import Graph
from service.graph.public_bounds import public_degree_bound
from service.mechanisms.grid_noise import draw_pair_noise, draw_pair_noises, grid_step
from service.mechanisms.operator import StepWorkspace, WalkOperator, aligned_block, walk_operator
from service.mechanisms.word_stream import stream_from
from service.privacy.calibration import DiffusionConfig
from service.privacy.modes import Mode
from service.privacy.state_grid import StepNoise, step_noise_plan

log = logging.getLogger(__name__)

__all__ = ["DiffusionEngine", "DiffusionJob", "EngineFailure", "EngineResult", "run_jobs"]


class EngineFailure(Exception):
    """A query's diffusion failed; ``noise_drawn`` says whether any of its noise was drawn
    (if not, nothing can have been released and its charge may be refunded)."""

    def __init__(self, error: BaseException, *, noise_drawn: bool) -> None:
        super().__init__(f"diffusion failed ({'after' if noise_drawn else 'before'} noise): "
                         f"{error!r}")  # fmt: skip
        self.error = error
        self.noise_drawn = noise_drawn


@dataclass(frozen=True)
class EngineResult:
    """The released vector x_K, and x_m if the engine computed the noise-free prefix."""

    scores: np.ndarray
    prefix: np.ndarray | None = None


@dataclass(eq=False)
class DiffusionJob:
    """One query's diffusion: from ``prefix`` (x_m) if given, else from e_s (a cold query)."""

    seed: int
    config: DiffusionConfig
    rng: np.random.Generator | None
    prefix: np.ndarray | None = None
    keep_prefix: bool = True
    future: Future[EngineResult] = field(default_factory=Future)
    # progress
    done_steps: int = 0
    computed_prefix: np.ndarray | None = None
    noise: StepNoise | None = None  # the grid and the drawn scale, set when the job starts
    noise_drawn: bool = False
    stream: np.ndarray | None = None  # the noise's word stream, seeded by rng at the first draw

    @property
    def noise_scale(self) -> float:
        """The scale actually drawn (b'' >= the calibrated b), 0 before the job starts."""
        return self.noise.scale if self.noise is not None else 0.0

    @property
    def noise_free_steps(self) -> int:
        return self.config.steps - self.config.noisy_steps


def _start_vector(graph: Graph, job: DiffusionJob) -> np.ndarray:
    if job.prefix is not None:
        job.done_steps = job.noise_free_steps
        return np.asarray(job.prefix, dtype=np.float64)
    x = np.zeros(graph.n, dtype=np.float64)
    x[job.seed] = 1.0
    job.done_steps = 0
    return x


def thresholded_step(
    op: WalkOperator,
    x: np.ndarray,
    *,
    seeds: np.ndarray,
    betas: np.ndarray,
    etas: np.ndarray,
    personalized: np.ndarray,
    workspace: StepWorkspace | None = None,
    noise: np.ndarray | None = None,
    slots: np.ndarray | None = None,
    grids: np.ndarray | None = None,
    limits: np.ndarray | None = None,
) -> np.ndarray:
    """phi(f(x)) for every column of the block x (n x B) (into ``workspace``'s buffers if
    given); each column k with ``slots[k] >= 0`` then takes the grid step
    (:func:`service.mechanisms.grid_noise.grid_step`) with the integer noise
    ``noise[slots[k]]``, grid ``grids[k]`` and clamp ``limits[k]`` (in the kernel's pass over
    the rows, after the seed's ``1 - beta``)."""
    fused = op.fused_step(
        x, seeds=seeds, betas=betas, etas=etas, personalized=personalized, workspace=workspace,
        noise=noise, slots=slots, grids=grids, limits=limits,
    )  # fmt: skip
    if fused is not None:
        return fused
    clipped = np.maximum(x, 0.0)
    if np.all(etas == etas[0]):
        np.minimum(clipped, (etas[0] * op.degrees)[:, None], out=clipped)
    else:
        np.minimum(clipped, op.degrees[:, None] * etas[None, :], out=clipped)
    p = np.flatnonzero(personalized)
    if p.size:  # the seed's threshold is 1 in personalized mode
        clipped[seeds[p], p] = np.minimum(np.maximum(x[seeds[p], p], 0.0), 1.0)
    out = op.apply(clipped)
    out *= betas[None, :]
    out[seeds, np.arange(x.shape[1])] += 1.0 - betas
    if noise is not None and slots is not None and grids is not None and limits is not None:
        for k in np.flatnonzero(slots >= 0):
            out[:, k] = grid_step(out[:, k], noise[slots[k]], grids[k], int(limits[k]))
    return out


#: Bytes of a block's rows written per pass of :func:`_put_columns` (stays in cache).
_PUT_CHUNK_BYTES = 1 << 20


def _put_columns(dest: np.ndarray, columns: list[np.ndarray]) -> None:
    """``dest[:, q] = columns[q]`` for a C-ordered block, a band of rows at a time: each
    column's write is strided, and one band of the block stays in cache while every column
    writes into it, instead of one pass over the whole block per column (as np.stack)."""
    rows = max(1024, _PUT_CHUNK_BYTES // (8 * max(1, len(columns))))
    for lo in range(0, dest.shape[0], rows):
        band = dest[lo : lo + rows]
        for q, column in enumerate(columns):
            band[:, q] = column[lo : lo + rows]


def margin_degree(graph: Graph) -> int:
    """The degree the float64 margin kappa is computed from:
    :func:`service.graph.public_bounds.public_degree_bound` (the public bound, never the
    graph's own largest degree when it is served)."""
    return public_degree_bound(graph)


class _Block:
    """The columns of one graph that step together."""

    def __init__(self, graph: Graph, op: WalkOperator) -> None:
        self.graph = graph
        self.op = op
        self._jobs: tuple[DiffusionJob, ...] = ()
        self.x = np.empty((graph.n, 0), dtype=np.float64)
        self._max_degree = margin_degree(graph)
        self._workspace = StepWorkspace()
        self._noise = np.empty((0, graph.n), dtype=np.int64)
        self._columns = np.empty((0, graph.n), dtype=np.float64)
        # each column's seed, beta, eta, personalized: None after the columns changed
        self._column_parameters: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None
        self._column_parameters = None

    @property
    def jobs(self) -> tuple[DiffusionJob, ...]:
        """The block's columns' queries, in column order."""
        return self._jobs

    @jobs.setter
    def jobs(self, jobs: tuple[DiffusionJob, ...]) -> None:
        """The only way the columns change: their parameters are built again at the next step."""
        self._jobs = jobs
        self._column_parameters = None

    def __len__(self) -> int:
        return len(self.jobs)

    def admit(self, jobs: list[DiffusionJob]) -> None:
        fresh: list[DiffusionJob] = []
        columns: list[np.ndarray] = []
        for job in jobs:
            start = _start_vector(self.graph, job)
            c = job.config
            if c.noisy_steps > 0:
                job.noise = step_noise_plan(
                    c.noise_scale, n=self.graph.n, max_degree=self._max_degree, eta=c.eta,
                    beta=c.beta,
                )  # fmt: skip
            if job.done_steps >= c.steps:  # nothing left to do (one personalized step)
                if not job.future.done():
                    job.future.set_result(EngineResult(np.array(start, dtype=np.float64)))
                continue
            fresh.append(job)
            columns.append(start)
        if not fresh:
            return
        x = aligned_block(self.graph.n, len(self.jobs) + len(fresh))
        x[:, : len(self.jobs)] = self.x
        _put_columns(x[:, len(self.jobs) :], columns)
        self.x = x
        self.jobs = (*self.jobs, *fresh)

    def fail(self, exc: BaseException) -> None:
        for job in self.jobs:
            if not job.future.done():
                job.future.set_exception(EngineFailure(exc, noise_drawn=job.noise_drawn))
        self.jobs = ()
        self.x = np.empty((self.graph.n, 0), dtype=np.float64)

    def step(self) -> None:
        """One diffusion step of every column, noise where due, finished columns released."""
        jobs = self.jobs
        width = len(jobs)
        before = self.x
        # noise of the columns on a noisy step, each from its own generator, drawn before the
        # pass that adds it (the draws do not depend on the block)
        noisy = [i for i, job in enumerate(jobs) if job.done_steps >= job.noise_free_steps]
        noise: np.ndarray | None = None
        slots: np.ndarray | None = None
        grids: np.ndarray | None = None
        limits: np.ndarray | None = None
        if noisy:
            noise = self._draw_noise(noisy)
            slots = np.full(width, -1, dtype=np.int64)
            slots[noisy] = np.arange(len(noisy))
            grids = np.ones(width)
            limits = np.zeros(width, dtype=np.int64)
            for i in noisy:
                plan = jobs[i].noise
                assert plan is not None, "a noisy step needs the query's grid"
                grids[i], limits[i] = plan.grid, plan.limit
        seeds, betas, etas, personalized = self._parameters()
        out = thresholded_step(
            self.op,
            before,
            seeds=seeds,
            betas=betas,
            etas=etas,
            personalized=personalized,
            workspace=self._workspace,
            noise=noise,
            slots=slots,
            grids=grids,
            limits=limits,
        )
        prefixes: list[int] = []
        for i, job in enumerate(jobs):
            job.done_steps += 1
            if job.done_steps == job.noise_free_steps and job.keep_prefix:
                prefixes.append(i)
        for i, column in zip(
            prefixes, self.op.columns(out, prefixes, self._scratch(len(prefixes))), strict=True
        ):
            jobs[i].computed_prefix = column
        finished = [i for i, job in enumerate(jobs) if job.done_steps >= job.config.steps]
        for i, scores in zip(
            finished, self.op.columns(out, finished, self._scratch(len(finished))), strict=True
        ):
            job = jobs[i]
            prefix = job.computed_prefix
            if prefix is not None:
                prefix.setflags(write=False)
            if not job.future.done():
                job.future.set_result(EngineResult(scores, prefix))
        if finished:
            keep = [i for i in range(width) if jobs[i].done_steps < jobs[i].config.steps]
            self.jobs = tuple(jobs[i] for i in keep)
            kept = aligned_block(self.graph.n, len(keep))
            out = np.take(out, keep, axis=1, out=kept, mode="clip")
        self.x = out
        if out is self._workspace.out:  # the previous block is free: the next step's result
            self._workspace.swap(before)

    def _parameters(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each column's seed, beta, eta and whether it is personalized, built once for the
        block's columns (again after they change: the ``jobs`` setter resets them), not at
        every step."""
        jobs = self.jobs
        if self._column_parameters is None:
            self._column_parameters = (
                np.array([j.seed for j in jobs], dtype=np.int64),
                np.array([j.config.beta for j in jobs]),
                np.array([j.config.eta for j in jobs]),
                np.array([j.config.mode is Mode.PERSONALIZED for j in jobs]),
            )
        return self._column_parameters

    def _scratch(self, rows: int) -> np.ndarray:
        """A C-ordered buffer of at least ``rows`` x n for copying columns out of the block."""
        if len(self._columns) < rows:
            self._columns = aligned_block(rows, self.graph.n)
        return self._columns

    def _draw_noise(self, noisy: list[int]) -> np.ndarray:
        """The noise M of each noisy column (row q for column noisy[q], int64 grid units), each
        from its own word stream (:func:`service.mechanisms.grid_noise.draw_pair_noise`),
        seeded by the column's generator at its first noisy step.

        The columns are split over both threads (the sampler releases the GIL)."""
        for i in noisy:
            self.jobs[i].noise_drawn = True
        n = self.graph.n
        if len(self._noise) < len(noisy):
            self._noise = np.empty((len(noisy), n), dtype=np.int64)
        noise = self._noise[: len(noisy)]
        pool = self.op.pool
        if pool is None or len(noisy) < 2:
            self._draw(noisy, noise, range(len(noisy)))
        else:
            half = (len(noisy) + 1) // 2
            other = pool.submit(self._draw, noisy, noise, range(half, len(noisy)))
            try:
                self._draw(noisy, noise, range(half))
            finally:
                other.result()
        return noise

    def _draw(self, noisy: list[int], noise: np.ndarray, slots: range) -> None:
        """Column noisy[q]'s noise M into noise[q], from its own word stream: the columns of
        one plan (their gamma) in one compiled call, each stream moved on in place."""
        by_plan: dict[tuple[int, int], list[int]] = {}
        for q in slots:
            job = self.jobs[noisy[q]]
            assert job.rng is not None and job.noise is not None, "a noisy step needs its generator"
            if job.stream is None:
                job.stream = stream_from(job.rng)
            by_plan.setdefault((job.noise.s, job.noise.t), []).append(q)
        for group in by_plan.values():
            jobs = [self.jobs[noisy[q]] for q in group]
            plan = jobs[0].noise
            assert plan is not None
            if len(group) == 1:
                assert jobs[0].stream is not None
                draw_pair_noise(jobs[0].stream, plan, self.graph.n, noise[group[0]])
                continue
            streams = np.stack([job.stream for job in jobs])  # type: ignore[misc]
            draw_pair_noises(streams, plan, noise, np.array(group, dtype=np.int64))
            for job, moved in zip(jobs, streams, strict=True):
                job.stream = moved


def warm_engine(graph: Graph, op: WalkOperator | None = None) -> None:
    """Run a short cold and a warm query of each mode through the block engine on ``graph``,
    alone and as a block of four, and discard them: numba compiles (or loads) every kernel
    variant this graph's arrays need (their dtypes and read-only flags) before the graph
    takes traffic, not in its first queries. The noise comes from the OS like any query's
    and is never released."""
    from service.mechanisms.randomness import fresh_generator
    from service.privacy.curves import min_noise_free_steps

    for mode in Mode:
        steps = min_noise_free_steps(mode) + 2
        config = DiffusionConfig(
            mode=mode, beta=0.5, steps=steps, eta=1e-7, noise_scale=1.0, noisy_steps=1
        )
        cold = DiffusionJob(0, config, rng=fresh_generator())
        _run_block(graph, op, [cold])
        prefix = cold.future.result().prefix
        warm = DiffusionJob(0, config, rng=fresh_generator(), prefix=prefix, keep_prefix=False)
        _run_block(graph, op, [warm])
        warm.future.result()
        # a block of columns: the block kernels, not the lone pass, and with two columns of
        # one gamma a thread, their noise in one call (pair_sums_from_streams)
        block = [DiffusionJob(0, config, rng=fresh_generator()) for _ in range(4)]
        _run_block(graph, op, block)
        for job in block:
            job.future.result()


def run_jobs(graph: Graph, jobs: list[DiffusionJob]) -> None:
    """Run ``jobs`` together to the end in the caller's thread (their futures get results;
    an error is raised as it is)."""
    _run_block(graph, None, jobs)


def _run_block(graph: Graph, op: WalkOperator | None, jobs: list[DiffusionJob]) -> None:
    block = _Block(graph, op if op is not None else walk_operator(graph))
    block.admit(jobs)
    try:
        while len(block):
            block.step()
    except BaseException as exc:
        block.fail(exc)
        raise


class DiffusionEngine:
    """A thread that steps one block per graph; queries join at step boundaries.

    ``max_batch`` bounds the columns of a block (its memory is n x max_batch x 8 bytes; a step
    also uses the scaled block, the result and the noisy columns' noise, each as large, and
    two columns' draws, 2 x 16 n bytes); queries beyond it wait in the inbox for a column to
    free.
    """

    def __init__(self, max_batch: int = 64, *, window_seconds: float = 0.002) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch = max_batch
        self.window_seconds = window_seconds
        self._admitted_at = 0.0
        self._inbox: deque[tuple[Graph, DiffusionJob]] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._held = threading.local()  # per thread: jobs held by together(), or None
        self.steps = 0  # block steps run (for metrics and tests)
        self.columns = 0  # column-steps run
        self.max_width = 0  # widest block seen

    def submit(
        self,
        graph: Graph,
        seed: int,
        config: DiffusionConfig,
        *,
        rng: np.random.Generator,
        prefix: np.ndarray | None = None,
        keep_prefix: bool = True,
    ) -> Future[EngineResult]:
        job = DiffusionJob(seed, config, rng, prefix, keep_prefix)
        held = getattr(self._held, "jobs", None)
        if held is not None:  # inside together(): handed over with the others at its end
            held.append((graph, job))
        else:
            self._hand_over([(graph, job)])
        return job.future

    @contextmanager
    def together(self) -> Iterator[None]:
        """Queries this thread submits inside the block reach the engine together at its
        end, so that an idle engine starts them as one block instead of starting the first
        alone and taking the rest a batch window later."""
        if getattr(self._held, "jobs", None) is not None:  # nested: the outer block hands over
            yield
            return
        self._held.jobs = []
        try:
            yield
        finally:
            jobs, self._held.jobs = self._held.jobs, None
            if jobs:
                try:
                    self._hand_over(jobs)
                except BaseException as exc:  # closed: each caller hears it from its future
                    for _, job in jobs:
                        job.future.set_exception(EngineFailure(exc, noise_drawn=False))

    def _hand_over(self, jobs: list[tuple[Graph, DiffusionJob]]) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the diffusion engine is closed")
            self._inbox.extend(jobs)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="ppr-diffusion-engine", daemon=True
                )
                self._thread.start()
            self._cv.notify()

    def compute(
        self,
        graph: Graph,
        seed: int,
        config: DiffusionConfig,
        *,
        rng: np.random.Generator,
        prefix: np.ndarray | None = None,
        keep_prefix: bool = True,
    ) -> EngineResult:
        """Submit one query and wait for its result (blocking the calling thread)."""
        future = self.submit(graph, seed, config, rng=rng, prefix=prefix, keep_prefix=keep_prefix)
        return future.result()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)

    def stats(self) -> dict[str, int]:
        return {"steps": self.steps, "column_steps": self.columns, "max_width": self.max_width}

    def _take(self, blocks: dict[int, _Block]) -> None:
        """Move inbox jobs into their graph's block, up to ``max_batch`` columns each.

        An idle engine takes arrivals at once. A running one takes them at a step boundary at
        most every ``window_seconds``, so arrivals within a window join together (one copy of
        the block instead of one per arrival)."""
        arrivals: dict[int, list[DiffusionJob]] = {}
        with self._cv:
            while not self._inbox and not blocks and not self._closed:
                self._cv.wait()
            now = time.monotonic()
            if blocks and now - self._admitted_at < self.window_seconds:
                return
            if self._inbox:
                self._admitted_at = now
            pending: deque[tuple[Graph, DiffusionJob]] = deque()
            while self._inbox:
                graph, job = self._inbox.popleft()
                key = id(graph)
                block = blocks.get(key)
                if block is None:
                    block = blocks[key] = _Block(graph, walk_operator(graph))
                room = self.max_batch - len(block) - len(arrivals.get(key, []))
                if room > 0:
                    arrivals.setdefault(key, []).append(job)
                else:
                    pending.append((graph, job))
            self._inbox = pending
        for key, jobs in arrivals.items():
            try:
                blocks[key].admit(jobs)
            except BaseException as exc:  # pragma: no cover - defensive
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(EngineFailure(exc, noise_drawn=False))

    def _loop(self) -> None:
        blocks: dict[int, _Block] = {}
        while True:
            self._take(blocks)
            if self._closed:
                closed = RuntimeError("the diffusion engine was closed")
                for block in blocks.values():
                    block.fail(closed)
                with self._cv:
                    for _, job in self._inbox:
                        job.future.set_exception(EngineFailure(closed, noise_drawn=False))
                    self._inbox.clear()
                return
            for key, block in list(blocks.items()):
                if not len(block):
                    del blocks[key]
                    continue
                self.max_width = max(self.max_width, len(block))
                self.columns += len(block)
                self.steps += 1
                try:
                    block.step()
                except BaseException as exc:
                    log.exception("diffusion engine step failed")
                    block.fail(exc)
                if not len(block):
                    del blocks[key]
