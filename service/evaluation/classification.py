"""Node classification on embeddings, as DeepWalk and the DP-IE paper do it (Section 6.2).

A labels file has one ``node label`` pair per line (whitespace-separated; a node may appear on
several lines: multi-label). For each training fraction and each of ``splits`` random splits of
the labelled nodes, a one-vs-rest L2 logistic regression (scikit-learn's liblinear; features
standardized once, on all labelled nodes: the test nodes' embeddings are released too, and no
label is used) is trained on the training nodes' embeddings; each test node is given as
many labels as it truly has, the top-scored ones (the DeepWalk protocol); Micro- and Macro-F1
are averaged over splits with 95% t-intervals. Labels are not protected: edge-level DP covers
edges only.

The fits run on ``n_jobs`` threads (default: every core the process may use), each split on
its own thread: liblinear's primal solver is deterministic and releases the GIL, so the scores
are those of fitting one split after the other.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.errors import ServiceError
from service.evaluation.metrics import mean_ci
from service.evaluation.options import DEFAULT_FRACTIONS, DEFAULT_SPLITS
from service.graph.model import Graph

__all__ = [
    "DEFAULT_FRACTIONS",
    "DEFAULT_SPLITS",
    "FractionScore",
    "Labels",
    "classify",
    "default_jobs",
    "load_labels",
    "parse_labels",
    "standardize",
]

_SHOWN_UNKNOWN = 5


class InvalidLabels(ServiceError):
    """A node-labels file that cannot be used: unreadable, malformed, unknown nodes, one class
    (an error of the evaluation command: exit 2, never answered over HTTP)."""

    code = "invalid_labels"
    status = 422


@dataclass(frozen=True)
class Labels:
    """The labelled nodes (internal indices), the class names, and the 0/1 label matrix."""

    nodes: np.ndarray
    classes: list[str]
    matrix: np.ndarray  # (len(nodes), len(classes)), bool

    @property
    def multi_label(self) -> bool:
        return bool((self.matrix.sum(axis=1) > 1).any())


def parse_labels(lines: Iterable[str], graph: Graph, source: str = "labels") -> Labels:
    """Parse ``node label`` lines (blank lines and ``#`` comments skipped) against ``graph``."""
    pairs: dict[int, set[str]] = {}
    unknown: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise InvalidLabels(f"{source} line {number}: expected 'node label', got {line[:80]!r}")
        node, label = fields
        index = graph.ids.index(node)
        if index is None:
            unknown.append(node)
            continue
        pairs.setdefault(index, set()).add(label)
    if unknown:
        shown = ", ".join(unknown[:_SHOWN_UNKNOWN])
        more = f" and {len(unknown) - _SHOWN_UNKNOWN} more" if len(unknown) > _SHOWN_UNKNOWN else ""
        raise InvalidLabels(
            f"{source}: {len(unknown)} line(s) name nodes not in the graph ({shown}{more}); "
            "label nodes of this graph only"
        )
    classes = sorted({label for labels in pairs.values() for label in labels})
    if len(classes) < 2:
        raise InvalidLabels(
            f"{source}: {len(classes)} class(es) found; classification needs at least 2"
        )
    nodes = np.array(sorted(pairs), dtype=np.int64)
    column = {label: j for j, label in enumerate(classes)}
    matrix = np.zeros((nodes.shape[0], len(classes)), dtype=bool)
    for row, node in enumerate(nodes):
        for label in pairs[int(node)]:
            matrix[row, column[label]] = True
    return Labels(nodes, classes, matrix)


def load_labels(path: str | Path, graph: Graph) -> Labels:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidLabels(f"cannot read labels file {str(path)!r}: {exc}") from exc
    return parse_labels(text.splitlines(), graph, source=str(path))


@dataclass(frozen=True)
class FractionScore:
    """Micro- and Macro-F1 at one training fraction: means and 95% t-intervals over splits."""

    fraction: float
    micro: float
    micro_ci: tuple[float, float]
    macro: float
    macro_ci: tuple[float, float]
    splits: int


def _top_labels(scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each row's ``counts[i]`` top-scored labels as a 0/1 matrix (DeepWalk's protocol)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    predicted = np.zeros(scores.shape, dtype=bool)
    for i, count in enumerate(counts):
        predicted[i, order[i, :count]] = True
    return predicted


def split_scores(
    standardized: np.ndarray, matrix: np.ndarray, train: np.ndarray, test: np.ndarray
) -> tuple[float, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.multiclass import OneVsRestClassifier

    model = OneVsRestClassifier(LogisticRegression(solver="liblinear", C=1.0))
    with warnings.catch_warnings():
        # a class absent from a small training part is predicted by a constant: intended
        warnings.simplefilter("ignore")
        model.fit(standardized[train], matrix[train].astype(np.int64))
        scores = model.decision_function(standardized[test])
    scores = np.asarray(scores, dtype=np.float64).reshape(test.shape[0], matrix.shape[1])
    predicted = _top_labels(scores, matrix[test].sum(axis=1))
    truth = matrix[test]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # classes absent from a test part score 0 in macro
        micro = float(f1_score(truth, predicted, average="micro", zero_division=0))
        macro = float(f1_score(truth, predicted, average="macro", zero_division=0))
    return micro, macro


def standardize(features: np.ndarray) -> np.ndarray:
    """Each column to mean 0 and variance 1 over the rows (constant columns to 0)."""
    from sklearn.preprocessing import StandardScaler

    out: np.ndarray = StandardScaler().fit_transform(np.asarray(features, dtype=np.float64))
    return out


def classify(
    features: np.ndarray,
    labels: Labels,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    splits: int = DEFAULT_SPLITS,
    rng: np.random.Generator | None = None,
    n_jobs: int | None = None,
) -> list[FractionScore]:
    """Micro/Macro-F1 of one-vs-rest logistic regression on ``features`` (one row per
    labelled node, in ``labels.nodes`` order) for each training fraction. ``rng`` draws the
    splits only (never any privacy noise), all of them before any fit, in the order of one
    fit after the other; ``n_jobs`` threads fit them."""
    rng = rng if rng is not None else np.random.default_rng()
    count = labels.nodes.shape[0]
    if features.shape[0] != count:
        raise ValueError(f"expected {count} feature rows, got {features.shape[0]}")
    standardized = standardize(features)
    tasks: list[tuple[float, np.ndarray, np.ndarray]] = []
    for fraction in fractions:
        train_size = min(max(round(fraction * count), 1), count - 1)
        for _ in range(splits):
            order = rng.permutation(count)
            tasks.append((fraction, order[:train_size], order[train_size:]))
    jobs = default_jobs() if n_jobs is None else max(1, n_jobs)
    # the largest training parts first: they take longest
    by_size = sorted(range(len(tasks)), key=lambda i: -tasks[i][1].shape[0])
    results: dict[int, tuple[float, float]] = {}
    if jobs == 1:
        for i in by_size:
            results[i] = split_scores(standardized, labels.matrix, tasks[i][1], tasks[i][2])
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {
                i: pool.submit(split_scores, standardized, labels.matrix, tasks[i][1], tasks[i][2])
                for i in by_size
            }
            results = {i: future.result() for i, future in futures.items()}
    out: list[FractionScore] = []
    for f_index, fraction in enumerate(fractions):
        scored = [results[f_index * splits + j] for j in range(splits)]
        micro_mean, micro_ci = mean_ci([s[0] for s in scored])
        macro_mean, macro_ci = mean_ci([s[1] for s in scored])
        out.append(FractionScore(fraction, micro_mean, micro_ci, macro_mean, macro_ci, splits))
    return out


def default_jobs() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - not Linux
