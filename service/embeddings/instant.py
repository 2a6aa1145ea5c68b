"""InstantEmbedding (Epasto et al., Algorithm 4): hash a PPR vector p into k dimensions.

    z_v = max(ln(n p_v), 0)          (natural log: Theorem 5.1 needs ln(1 + x) <= x)
    w_j = sum over v with h_k(v) = j of h_sgn(v) z_v

Theorem 5.1: for non-negative p, p' the result moves by at most
m ln(1 + n ||p - p'||_1 / m) <= n ||p - p'||_1 in l1, m = |supp(p - p')|. So after PushFlowCap
(l1 sensitivity sigma) the embedding's l1 sensitivity is at most sigma n.
"""

from __future__ import annotations

import math

import numpy as np

from service.embeddings.hashing import EmbeddingHashes
from service.errors import InvalidParameter
from service.privacy.floating import UNIT_ROUNDOFF, gamma

__all__ = [
    "LOG_ERROR_ULPS",
    "entering",
    "instant_embedding",
    "instant_embedding_rounding_margin",
    "log_mass",
    "theorem_5_1_bound",
]

#: The error of numpy's float64 log assumed by :func:`instant_embedding_rounding_margin`, in
#: units in the last place of the result: numpy states at most 4 for its AVX-512 (SVML) log,
#: glibc's is below 1; tests/unit/embeddings/test_instant.py measures it.
LOG_ERROR_ULPS = 16


def entering(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(v, ln(n p_v)) for the nodes with n p_v > 1, in index order: the only nonzero z."""
    n = values.shape[0]
    big = np.flatnonzero(values * n > 1.0)
    return big, np.log(values[big] * n)


def log_mass(p: np.ndarray) -> np.ndarray:
    """z = max(ln(n p), 0) element-wise (0 where p <= 0), in float64."""
    values = np.asarray(p, dtype=np.float64)
    z = np.zeros(values.shape[0], dtype=np.float64)
    big, logs = entering(values)
    z[big] = logs
    return z


def instant_embedding(p: np.ndarray, hashes: EmbeddingHashes) -> np.ndarray:
    """w = H^T max(ln(n p), 0): the k-dimensional InstantEmbedding of a non-negative ``p``."""
    values = np.asarray(p, dtype=np.float64)
    if values.ndim != 1 or values.shape[0] != hashes.buckets.shape[0]:
        raise InvalidParameter(
            "p", f"expected a vector of {hashes.buckets.shape[0]} entries, got {values.shape}"
        )
    if np.any(values < 0) or not np.all(np.isfinite(values)):
        raise InvalidParameter("p", "must be finite and non-negative (clip released vectors)")
    # only the nodes with n p_v > 1 enter (in index order): the terms left out are +-0.0, and
    # a sum that starts at +0.0 never becomes -0.0, so adding them changes no bit
    big, z = entering(values)
    weights = hashes.signs[big] * z
    out: np.ndarray = np.bincount(hashes.buckets[big], weights=weights, minlength=hashes.k)
    return out


def theorem_5_1_bound(p: np.ndarray, q: np.ndarray) -> float:
    """m ln(1 + n ||p - q||_1 / m), m = |supp(p - q)|: Theorem 5.1's bound on ||w - w'||_1."""
    diff = np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64))
    m = int(np.count_nonzero(diff))
    if m == 0:
        return 0.0
    return float(m * np.log1p(diff.shape[0] * float(diff.sum()) / m))


def instant_embedding_rounding_margin(n: int) -> float:
    """e_w: a bound on ||w~ - IE(p)||_1, where w~ = :func:`instant_embedding` (p) as computed
    in float64 and IE(p) its exact value (real ln, exact sums), for any nonnegative p of n
    entries with ||p||_1 <= 2 and any k (docs/privacy.md, "PushFlowCap's float64 rounding"):

        e_w = n gamma_1 + (2 L u + gamma_n (1 + 2 L u)) (1 + u) 2 n / e,   L = LOG_ERROR_ULPS.

    Per node, y = fl(n p_v) moves ln(max(., 1)) by at most gamma_1 (at most n nodes); the log
    errs by at most L ulp(ln y) <= 2 L u ln y; each bucket is a float sum of its +-terms, within
    gamma_n of their absolute sum; and sum of ln y over the entering nodes is at most
    sum y / e <= (1 + u) 2 n / e (ln y <= y / e). Raised by 2^-30 for its own roundings."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    u = UNIT_ROUNDOFF
    log_error = 2.0 * LOG_ERROR_ULPS * u
    logs_total = (1.0 + u) * 2.0 * n / math.e
    margin = n * gamma(1) + (log_error + gamma(n) * (1.0 + log_error)) * logs_total
    return margin * (1.0 + 2.0**-30)
