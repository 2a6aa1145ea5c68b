"""PrivDPR (Zhang et al., KDD 2025) as spec-synthetic-graph.md specifies it, with its corrections.

NODE-level (eps, delta)-DP, bounded relation (N public). The accounting is in
:mod:`service.privacy.synthetic`; this module is the algorithm, in numpy:

1. Model: embeddings V (N x r); an MLP of L+1 sigmoid layers whose weights are normalised by
   their EXACT spectral norm (an SVD, never power iteration) to ||Wt_l||_2 = 1/s; f(v) in (0, 1).
2. Per-pair loss (Eq. 5) on (start node, visited node) pairs of R_wn walks of length R_wl from
   b start nodes per batch (the spec's [code] reading): at most B_max = b R_wn R_wl pairs.
3. T = epochs * floor(N / b) steps, fixed in advance (no early stopping). Each step: W takes a
   noise-free Adam step; the batch sum of the V-gradients is released (:func:`noisy_sum`):
   quantized to integers in units of the plan's quantum, kept in its l2 ball, plus EXACT
   discrete Gaussian noise (:mod:`service.mechanisms.discrete_gaussian`, raw random words
   only) on EVERY coordinate of the N x r matrix (zero rows included), of std z * Delta_2 (1 +
   2^-10) in the gradient's units; V takes an Adam step on the released sum / B_max.
4. Scores: at ``score_rounds`` evenly spaced steps (the spec allows sampling S every k steps:
   post-processing, free) every node i draws j ~ softmax_j(v_i . v_j) by Gumbel-max over row
   blocks of V V^T, and S[i, j] += 1.
5. Graph (App. A): S_sym = max(S, S^T) with a zero diagonal; every node first gets one edge
   drawn from its row of S_sym; then pairs are drawn without replacement proportionally to
   S_sym until E* = |{i < j : S_sym[i, j] > 0}| edges (a function of S only; never the true |E|).

Nothing computed from the noise-free W (loss values, W itself) leaves this module: the only
outputs are the synthetic edges, a function of the noised V and fresh randomness. The release
draws (the discrete Gaussian) come from the ``noise`` generator alone; the rest of the run's
randomness (initialisation, batch order, walks, score sampling, the graph) from ``rng``: it is
chosen without the data or is post-processing, and the bound on the released sums holds for
every value of it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from service.errors import InvalidParameter
from service.mechanisms.discrete_gaussian import discrete_gaussian
from service.privacy.synthetic import PrivdprPlan, privdpr_plan

Progress = Callable[[int, int], None]

_ADAM_BETA1 = 0.9
_ADAM_BETA2 = 0.999
_ADAM_EPS = 1e-8
_SCORE_BLOCK = 256


@dataclass(frozen=True)
class PrivdprParams:
    """The paper's defaults (spec, "Defaults"); ``score_rounds`` is ours (cost, see above)."""

    embedding_dim: int = 128
    hidden_dim: int = 64
    s: float = 8.0
    s_grad: float = 5.0
    gamma: float = 0.85
    start_nodes: int = 16
    walks: int = 2
    walk_length: int = 16
    epochs: int = 5
    learning_rate: float = 1e-3
    score_rounds: int = 5
    delta: float = 1e-5

    def validate(self) -> None:
        checks = (
            ("embedding_dim", 1 <= self.embedding_dim <= 1024),
            ("hidden_dim", 1 <= self.hidden_dim <= 1024),
            ("s", 1.0 < self.s <= 1e3),
            ("s_grad", 0.0 < self.s_grad <= 1e6),
            ("gamma", 0.0 < self.gamma < 1.0),
            ("start_nodes", 1 <= self.start_nodes <= 4096),
            ("walks", 1 <= self.walks <= 64),
            ("walk_length", 1 <= self.walk_length <= 256),
            ("epochs", 1 <= self.epochs <= 100),
            ("learning_rate", 0.0 < self.learning_rate <= 1.0),
            ("score_rounds", 1 <= self.score_rounds <= 10_000),
            ("delta", 0.0 < self.delta < 1.0),
        )
        for name, ok in checks:
            if not ok:
                raise InvalidParameter(name, f"PrivDPR parameter {name} is out of range")

    def plan(self, nodes: int, epsilon: float) -> PrivdprPlan:
        self.validate()
        if nodes < self.start_nodes:
            raise InvalidParameter(
                "start_nodes", f"the graph has {nodes} nodes, fewer than a batch's start nodes"
            )
        return privdpr_plan(
            nodes=nodes,
            epsilon=epsilon,
            delta=self.delta,
            gamma=self.gamma,
            s=self.s,
            s_grad=self.s_grad,
            start_nodes=self.start_nodes,
            walks=self.walks,
            walk_length=self.walk_length,
            epochs=self.epochs,
            embedding_dim=self.embedding_dim,
        )


