"""The embedding comparison behind ``evaluate --task classification``.

Rows (each a matrix with one k-dimensional embedding per labelled node, then
:func:`service.evaluation.classification.classify`):

- ``random``: i.i.d. standard normal vectors (no graph information);
- ``instant_embedding``: non-private InstantEmbedding of uncapped push-flow PPR (the paper's
  "Non-DP InstantEmbedding");
- ``dp_ie_edge`` / ``dp_ie_personalized`` at each eps: DP-IE (PushFlowCap with the paper's
  thresholds, ln, Lap(sigma n / eps) on the k coordinates);
- ``free_noisy_diffusion`` at each eps: the free embedding of an `edge`-mode noisy diffusion
  release at that eps, as a replay stores it (top ``store_top`` entries, negatives clipped);
  the releases run as blocks of seeds on the ranking engine's block path
  (:func:`free_diffusion_embeddings`), each seed's exactly the release it gets alone;
- ``free_blended`` at each eps: the free embedding of a `blended` release (personalized only),
  scores clipped and normalized to sum 1.

Exposure column: what releasing every labelled node's embedding (training and test nodes - the
classifier sees both) costs the graph-wide exposure. `edge` rows: the n-fold composition of the
per-release curve, as (epsilon, delta) at ``delta`` and as pure epsilon; `personalized` rows
are joint-DP answers meant for their seed only, and pooling them is NOT covered by any
guarantee (spec-embeddings.md, "All-node releases"), so their exposure is "not covered".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    EMBEDDING_ROUNDS,
    dp_instant_embedding,
)
from service.embeddings.free import free_embedding, stored_top
from service.embeddings.hashing import EmbeddingHashes, embedding_hashes, new_salt
from service.embeddings.noise_free import DEFAULT_BLOCK, noise_free_embeddings
from service.evaluation.classification import (
    FractionScore,
    Labels,
    classify,
    default_jobs,
    split_scores,
    standardize,
)
from service.evaluation.options import ROWS
from service.graph.model import Graph
from service.mechanisms.blended import blended_ranking
from service.mechanisms.engine import DiffusionJob, run_jobs
from service.mechanisms.popular import noisy_degrees
from service.mechanisms.randomness import fresh_generator
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import DiffusionConfig, plan_diffusion
from service.privacy.laplace import DEGREE_SENSITIVITY, plan_laplace, plan_two_scale
from service.privacy.modes import Mode

__all__ = [
    "ROWS",
    "EmbeddingRow",
    "block_width",
    "capped_support",
    "estimate_seconds",
    "evaluate_embeddings",
    "free_diffusion_embeddings",
]

#: Thresholds that never bind: PushFlowCap is then the paper's plain PushFlow.
UNCAPPED_SIGMA = 1e12
#: Seeds per pass over the graph, at most: per seed, a block of 64 costs a fraction of one
#: seed alone (the diffusion engine's default width; docs/embeddings.md, "How fast").
MAX_BLOCK = 64
#: What the blocks' state may take in all: about five float64 values per node and seed (the
#: diffusion engine's block, scaled block, result, noise and copied columns; PushFlowCap's
#: five vectors per seed).
BLOCK_STATE_BYTES = 128 * 1024 * 1024


def block_width(n: int, threads: int = 1) -> int:
    """Seeds per pass over a graph of ``n`` nodes when ``threads`` blocks run at once: up to
    :data:`MAX_BLOCK`, their state within :data:`BLOCK_STATE_BYTES`, at least 1. A function
    of the public node count only; no output depends on it (every column of a block is bit
    for bit the seed computed alone)."""
    return max(1, min(MAX_BLOCK, BLOCK_STATE_BYTES // (40 * max(n, 1) * max(threads, 1))))


def _pushflowcap_block(n: int, threads: int) -> int:
    """PushFlowCap's block in the evaluation: :func:`block_width`, never below the default."""
    return max(DEFAULT_BLOCK, block_width(n, threads))


