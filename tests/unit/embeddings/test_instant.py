"""InstantEmbedding's float64 rounding margin e_w, and the log accuracy it assumes.

:func:`instant_embedding_rounding_margin` bounds ||w~ - IE(p)||_1 for the computed w~ (numpy's
log, a float64 product n p, bincount's sums) against the exact value (real ln, exact sums),
for any nonnegative p with ||p||_1 <= 2 (docs/privacy.md, "PushFlowCap's float64 rounding").
Here the exact value is taken with mpmath at 256 bits (each of its logs and sums within
2^-250 relative, far below the figures compared) and the entering set decided exactly
(Fraction(p_v) n > 1); the vectors include entries at 1/n, one float either side of it, and
vectors whose mass is 2.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np

from service.embeddings.hashing import embedding_hashes
from service.embeddings.instant import (
    LOG_ERROR_ULPS,
    instant_embedding,
    instant_embedding_rounding_margin,
)
from service.privacy.floating import UNIT_ROUNDOFF, gamma


def exact_embedding(p: np.ndarray, buckets: np.ndarray, signs: np.ndarray, k: int) -> list[float]:
    n = p.shape[0]
    with mpmath.workprec(256):
        out = [mpmath.mpf(0)] * k
        for v, value in enumerate(p.tolist()):
            if Fraction(value) * n > 1:
                out[int(buckets[v])] += int(signs[v]) * mpmath.log(mpmath.mpf(value) * n)
        return out


def l1_error(computed: np.ndarray, exact: list[float]) -> float:
    with mpmath.workprec(256):
        total = sum((abs(mpmath.mpf(float(x)) - y) for x, y in zip(computed, exact, strict=True)))
        return float(total) * (1 + 2**-50)


def _vectors(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    spread = rng.dirichlet(np.full(n, 0.3))  # mass 1, many entries above 1/n
    at_threshold = np.full(n, 1.0 / n)
    at_threshold[::3] = np.nextafter(1.0 / n, 1.0)
    at_threshold[1::3] = np.nextafter(1.0 / n, 0.0)
    heavy = 2.0 * rng.dirichlet(np.full(n, 5.0))  # mass 2: the largest the margin allows
    few = np.zeros(n)
    few[rng.choice(n, 5, replace=False)] = rng.uniform(1.0 / n, 0.3, 5)
    return [spread, at_threshold, heavy, few]


def test_computed_embedding_within_margin() -> None:
    rng = np.random.default_rng(5)
    worst = 0.0
    for n in (7, 200, 3000):
        margin = instant_embedding_rounding_margin(n)
        for k in (1, 4, 64):
            hashes = embedding_hashes([str(i) for i in range(n)], b"rounding-salt", k)
            for p in _vectors(n, rng):
                computed = instant_embedding(p, hashes)
                exact = exact_embedding(p, hashes.buckets, hashes.signs, k)
                measured = l1_error(computed, exact)
                assert measured <= margin, (n, k, measured, margin)
                worst = max(worst, measured / margin)
    print(f"InstantEmbedding: worst measured / e_w = {worst:.3g}")
    assert 0 < worst < 0.1


def test_log_within_the_assumed_ulps() -> None:
    """numpy's float64 log on the arguments InstantEmbedding passes it (fl(n p) in (1, 2n]):
    just above 1, and log-uniform up to 2^41; within LOG_ERROR_ULPS ulps of the real ln (it
    measures at most 4 here, numpy's stated bound for its AVX-512 log)."""
    rng = np.random.default_rng(9)
    near_one = 1.0 + rng.integers(1, 2**20, 4000) * 2.0**-52
    wide = np.exp2(rng.uniform(0.0, 41.0, 20000))
    x = np.concatenate([near_one, wide, [np.nextafter(1.0, 2.0), 2.0, math.e, 1e6]])
    logs = np.log(x)
    worst = 0.0
    with mpmath.workprec(200):
        for value, computed in zip(x.tolist(), logs.tolist(), strict=True):
            exact = mpmath.log(mpmath.mpf(value))
            ulp = math.ulp(float(exact))
            worst = max(worst, float(abs(mpmath.mpf(computed) - exact)) / ulp)
    print(f"numpy log: worst error {worst:.3g} ulp")
    assert worst <= 4 < LOG_ERROR_ULPS


def test_margin_formula() -> None:
    n = 10**6
    u = UNIT_ROUNDOFF
    log_error = 2 * LOG_ERROR_ULPS * u
    want = n * gamma(1) + (log_error + gamma(n) * (1 + log_error)) * (1 + u) * 2 * n / math.e
    got = instant_embedding_rounding_margin(n)
    assert want <= got <= want * (1 + 1e-8)
    assert 8.1e-5 < got < 8.3e-5  # e_w / (sigma n) is 8e-8 at sigma 1e-3