# --- the model -----------------------------------------------------------------------------


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))
    return out


def normalise(weight: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Wt = W / (s ||W||_2) with the exact spectral norm; also the top singular pair and norm
    (for the gradient through the normalisation)."""
    u, sv, vt = np.linalg.svd(weight, full_matrices=False)
    norm = float(sv[0])
    return weight / (s * norm), u[:, 0], vt[0], norm


@dataclass
class Mlp:
    """f(v) = a_(L+1), a_l = sigmoid(a_(l-1) Wt_l + c_l), L + 1 weight matrices."""

    weights: list[np.ndarray]
    biases: list[np.ndarray]
    s: float

    @classmethod
    def xavier(cls, rng: np.random.Generator, dims: list[int], s: float) -> Mlp:
        weights = [
            rng.normal(0.0, np.sqrt(2.0 / (a + b)), (a, b)) for a, b in itertools.pairwise(dims)
        ]
        biases = [rng.normal(0.0, np.sqrt(2.0 / (1 + b)), b) for b in dims[1:]]
        return cls(weights, biases, s)

    def normalised(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]:
        return [normalise(w, self.s) for w in self.weights]

    def forward(
        self, x: np.ndarray, norm: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]
    ) -> list[np.ndarray]:
        acts = [x]
        for (wt, _, _, _), c in zip(norm, self.biases, strict=True):
            acts.append(sigmoid(acts[-1] @ wt + c))
        return acts

    def backward(
        self,
        acts: list[np.ndarray],
        grad_f: np.ndarray,
        norm: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]],
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Gradients with respect to the input rows, the raw weights W_l and the biases."""
        grad_a = grad_f[:, None]
        grad_w: list[np.ndarray] = []
        grad_c: list[np.ndarray] = []
        for layer in range(len(self.weights) - 1, -1, -1):
            out = acts[layer + 1]
            grad_z = grad_a * out * (1.0 - out)
            wt, u, v, sigma = norm[layer]
            grad_wt = acts[layer].T @ grad_z
            # Wt = W / (s sigma(W)), d sigma / dW = u v^T
            inner = float(np.sum(grad_wt * self.weights[layer]))
            grad_w.append(grad_wt / (self.s * sigma) - inner / (self.s * sigma**2) * np.outer(u, v))
            grad_c.append(grad_z.sum(axis=0))
            grad_a = grad_z @ wt.T
        grad_w.reverse()
        grad_c.reverse()
        return grad_a, grad_w, grad_c


def pair_loss_grad(
    f_i: np.ndarray, f_j: np.ndarray, d_i: np.ndarray, d_j: np.ndarray, gamma: float, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """d loss / d f_i and d loss / d f_j of Eq. 5 for each pair (d^in = d^out = d here)."""
    a = f_i / d_i
    c = f_j / (d_j * gamma)
    grad_diff = 2.0 * d_j * gamma**2 * (a - c) + 2.0 * gamma * (1.0 - gamma) / n
    return grad_diff / d_i, -grad_diff / (d_j * gamma)


class _Adam:
    def __init__(self, shape: tuple[int, ...], lr: float) -> None:
        self.m = np.zeros(shape)
        self.v = np.zeros(shape)
        self.t = 0
        self.lr = lr

    def step(self, param: np.ndarray, grad: np.ndarray) -> None:
        self.t += 1
        self.m *= _ADAM_BETA1
        self.m += (1.0 - _ADAM_BETA1) * grad
        self.v *= _ADAM_BETA2
        self.v += (1.0 - _ADAM_BETA2) * grad * grad
        m_hat = self.m / (1.0 - _ADAM_BETA1**self.t)
        v_hat = self.v / (1.0 - _ADAM_BETA2**self.t)
        param -= self.lr * m_hat / (np.sqrt(v_hat) + _ADAM_EPS)


# --- batches -------------------------------------------------------------------------------


def walk_pairs(
    indptr: np.ndarray,
    indices: np.ndarray,
    starts: np.ndarray,
    walks: int,
    length: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """(start, visited) pairs of ``walks`` uniform walks of ``length`` steps from each start;
    a walk stops at a node without neighbours. At most len(starts) * walks * length pairs."""
    origin = np.repeat(starts, walks)
    current = origin.copy()
    alive = np.ones(origin.size, dtype=bool)
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    degrees = np.diff(indptr)
    for _ in range(length):
        deg = degrees[current]
        alive &= deg > 0
        if not alive.any():
            break
        offset = np.floor(rng.random(current.size) * np.maximum(deg, 1)).astype(np.int64)
        step = (
            indices[np.minimum(indptr[current] + offset, indices.size - 1)]
            if indices.size
            else current
        )
        current = np.where(alive, step, current)
        left.append(origin[alive])
        right.append(current[alive])
    if not left:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(left).astype(np.int64), np.concatenate(right).astype(np.int64)


def batch_gradient(
    mlp: Mlp,
    embeddings: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray],
    degrees: np.ndarray,
    gamma: float,
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Sum over the pairs of grad_V loss (an N x r matrix, all rows) and of grad_W, grad_c."""
    n, r = embeddings.shape
    total = np.zeros((n, r))
    left, right = pairs
    if left.size == 0:
        return (
            total,
            [np.zeros_like(w) for w in mlp.weights],
            [np.zeros_like(c) for c in mlp.biases],
        )
    nodes, inverse = np.unique(np.concatenate([left, right]), return_inverse=True)
    norm = mlp.normalised()
    acts = mlp.forward(embeddings[nodes], norm)
    f = acts[-1][:, 0]
    li, ri = inverse[: left.size], inverse[left.size :]
    d = degrees.astype(np.float64)
    g_i, g_j = pair_loss_grad(f[li], f[ri], d[left], d[right], gamma, n)
    grad_f = np.bincount(li, g_i, nodes.size) + np.bincount(ri, g_j, nodes.size)
    grad_rows, grad_w, grad_c = mlp.backward(acts, grad_f, norm)
    total[nodes] = grad_rows
    return total, grad_w, grad_c


# --- scores and the graph ------------------------------------------------------------------


def sample_scores(embeddings: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For every node i, one j ~ softmax_j(v_i . v_j) (Gumbel-max over row blocks)."""
    n = embeddings.shape[0]
    out = np.empty(n, dtype=np.int64)
    for start in range(0, n, _SCORE_BLOCK):
        logits = embeddings[start : start + _SCORE_BLOCK] @ embeddings.T
        logits += rng.gumbel(size=logits.shape)
        out[start : start + _SCORE_BLOCK] = np.argmax(logits, axis=1)
    return out


def graph_from_scores(
    scores: sp.csr_matrix, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """App. A: S_sym = max(S, S^T), zero diagonal; one edge per node drawn from its row; then
    pairs without replacement proportionally to S_sym up to E* = pairs with S_sym > 0."""
    n = scores.shape[0]
    both = sp.csr_matrix(scores.maximum(scores.T)).tocoo()
    off = both.row != both.col
    sym = sp.csr_matrix((both.data[off], (both.row[off], both.col[off])), shape=(n, n))
    upper = sp.triu(sym, k=1).tocoo()
    target = int(upper.nnz)  # E*: a function of S only
    chosen: set[tuple[int, int]] = set()
    for i in range(n):
        row = slice(sym.indptr[i], sym.indptr[i + 1])
        cols, weights = sym.indices[row], sym.data[row].astype(np.float64)
        keys = np.log(weights) + rng.gumbel(size=weights.size)
        for pos in np.argsort(-keys):  # redraw while the pair was drawn already
            pair = (min(i, int(cols[pos])), max(i, int(cols[pos])))
            if pair not in chosen:
                chosen.add(pair)
                break
    if len(chosen) < target:
        keys = np.log(upper.data.astype(np.float64)) + rng.gumbel(size=upper.nnz)
        for pos in np.argsort(-keys):
            if len(chosen) >= target:
                break
            chosen.add((int(upper.row[pos]), int(upper.col[pos])))
    if not chosen:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    edges = np.array(sorted(chosen), dtype=np.int64)
    return edges[:, 0], edges[:, 1]


# --- the release of one step --------------------------------------------------------------


def _within(q: np.ndarray, radius_squared: int) -> bool:
    """sum(q^2) <= radius_squared, decided exactly: by the float64 sum when its error bound
    decides (entries below 2^53 convert exactly; the sum of d nonnegative terms is within a
    relative (d + 1) 2^-53 / (1 - (d + 1) 2^-53) of the exact one), else in integers."""
    flat = q.ravel()
    values = flat.astype(np.float64)
    approx = float(np.dot(values, values))
    slack = 4.0 * (flat.size + 2) * 2.0**-53
    if approx * (1.0 + slack) < float(radius_squared) * (1.0 - 2.0**-50):
        return True
    return sum(int(x) * int(x) for x in flat.tolist()) <= radius_squared


def quantized_sum(total: np.ndarray, plan: PrivdprPlan) -> np.ndarray:
    """q = round(total / quantum), nearest integer per coordinate, as int64; replaced by 0 if
    its exact norm passes sqrt(radius_squared) (never: the bound on the sum keeps it inside,
    but the privacy proof does not rely on that: every q released is in the ball)."""
    scaled = np.asarray(total, dtype=np.float64) / plan.quantum
    limit = math.isqrt(plan.radius_squared)
    if np.all(np.isfinite(scaled)) and np.all(np.abs(scaled) < limit + 0.5):
        rounded = np.rint(scaled).astype(np.int64)
        if _within(rounded, plan.radius_squared):
            return rounded
    return np.zeros(scaled.shape, dtype=np.int64)


#: |noise| at or above this would let q + noise leave int64 (|q| < 2^61 by the plan).
_NOISE_LIMIT = 2**62


def noisy_sum(total: np.ndarray, plan: PrivdprPlan, noise: np.random.Generator) -> np.ndarray:
    """One step's release, in ``total``'s units: :func:`quantized_sum` q plus the exact discrete
    Gaussian Z ~ N_Z(0, noise_m 2^noise_tau) on every coordinate, the integer q + Z (exact in
    int64), then times quantum (post-processing of q + Z). ``noise`` is read through its raw
    words only. A draw |Z| >= 2^62 (probability below e^-500000 at the plan's scale of about
    2^52) raises OverflowError rather than release a value off the law."""
    q = quantized_sum(total, plan)
    drawn = discrete_gaussian(noise, plan.noise_m, plan.noise_tau, int(q.size)).reshape(q.shape)
    if drawn.size and int(np.max(np.abs(drawn))) >= _NOISE_LIMIT:
        raise OverflowError("a discrete Gaussian draw left the range of the released sum")
    released: np.ndarray = (q + drawn).astype(np.float64) * plan.quantum
    return released


# --- the whole run -------------------------------------------------------------------------


def privdpr_synthesize(
    indptr: np.ndarray,
    indices: np.ndarray,
    epsilon: float,
    params: PrivdprParams,
    rng: np.random.Generator,
    progress: Progress | None = None,
    *,
    noise: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, PrivdprPlan]:
    """A synthetic graph on the same N nodes (internal indices ``u < v``) and the plan used.
    ``noise`` draws the releases (the exact discrete Gaussian; default ``rng``), ``rng`` the
    rest."""
    noise = rng if noise is None else noise
    n = int(indptr.size - 1)
    plan = params.plan(n, epsilon)
    degrees = np.diff(indptr)
    dims = [params.embedding_dim] + [params.hidden_dim] * plan.depth + [1]
    mlp = Mlp.xavier(rng, dims, params.s)
    embeddings = rng.normal(
        0.0, np.sqrt(2.0 / (n + params.embedding_dim)), (n, params.embedding_dim)
    )
    adam_v = _Adam(embeddings.shape, params.learning_rate)
    adam_w = [_Adam(w.shape, params.learning_rate) for w in mlp.weights]
    adam_c = [_Adam(c.shape, params.learning_rate) for c in mlp.biases]
    order = rng.permutation(n)
    per_epoch = n // params.start_nodes
    score_at = set(
        np.linspace(plan.steps / params.score_rounds, plan.steps, params.score_rounds)
        .round()
        .astype(int)
        .tolist()
    )
    sampled: list[np.ndarray] = []
    step = 0
    for _ in range(params.epochs):
        for j in range(per_epoch):
            step += 1
            starts = order[j * params.start_nodes : (j + 1) * params.start_nodes]
            pairs = walk_pairs(indptr, indices, starts, params.walks, params.walk_length, rng)
            grad_v, grad_w, grad_c = batch_gradient(mlp, embeddings, pairs, degrees, params.gamma)
            for k in range(len(mlp.weights)):  # noise-free W: never leaves this function
                adam_w[k].step(mlp.weights[k], grad_w[k] / plan.max_pairs)
                adam_c[k].step(mlp.biases[k], grad_c[k] / plan.max_pairs)
            released = noisy_sum(grad_v, plan, noise)  # every row
            adam_v.step(embeddings, released / plan.max_pairs)
            if step in score_at:
                sampled.append(sample_scores(embeddings, rng))
            if progress is not None:
                progress(step, plan.steps)
    rows = np.tile(np.arange(n), len(sampled))
    cols = np.concatenate(sampled)
    scores = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    u, v = graph_from_scores(scores, rng)
    return u, v, plan