def free_diffusion_embeddings(
    graph: Graph,
    nodes: np.ndarray,
    config: DiffusionConfig,
    hashes: EmbeddingHashes,
    store_top: int,
    *,
    width: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    generator: Callable[[], np.random.Generator] = fresh_generator,
) -> tuple[np.ndarray, np.ndarray]:
    """The free embedding of one noisy-diffusion release per node of ``nodes`` (``config``,
    a calibrated plan's), of the full vector and of its stored top ``store_top`` entries:
    two matrices, one row per node in ``nodes`` order.

    The releases run ``width`` (default :func:`block_width`) seeds at a time through the
    ranking engine's block path (:func:`service.mechanisms.engine.run_jobs`: one
    sparse-times-dense product per step for the whole block), each seed a cold job with its
    own generator, freshly seeded from the OS entropy source (``generator``, called once per
    seed; only tests pass another, to compare releases for the same noise). Column j of a
    block is bit for bit the vector ``noisy_diffusion(graph, s_j, config, rng)`` returns for
    the same generator (tests/unit/mechanisms/test_engine.py,
    tests/test_classification_eval.py), so each release has the law of one query alone and
    its noise is independent of every other seed's: the same release, and the same charge,
    as one seed after the other. Only the two embeddings are kept."""
    count = int(nodes.shape[0])
    width = width if width is not None else block_width(graph.n)
    full = np.zeros((count, hashes.k), dtype=np.float64)
    top = np.zeros((count, hashes.k), dtype=np.float64)
    for start in range(0, count, width):
        part = nodes[start : start + width]
        jobs = [DiffusionJob(int(s), config, generator(), keep_prefix=False) for s in part]
        run_jobs(graph, jobs)
        for i, job in enumerate(jobs):
            x = job.future.result().scores
            full[start + i] = free_embedding(x, hashes)
            top[start + i] = free_embedding(stored_top(x, store_top), hashes)
        if progress is not None:
            progress(start + len(part), count)
    return full, top


@dataclass
class EmbeddingRow:
    """One row of the table: an embedding at one eps (None for eps-free rows)."""

    row: str
    epsilon: float | None
    sigma: float | None
    scores: list[FractionScore]
    exposure_epsilon: float | None  # graph-wide (eps, delta) of the labelled nodes' releases
    exposure_pure: float | None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "epsilon": self.epsilon,
            "sigma": self.sigma,
            "exposure_epsilon": self.exposure_epsilon,
            "exposure_pure_epsilon": self.exposure_pure,
            "note": self.note,
            "extra": self.extra,
            "fractions": [
                {
                    "fraction": s.fraction,
                    "micro_f1": s.micro,
                    "micro_f1_ci": list(s.micro_ci),
                    "macro_f1": s.macro,
                    "macro_f1_ci": list(s.macro_ci),
                    "splits": s.splits,
                }
                for s in self.scores
            ],
        }


def capped_support(graph: Graph, capped: np.ndarray, seed: int) -> int:
    """How many nodes other than the seed carry n p_v > 1, i.e. enter the embedding."""
    above = capped * graph.n > 1.0
    return int(above.sum() - (1 if above[seed] else 0))


def estimate_seconds(
    graph: Graph,
    labels: Labels,
    hashes: EmbeddingHashes,
    rows: Sequence[str],
    sigmas: Sequence[float],
    epsilons: Sequence[float],
    fractions: Sequence[float],
    splits: int,
    n_jobs: int | None,
    *,
    floors: Sequence[float] = (EMBEDDING_FLOOR,),
    beta: float,
    steps: int,
    eta: float,
    delta: float,
) -> tuple[float, float]:
    """The expected duration of :func:`evaluate_embeddings` with these arguments, from timing
    a sample after one untimed call of each path (compiling or loading its kernels): for each
    PushFlowCap pass (row, sigma, floor), one block of labelled nodes on each thread, as the
    rows run them; one block of
    noisy-diffusion releases with their free embeddings; two blended releases; two
    classifier fits at a training fraction of at most 0.5 (fit time taken as proportional
    to the training part), on random features and on features that separate the labels.
    A range: the fits of a row take longer the better its features separate the labels,
    which is what the evaluation measures. Releases nothing: the noise it draws is thrown
    away, and the estimate is printed before any row."""
    jobs = n_jobs or default_jobs()
    nodes = labels.nodes
    count = int(nodes.shape[0])
    sample = nodes[: min(16, count)]
    seconds = 0.0
    passes: list[tuple[float, Mode, float]] = []  # (sigma, mode, floor) of each PushFlowCap pass
    if "instant_embedding" in rows:
        passes.append((UNCAPPED_SIGMA, Mode.EDGE, 0.0))
    for mode in (Mode.EDGE, Mode.PERSONALIZED):
        if f"dp_ie_{mode.value}" in rows:
            passes.extend((sigma, mode, floor) for sigma in sigmas for floor in floors)
    block = _pushflowcap_block(graph.n, jobs)
    blocks = nodes[: min(count, block * jobs)]
    for sigma, mode, floor in passes:
        noise_free_embeddings(graph, hashes, nodes[:1], sigma, mode, beta=EMBEDDING_BETA,
                              rounds=1, floor=floor, threads=1)  # fmt: skip
        start = time.perf_counter()
        noise_free_embeddings(graph, hashes, blocks, sigma, mode, beta=EMBEDDING_BETA,
                              rounds=EMBEDDING_ROUNDS, floor=floor, block=block,
                              threads=jobs)  # fmt: skip
        seconds += count * (time.perf_counter() - start) / blocks.size
    if "free_noisy_diffusion" in rows:
        config = plan_diffusion(max(epsilons), delta, steps, beta, eta, Mode.EDGE).config
        free_diffusion_embeddings(graph, nodes[:1], config, hashes, store_top=1)
        block_nodes = nodes[: min(count, block_width(graph.n))]
        start = time.perf_counter()
        free_diffusion_embeddings(graph, block_nodes, config, hashes, store_top=1000)
        seconds += len(epsilons) * count * (time.perf_counter() - start) / block_nodes.size
    if "free_blended" in rows:
        degree_plan = plan_laplace(0.1, DEGREE_SENSITIVITY)
        degrees_released = noisy_degrees(graph, degree_plan, fresh_generator())
        per_node = _per_node(
            sample,
            lambda s: blended_ranking(graph, s, plan_two_scale(max(epsilons)), degrees_released,
                                      degree_plan.scale, fresh_generator(), Mode.PERSONALIZED),
        )  # fmt: skip
        seconds += len(epsilons) * count * per_node
    matrices = ("random" in rows) + ("instant_embedding" in rows) + len(epsilons) * (
        len(sigmas) * (("dp_ie_edge" in rows) + ("dp_ie_personalized" in rows))
        + ("free_noisy_diffusion" in rows) + ("free_blended" in rows)
    )  # fmt: skip
    if not matrices:
        return seconds, seconds
    local = np.random.default_rng(0)  # not the splits' generator
    probe = min(max(fractions), 0.5)
    train_size = min(max(round(probe * count), 1), count - 1)
    order = local.permutation(count)
    # features without signal, and features that separate the labels (a fit on them takes
    # longer: liblinear needs more iterations the better the classes separate)
    noise = local.standard_normal((count, hashes.k))
    separating = labels.matrix.astype(np.float64) @ local.standard_normal(
        (labels.matrix.shape[1], hashes.k)
    ) + 0.01 * local.standard_normal((count, hashes.k))

    def fit_seconds(features: np.ndarray) -> float:
        standardized = standardize(features)
        start = time.perf_counter()
        split_scores(standardized, labels.matrix, order[:train_size], order[train_size:])
        return time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=min(jobs, 2)) as pool:  # side by side, as fits run
        probes = list(pool.map(fit_seconds, (noise, separating)))
    parts = sum(min(max(round(f * count), 1), count - 1) for f in fractions)
    low, high = (
        seconds + matrices * splits * parts * (t / train_size) / min(jobs, len(fractions) * splits)
        for t in sorted(probes)
    )
    return low, high


def _per_node(sample: np.ndarray, run: Callable[[int], object]) -> float:
    """Seconds per node of ``run``: one untimed call (compiling, warming caches), then two."""
    run(int(sample[0]))
    timed = sample[1:3] if sample.size > 1 else sample[:1]
    start = time.perf_counter()
    for s in timed:
        run(int(s))
    return (time.perf_counter() - start) / timed.size


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _span(low: float, high: float) -> str:
    """``low`` to ``high`` in the larger one's unit ("3-5 min", "50 s to 2 min")."""
    if high >= 5400 and low >= 5400:
        return f"{low / 3600:.1f}-{high / 3600:.1f} h"
    if low >= 90 and high < 5400:
        return f"{low / 60:.0f}-{high / 60:.0f} min"
    return f"{_duration(low)} to {_duration(high)}"


def _counting(progress: Callable[[str], None], name: str) -> Callable[[int, int], None]:
    """A progress line about every tenth of the nodes."""
    shown = [0]

    def tick(done: int, total: int) -> None:
        if done == total or done * 10 >= (shown[0] + 1) * total:
            shown[0] = done * 10 // max(total, 1)
            progress(f"{name}: {done}/{total} nodes")

    return tick


def _exposure(curve: RdpCurve, count: int, delta: float) -> tuple[float, float]:
    total = curve * count
    return total.epsilon(delta), total.pure


def _dp_ie_rows(
    graph: Graph,
    nodes: np.ndarray,
    hashes: EmbeddingHashes,
    mode: Mode,
    sigma: float,
    epsilons: Sequence[float],
    delta: float,
    score: Callable[[np.ndarray], list[FractionScore]],
    progress: Callable[[str], None],
    threads: int | None = None,
    floor: float = EMBEDDING_FLOOR,
) -> list[EmbeddingRow]:
    name = f"dp_ie_{mode.value}"
    progress(f"{name}: PushFlowCap at sigma {sigma:g}, floor {floor:g}")
    supports = np.zeros(nodes.shape[0])

    def count(i: int, p: np.ndarray) -> None:
        supports[i] = capped_support(graph, p, int(nodes[i]))

    jobs = threads or default_jobs()
    embedded = noise_free_embeddings(
        graph, hashes, nodes, sigma, mode, beta=EMBEDDING_BETA, rounds=EMBEDDING_ROUNDS,
        floor=floor, block=_pushflowcap_block(graph.n, jobs), progress=_counting(progress, name),
        inspect=count, threads=jobs,
    )  # fmt: skip
    support = float(np.mean(supports))
    rows: list[EmbeddingRow] = []
    for eps in epsilons:
        progress(f"{name} sigma {sigma:g} eps {eps:g}")
        released = [
            dp_instant_embedding(graph, int(s), hashes, eps, sigma, mode, embedded=w, floor=floor)
            for w, s in zip(embedded, nodes, strict=True)
        ]
        features = np.array([r.values for r in released])
        plan = released[0].plan
        exposure: float | None = None
        pure: float | None = None
        note = "joint DP: pooling not covered"
        if mode is Mode.EDGE:
            exposure, pure = _exposure(plan.curve, int(nodes.shape[0]), delta)
            note = ""
        extra = {"mean_support": support, "noise_scale": plan.scale, "floor": floor}
        rows.append(EmbeddingRow(name, eps, sigma, score(features), exposure, pure, note, extra))
    return rows


def evaluate_embeddings(
    graph: Graph,
    labels: Labels,
    epsilons: Sequence[float],
    *,
    rows: Sequence[str] = ROWS,
    k: int = 256,
    sigmas: Sequence[float],
    floors: Sequence[float] = (EMBEDDING_FLOOR,),
    fractions: Sequence[float],
    splits: int,
    delta: float,
    store_top: int,
    beta: float = 0.8,
    steps: int = 100,
    eta: float = 1e-7,
    popular_epsilon: float = 0.1,
    rng: np.random.Generator | None = None,
    hashes: EmbeddingHashes | None = None,
    progress: Callable[[str], None] = lambda _text: None,
    n_jobs: int | None = None,
    estimate: bool = False,
) -> list[EmbeddingRow]:
    """Every requested row at every eps. ``rng`` draws the splits and the random row only;
    every privacy noise draw uses a fresh OS-entropy generator. ``n_jobs``: threads for the
    PushFlowCap blocks and the classifier fits (default: every core). ``estimate``: first
    time a sample and report the expected duration through ``progress``."""
    rng = rng if rng is not None else np.random.default_rng()
    hashes = hashes if hashes is not None else embedding_hashes(graph.node_ids, new_salt(), k)
    nodes = labels.nodes
    count = int(nodes.shape[0])
    out: list[EmbeddingRow] = []
    if estimate:
        low, high = estimate_seconds(
            graph, labels, hashes, rows, sigmas, epsilons, fractions, splits, n_jobs,
            floors=floors, beta=beta, steps=steps, eta=eta, delta=delta,
        )  # fmt: skip
        span = _duration(low) if _duration(low) == _duration(high) else _span(low, high)
        progress(
            f"expected time: about {span} ({len(fractions)} fraction(s) x {splits} split(s), "
            f"{n_jobs or default_jobs()} thread(s); timed on a sample, the longer if the "
            "embeddings separate the labels well)"
        )

    def score(features: np.ndarray) -> list[FractionScore]:
        return classify(features, labels, fractions, splits, rng, n_jobs=n_jobs)

    if "random" in rows:
        progress("random")
        out.append(
            EmbeddingRow("random", None, None, score(rng.standard_normal((count, k))), 0.0, 0.0)
        )
    if "instant_embedding" in rows:
        progress("instant_embedding (non-private)")
        jobs = n_jobs or default_jobs()
        features = noise_free_embeddings(
            graph, hashes, nodes, UNCAPPED_SIGMA, Mode.EDGE, beta=EMBEDDING_BETA,
            rounds=EMBEDDING_ROUNDS, floor=0.0, block=_pushflowcap_block(graph.n, jobs),
            progress=_counting(progress, "instant_embedding"), threads=jobs,
        )  # fmt: skip
        out.append(EmbeddingRow("instant_embedding", None, None, score(features), None, None,
                                "not private"))  # fmt: skip
    for mode in (Mode.EDGE, Mode.PERSONALIZED):
        name = f"dp_ie_{mode.value}"
        if name not in rows:
            continue
        for sigma in sigmas:
            for floor in floors:
                rows_of = _dp_ie_rows(
                    graph, nodes, hashes, mode, sigma, epsilons, delta, score, progress,
                    n_jobs, floor,
                )  # fmt: skip
                out.extend(rows_of)
    if "free_noisy_diffusion" in rows:
        for eps in epsilons:
            progress(f"free_noisy_diffusion eps {eps:g}")
            plan = plan_diffusion(eps, delta, steps, beta, eta, Mode.EDGE)
            config = plan.config
            full_m, top_m = free_diffusion_embeddings(
                graph, nodes, config, hashes, store_top,
                progress=_counting(progress, "free_noisy_diffusion"),
            )  # fmt: skip
            change = float(
                np.mean(np.abs(full_m - top_m).sum(axis=1))
                / max(float(np.mean(np.abs(full_m).sum(axis=1))), 1e-300)
            )
            exposure, pure = _exposure(plan.curve, count, delta)
            out.append(EmbeddingRow("free_noisy_diffusion", eps, None, score(top_m), exposure,
                                    pure, f"replay of top {store_top}",
                                    {"top_vs_full_l1_relative": change}))  # fmt: skip
    if "free_blended" in rows:
        degree_plan = plan_laplace(popular_epsilon, DEGREE_SENSITIVITY)
        degrees_released = noisy_degrees(graph, degree_plan, fresh_generator())
        for eps in epsilons:
            progress(f"free_blended eps {eps:g}")
            two_scale = plan_two_scale(eps)
            features = np.array([
                free_embedding(
                    stored_top(
                        blended_ranking(graph, int(s), two_scale, degrees_released,
                                        degree_plan.scale, fresh_generator(),
                                        Mode.PERSONALIZED).scores,
                        store_top,
                    ),
                    hashes,
                    normalize=True,
                )
                for s in nodes
            ])  # fmt: skip
            note = f"joint DP: pooling not covered; replay of top {store_top}"
            out.append(EmbeddingRow("free_blended", eps, None, score(features), None, None, note))
    return out
