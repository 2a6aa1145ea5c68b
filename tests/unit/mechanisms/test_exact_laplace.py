"""The exact rounded-Laplace sampler (service/mechanisms/exact_laplace.py).

The law of N = round(L / gamma), L ~ Lap(1), is checked by a chi-square test on bins of equal
expected mass, computed from the Laplace CDF (P(N <= n) = F((n + 1/2) gamma)), for several
gammas, and at gamma ~ 1e-9 by the whole and fractional parts of |N| / t and |N| mod small m;
the Bernoulli helpers by their exact expectations; the buffering by drawing the same stream
with very different buffer sizes. The compiled kernel is checked to be the same function of the
word stream as a plain Python reference (thresholds computed on their own, uniforms as
unbounded lists of words), on random words and on words from a small alphabet that tie with
each other and with the thresholds (several words deep, past a one-word table), gate to zero
and sit on cell boundaries, so every rare path runs (the kernels of exact_words.py); uniforms
equal to a threshold on whole words are checked to go on with their own next word. The law is
also checked on every path with small tables (2 fraction bits: chains in a quarter of the
remainders; few thresholds: the tail), at the fine and coarse gammas on either side of 2^-6,
and against controls (a wrong table, a uniform remainder) that the same tests reject. The
table itself (exp_thresholds.py) is checked in test_exp_thresholds.py. Tests use seeded
generators; the service never does.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import numba
import numpy as np
import pytest
from numba.core.compiler import CompilerBase, DefaultPassBuilder, Flags, compile_extra
from numba.core.compiler_machinery import AnalysisPass, PassManager, register_pass
from numba.core.registry import cpu_target
from numba.core.typed_passes import (
    AnnotateTypes,
    IRLegalization,
    NoPythonSupportedFeatureValidation,
)
from scipy import stats

from service.errors import InvalidParameter
from service.mechanisms import exact_bernoulli, exact_words, laplace_kernel
from service.mechanisms import exact_laplace as el
from service.mechanisms import exp_thresholds as et
from service.mechanisms.exact_laplace import (
    bernoulli_exp,
    bernoulli_ratio,
    bernoulli_scaled,
    dyadic_scale,
    gamma_ratio,
    grid_laplace,
    rounded_laplace,
    uniform_below,
)
from tests.unit.mechanisms.test_exp_thresholds import pair_sum_threshold_word, threshold_word

GAMMAS = [(1, 256), (1, 3), (1, 1), (5, 2), (7, 1)]


def laplace_cdf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out: np.ndarray = np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0.0)), 1 - 0.5 * np.exp(-x))
    return out


def rounded_cdf(n: np.ndarray, gamma: float) -> np.ndarray:
    """P(N <= n) for integers n."""
    return laplace_cdf((np.asarray(n, dtype=np.float64) + 0.5) * gamma)


def chi_square_pvalue(draws: np.ndarray, gamma: float, bins: int = 60) -> float:
    """Chi-square p-value of ``draws`` against the rounded Laplace law, on integer bins of
    about equal expected mass (upper edges from the continuous quantiles)."""
    quantiles = stats.laplace.ppf(np.linspace(0, 1, bins + 1)[1:-1]) / gamma
    edges = np.unique(np.floor(quantiles).astype(np.int64))  # bin i: (edges[i-1], edges[i]]
    cdf = np.concatenate([[0.0], rounded_cdf(edges, gamma), [1.0]])
    expected = np.diff(cdf) * draws.shape[0]
    observed = np.bincount(np.searchsorted(edges, draws, side="left"), minlength=len(cdf) - 1)
    keep = expected > 0
    assert observed[~keep].sum() == 0
    return float(
        stats.chisquare(
            observed[keep], expected[keep] * observed.sum() / expected[keep].sum()
        ).pvalue
    )


@pytest.mark.parametrize(("s", "t"), GAMMAS)
def test_law_matches_the_rounded_laplace_law(s: int, t: int) -> None:
    gamma = s / t
    draws = rounded_laplace(np.random.default_rng(20261126 + s * 1000 + t), s, t, 400_000)
    assert draws.dtype == np.int64
    assert chi_square_pvalue(draws, gamma) > 1e-4
    # the atoms the derivation gives: P(N = 0) = 1 - e^{-gamma/2}, P(N = 1) = P(N = -1)
    count = draws.shape[0]
    for value, p in (
        (0, 1 - math.exp(-gamma / 2)),
        (1, math.exp(-gamma / 2) * (1 - math.exp(-gamma)) / 2),
        (-1, math.exp(-gamma / 2) * (1 - math.exp(-gamma)) / 2),
    ):
        observed = int(np.count_nonzero(draws == value))
        assert abs(observed - count * p) < 6 * math.sqrt(count * p * (1 - p)) + 1, (value, p)


@pytest.mark.parametrize(("s", "t"), [(1, 3), (5, 2)])
def test_a_wrong_gamma_is_rejected_by_the_same_test(s: int, t: int) -> None:
    draws = rounded_laplace(np.random.default_rng(7), s, t, 400_000)
    assert chi_square_pvalue(draws, 1.05 * s / t) < 1e-6


def test_the_rounded_law_is_that_of_rounding_an_exact_laplace() -> None:
    """g N against round_g(b L) by a two-sample test at gamma = g / b = 1/5: the same law."""
    grid, scale = 0.25, 1.25
    s, t = gamma_ratio(grid, scale)
    assert Fraction(s, t) == Fraction(1, 5)
    ours = rounded_laplace(np.random.default_rng(1), s, t, 200_000) * grid
    theirs = np.round(np.random.default_rng(2).laplace(0.0, scale, 200_000) / grid) * grid
    values = np.union1d(ours, theirs)
    table = np.array(
        [np.bincount(np.searchsorted(values, x), minlength=values.size) for x in (ours, theirs)]
    )
    table = table[:, table.sum(axis=0) >= 20]  # the bulk; the tails are in the chi-square above
    assert stats.chi2_contingency(table).pvalue > 1e-4


def test_reproducible_with_a_seeded_generator_and_independent_of_the_buffer() -> None:
    """The same stream of raw words gives the same draws whatever the buffer size: a draw
    that runs out of words is rewound and drawn again from the same words."""
    first = rounded_laplace(np.random.default_rng(42), 1, 3, 5_000)
    again = rounded_laplace(np.random.default_rng(42), 1, 3, 5_000)
    np.testing.assert_array_equal(first, again)
    for chunk in (1, 2, 7, 64):
        out = np.empty(5_000, dtype=np.int64)
        el._fill(np.random.default_rng(42), 1, 3, out, chunk)
        np.testing.assert_array_equal(out, first)
    assert not np.array_equal(first, rounded_laplace(np.random.default_rng(43), 1, 3, 5_000))


def test_only_raw_words_are_drawn() -> None:
    class WordsOnly(np.random.Generator):
        def __getattribute__(self, name: str) -> object:
            if name not in {"bit_generator"}:
                raise AssertionError(f"the exact sampler used Generator.{name}")
            return super().__getattribute__(name)

    rng = WordsOnly(np.random.PCG64DXSM(3))
    assert rounded_laplace(rng, 1, 256, 1000).shape == (1000,)
    assert grid_laplace(rng, np.array([3.0, 0.0, 1.5]), 2.0**-8).shape == (3,)


def test_the_widening_multiply_is_the_128_bit_product() -> None:
    """``mul_high_low`` (one LLVM i128 multiply; four 32-bit products where numba's compiler is
    off): the high and low words of a * b, against Python's integers, at the corners and on
    random words."""
    edges = [0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
    pairs = [(a, b) for a in edges for b in edges]
    words = np.random.default_rng(12).integers(0, 2**64 - 1, (5000, 2), dtype=np.uint64)
    pairs += [(int(a), int(b)) for a, b in words]
    for a, b in pairs:
        high, low = exact_bernoulli.mul_high_low(np.uint64(a), np.uint64(b))
        assert (int(high), int(low)) == divmod(a * b, 2**64), (a, b)
    # the four 32-bit products, which run where numba's compiler is off
    for a, b in pairs[:2000]:
        high, low = exact_bernoulli._split_product(np.uint64(a), np.uint64(b))
        assert (int(high), int(low)) == divmod(a * b, 2**64), (a, b)


@pytest.mark.slow
@pytest.mark.parametrize(("a", "b"), [(0, 1), (1, 3), (1, 1), (5, 2), (7, 3), (2**52, 2**52 + 1)])
def test_bernoulli_exp_has_the_exact_expectation(a: int, b: int) -> None:
    rng = np.random.default_rng(a * 31 + b)
    count = 40_000
    hits = sum(bernoulli_exp(rng, a, b) for _ in range(count))
    p = math.exp(-a / b)
    assert abs(hits - count * p) <= 6 * math.sqrt(count * p * (1 - p)) + 1e-9, (hits, p)


@pytest.mark.parametrize(
    ("a", "m"), [(0, 1), (1, 1), (1, 3), (2**40, 3 * 2**40), (2**62, 2**63 + 5)]
)
def test_bernoulli_ratio_has_the_exact_expectation(a: int, m: int) -> None:
    rng = np.random.default_rng(m % 1000 + a % 7)
    count = 40_000
    hits = sum(bernoulli_ratio(rng, a, m) for _ in range(count))
    p = a / m
    assert abs(hits - count * p) <= 6 * math.sqrt(count * p * (1 - p)) + 1e-9, (hits, p)


@pytest.mark.slow
def test_bernoulli_scaled_when_b_k_overflows_64_bits() -> None:
    """b k >= 2^64: drawn as Bernoulli(a / b) * Bernoulli(1 / k), still of mean a / (b k)."""
    a, b, k = 3 * 2**60, 2**62, 5
    assert b * k >= 2**64
    rng = np.random.default_rng(5)
    count = 40_000
    hits = sum(bernoulli_scaled(rng, a, b, k) for _ in range(count))
    p = a / (b * k)
    assert abs(hits - count * p) <= 6 * math.sqrt(count * p * (1 - p)), (hits, p)
    # and the fitting case agrees with its mean as well
    hits = sum(bernoulli_scaled(rng, 2, 3, 7) for _ in range(count))
    p = 2 / 21
    assert abs(hits - count * p) <= 6 * math.sqrt(count * p * (1 - p)), (hits, p)


@pytest.mark.parametrize("m", [3, 1000, 2**32, 2**32 + 3, 3 * 2**61])
def test_uniform_below_is_uniform(m: int) -> None:
    """Chi-square over 16 equal ranges (m >= 16) or the values; 32-bit and 64-bit paths."""
    rng = np.random.default_rng(m % 9973)
    draws = np.array([uniform_below(rng, m) for _ in range(32_000)], dtype=object)
    assert all(0 <= x < m for x in draws)
    cells = min(m, 16)
    observed = np.bincount([x * cells // m for x in draws], minlength=cells)
    edges = [-(-i * m // cells) for i in range(cells + 1)]  # first value of each cell
    expected = np.diff(edges) / m * draws.size
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_overflow_of_k_raises_instead_of_returning_off_law() -> None:
    out = np.empty(10_000, dtype=np.int64)
    with pytest.raises(OverflowError):
        el._fill(np.random.default_rng(1), 1, 1, out, 1000, max_k=0)
    el._fill(np.random.default_rng(1), 1, 1, out, 1000, max_k=10**6)  # no overflow
    # the bound keeps 2t (k + 1) + s below 2^64, and leaves k room for e^-1534
    for s, t in ((1, 1), (2**62 - 1, 2**52 - 1), (1, 2**52 - 1)):
        k = el._max_k(s, t)
        assert 2 * t * (k + 1) + s < 2**64 <= 2 * t * (k + 2) + s
        assert k >= 1534


@pytest.mark.parametrize(
    ("s", "t"),
    [(0, 1), (1, 0), (-1, 3), (1, 2**52), (1, 2**51 + 1), (2**62, 1), (True, 1), (1.0, 2)],
)
def test_bad_parameters_are_refused(s: object, t: object) -> None:
    with pytest.raises(InvalidParameter):
        rounded_laplace(np.random.default_rng(), s, t, 1)  # type: ignore[arg-type]


def test_smallest_gamma_is_accepted_and_bad_counts_refused() -> None:
    assert rounded_laplace(np.random.default_rng(1), 1, 2**50, 3).shape == (3,)
    with pytest.raises(InvalidParameter):
        rounded_laplace(np.random.default_rng(1), 1, 3, -1)
    assert rounded_laplace(np.random.default_rng(1), 1, 3, 0).shape == (0,)


@pytest.mark.parametrize("scale", [20.0, 0.1, 1 / 3, 2e6, 1e-9, 7.000001, 123456.789])
def test_dyadic_scale_is_the_smallest_20_bit_float_above(scale: float) -> None:
    rounded = dyadic_scale(scale)
    assert rounded >= scale and rounded - scale < scale * 2.0**-19
    mantissa, exponent = math.frexp(rounded)
    top = math.ldexp(mantissa, 20)
    assert top == int(top)  # at most 20 significant bits
    below = math.ldexp(top - 1, exponent - 20)
    assert below < scale  # the previous 20-bit value is too small
    assert dyadic_scale(scale / 2) == rounded / 2


def test_gamma_ratio_is_exact_and_reduced() -> None:
    scale = dyadic_scale(20.0 / 0.3)
    s, t = gamma_ratio(2.0**-2, scale)
    assert Fraction(s, t) == Fraction(2.0**-2) / Fraction(scale)
    assert math.gcd(s, t) == 1 and t < 2**52
    with pytest.raises(InvalidParameter):
        gamma_ratio(1.0, 1.0 + 2.0**-52)  # t = 2^52 + 1: a scale with a 53-bit mantissa
    with pytest.raises(InvalidParameter):
        gamma_ratio(2.0**-60, 1.0)  # gamma below 2^-50
    with pytest.raises(InvalidParameter):  # a refusal is not kept: asked again, refused again
        gamma_ratio(2.0**-60, 1.0)
    assert gamma_ratio(2.0**-2, scale) == (s, t)  # kept: the same ratio
    with pytest.raises(InvalidParameter):
        gamma_ratio(float("nan"), scale)
    with pytest.raises(InvalidParameter):
        dyadic_scale(0.0)


def test_grid_laplace_groups_by_scale_and_stays_on_the_grid() -> None:
    grid = 2.0**-6
    scales = np.array([20.0, 10.0, 0.0] * 40_000)
    noise = grid_laplace(np.random.default_rng(3), scales, grid)
    assert np.all(noise[2::3] == 0.0)
    assert np.all(noise / grid == np.round(noise / grid))
    for scale, part in ((20.0, noise[0::3]), (10.0, noise[1::3])):
        b = dyadic_scale(scale)
        assert chi_square_pvalue(np.round(part / grid).astype(np.int64), grid / b) > 1e-4
    one = grid_laplace(np.random.default_rng(3), 20.0, grid, count=5)
    assert one.shape == (5,)
    with pytest.raises(InvalidParameter):
        grid_laplace(np.random.default_rng(3), 20.0, 0.3, count=5)


# --- the kernel against a plain reference of the same function of the word stream --------


class ScriptedWords:
    """A stand-in generator whose raw words are ``script`` and then a seeded PCG64's."""

    def __init__(self, script: list[int], seed: int) -> None:
        outer = self
        self.script = list(script)
        self.rest = np.random.PCG64(seed)

        class Bits:
            def random_raw(self, size: int) -> np.ndarray:
                head, outer.script = outer.script[:size], outer.script[size:]
                more = outer.rest.random_raw(size - len(head)).tolist()
                return np.array(head + more, dtype=np.uint64)

        self.bit_generator = Bits()


def reference_draws(
    words: list[int], s: int, t: int, count: int, m: int = et.FRACTION_BITS,
    length: int = et.TABLE_LENGTH, pair_sum: bool = False,
) -> list[int]:  # fmt: skip
    """The sampler written out with Python integers and unbounded lists (module docstring):
    the same words in the same order. z = floor(2^m X) counts the thresholds T_i = P(X >= i /
    2^m), i = 1..J, above a uniform U (compared word by word, drawing U's further words on a
    tie), a fresh U adding J when U < T_J; |N| from z alone when every X in [z, z + 1) / 2^m
    gives it and gamma > 2^-m; otherwise a remainder y accepted by its gate or its chain, and
    floor(2 t X) = floor((2 t z + floor(2 t y)) / 2^m), floor(2 t y) from the interval of y's
    words; the sign bit last. ``pair_sum``: X = |L1 + L2|, its own thresholds; past them the
    same law again when a uniform r < 2^(m+1) / (2^(m+1) + J), else Exp(1) (the exponential
    thresholds from there on); y also accepted with probability (2^m + z + y) / (2^m + z + 1):
    outright unless r < 1 / (2^m + z + 1), then when a fresh uniform u < y. r: LINEAR_BITS bits
    of the reservoir, then fresh words."""
    stream = iter(words)
    reservoir = left = 0

    def take(bits: int) -> int:
        nonlocal reservoir, left
        if left < bits:
            reservoir, left = next(stream), 64
        value = reservoir & ((1 << bits) - 1)
        reservoir, left = reservoir >> bits, left - bits
        return value

    def below(u: list[int], i: int, pair: bool) -> bool:  # U < T_i, U's words drawn as needed
        d = 0
        while True:
            if d == len(u):
                u.append(next(stream))
            digit = pair_sum_threshold_word(i, m, d) if pair else threshold_word(i, m, d)
            if u[d] != digit:
                return u[d] < digit
            d += 1

    def less(new: list[int], old: list[int]) -> bool:  # the kernel's order of words on a tie
        d = 0
        while new[d] == old[d]:
            d += 1
            if len(old) <= d:
                old.append(next(stream))
            new.append(next(stream))
        return new[d] < old[d]

    def ratio_below(num: int, den: int) -> bool:  # r < num / den
        k = laplace_kernel.LINEAR_BITS
        h, scaled = take(k), num << k
        if h * den >= scaled or (h + 1) * den <= scaled:
            return (h + 1) * den <= scaled
        rest = scaled - h * den  # the further words against rest / den, a digit at a time
        while rest:
            digit, rest = divmod(rest << 64, den)
            word = next(stream)
            if word != digit:
                return word < digit
        return False

    out = []
    for _ in range(count):
        z, linear = 0, pair_sum
        while True:
            u = [next(stream)]
            i = 0
            while i < length and below(u, i + 1, linear):
                i += 1
            z += i
            if i < length:
                break
            if linear:
                linear = ratio_below(2 ** (m + 1), 2 ** (m + 1) + length)
        magnitude = None
        if (s << m) > t:
            lo = ((2 * t * z >> m) + s) // (2 * s)
            hi = (((2 * t * z + 2 * t - 1) >> m) + s) // (2 * s)
            if lo == hi:
                magnitude = lo
        if magnitude is None:
            while True:  # the remainder
                y = [next(stream)]
                odd = True
                if take(m) == 0:
                    previous = y  # u_1's gate was 0: compare v_1 with y
                    while True:
                        v = [next(stream)]
                        if not less(v, previous):
                            break  # the chain breaks at this odd or even index
                        previous, odd = v, not odd
                        if take(m) != 0:
                            break  # u_j >= 2^-m > u_(j-1): the chain breaks at this index
                if not odd:
                    continue
                if linear and ratio_below(1, 2**m + i + 1) and not less([next(stream)], y):
                    continue
                break
            while True:  # floor(2 t y) from y in [Y / 2^(64d), (Y + 1) / 2^(64d))
                bits = 64 * len(y)
                value = int.from_bytes(b"".join(w.to_bytes(8, "big") for w in y), "big")
                low, high = (2 * t * value) >> bits, (2 * t * (value + 1) - 1) >> bits
                if low == high:
                    break
                y.append(next(stream))
            magnitude = (((2 * t * z + low) >> m) + s) // (2 * s)
        negative = take(1)
        out.append(-magnitude if negative else magnitude)
    return out


def script_words(alphabet: list[int], length: int, seed: int) -> list[int]:
    picks = np.random.default_rng(seed).integers(0, len(alphabet), length)
    return [alphabet[i] for i in picks]


REFERENCE_GAMMAS = [
    (1, 1_000_000_512), (1, 256), (5, 2), (7, 3), (3, 2**51 + 1), (1, 2**43), (65, 4096),
    (1, 64), (2**40, 1),
]  # fmt: skip


@pytest.mark.parametrize(("s", "t"), REFERENCE_GAMMAS)
def test_the_kernel_is_the_reference_on_random_words(s: int, t: int) -> None:
    words = np.random.PCG64(s % 1000 * 7 + t % 1000).random_raw(20_000).tolist()
    ours = rounded_laplace(ScriptedWords(words, 0), s, t, 4000)  # type: ignore[arg-type]
    assert ours.tolist() == reference_draws(words, s, t, 4000)


THIRD, SIXTH = 0x5555555555555555, 0x2AAAAAAAAAAAAAAA  # 1/3 and 1/6 to 64 bits, truncated


def tie_alphabet() -> list[int]:
    """Words that tie with each other, with the first and second words of thresholds (the
    table's first entries, the guide's wide cells, T_J at the table's end), that are zero
    gates, and that sit on the cells of floor(2 t y) (1/3, 1/6 for t = 3, 6)."""
    table = et.exp_table()
    picks = [1, 2, 63, 64, 65, 300, 700, et.TABLE_LENGTH - 1, et.TABLE_LENGTH]
    firsts = [int(table.first[i]) for i in picks]
    seconds = [int(table.deeper[i, 0]) for i in picks]
    return [0, 1, 2**63, 2**64 - 1, THIRD, THIRD + 1, SIXTH, SIXTH + 1, 2**64 - 2, *firsts,
            *(w + 1 for w in firsts), *seconds]  # fmt: skip


@pytest.mark.parametrize("scratch", [1, 2, el._SCRATCH_WORDS])
@pytest.mark.parametrize(("s", "t"), [(1, 3), (1, 6), (2, 3), (1, 1_000_000_512), (65, 4096)])
def test_the_kernel_is_the_reference_when_words_tie(scratch: int, s: int, t: int) -> None:
    """Words from a small alphabet tie all the time, often on several words in a row (deeper
    than the scratch holds at first), tie with thresholds (deeper than a one-word table
    holds: the table is extended), gate to zero (so chains run) and sit on the cells of
    floor(2 t y): every rare path, against the reference, whatever the buffer, scratch and
    table sizes."""
    words = script_words(tie_alphabet(), 60_000, s * 100 + t % 97 + scratch)
    expected = reference_draws(words, s, t, 1500)
    for chunk, table in ((3, et.exp_table(words=1)), (64, None), (4096, et.exp_table(words=1))):
        out = np.empty(1500, dtype=np.int64)
        stub: np.random.Generator = ScriptedWords(words, 0)  # type: ignore[assignment]
        el._fill(stub, s, t, out, chunk, scratch=scratch, table=table)
        assert out.tolist() == expected
    assert len({abs(x) for x in expected}) > 10  # not a degenerate stream


@pytest.mark.parametrize("i", [1, 2, 64, 777, et.TABLE_LENGTH - 1, et.TABLE_LENGTH])
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("above", [False, True])
def test_a_uniform_equal_to_a_threshold_on_whole_words_goes_on(
    i: int, depth: int, above: bool
) -> None:
    """A uniform whose first ``depth`` words are those of T_i: the comparison goes on with the
    same uniform's next word against T_i's next word (drawn from a table extended as far as
    needed), and z is i (the uniform below T_i) or i - 1, as the reference says; at T_J a
    uniform below it takes the tail (a fresh uniform)."""
    m = et.FRACTION_BITS
    digits = [threshold_word(i, m, d) for d in range(depth + 1)]
    next_word = digits[depth] + 1 if above else digits[depth] - 1
    words = [*digits[:depth], next_word, *np.random.PCG64(i + depth).random_raw(64).tolist()]
    s, t = 1, 2**20  # gamma 2^-20: |N| carries z
    expected = reference_draws(words, s, t, 8)
    for table in (et.exp_table(words=1), None):
        out = np.empty(8, dtype=np.int64)
        el._fill(ScriptedWords(words, 0), s, t, out, 8, table=table)  # type: ignore[arg-type]
        assert out.tolist() == expected
    z_from_first = abs(expected[0]) * 2**m // t  # floor(2^m E) up to the rounding to a cell
    if i < et.TABLE_LENGTH:
        assert z_from_first in ((i - 2, i - 1, i) if above else (i - 1, i, i + 1))
    else:
        assert (z_from_first >= i) != above


# --- the law on every path: small tables, the coarse and fine gammas, a control -----------


LAW_GAMMAS = [(1, 2**43), (1, 2**20), (1, 64), (65, 4096), (2, 3), (1, 1), (12, 1)]


@pytest.mark.parametrize(("s", "t"), LAW_GAMMAS)
def test_law_at_fine_coarse_and_large_gammas(s: int, t: int) -> None:
    """Chi-square against the exact pmf at gamma 2^-43 (the diffusion's), 2^-20, 2^-6 (the
    last fine gamma), 65/4096 (the first coarse one), 2/3, 1 and 12 (N != 0 with probability
    e^-6); and P(N = 0) = 1 - e^{-gamma/2}."""
    gamma = s / t
    count = 400_000
    draws = rounded_laplace(np.random.default_rng(20261129 + s + t % 1000), s, t, count)
    if gamma < 2:
        assert chi_square_pvalue(draws, gamma) > 1e-4
    else:
        cells = np.bincount(np.minimum(np.abs(draws), 2), minlength=3)
        p = np.array([-math.expm1(-gamma / 2), 0.0, 0.0])
        p[1] = math.exp(-gamma / 2) * -math.expm1(-gamma)
        p[2] = 1 - p[0] - p[1]
        assert stats.chisquare(cells, p * count).pvalue > 1e-4
    p0 = -math.expm1(-gamma / 2)
    zeros = int(np.count_nonzero(draws == 0))
    assert abs(zeros - count * p0) < 6 * math.sqrt(count * p0 * (1 - p0)) + 1


def fine_cells_pvalue(draws: np.ndarray, t: int, m: int, parts: int = 8) -> float:
    """At gamma = 1/t, t a multiple of 2^m * parts: chi-square of (floor(2^m E), the eighth of
    its cell E falls in), E ~ |N| / t, for E < 4, and the rest; the exact law of |N| gives
    each cell's mass (P(|N| >= j) = e^{-(j - 1/2) / t}). The shape inside a cell is where a
    remainder drawn uniform instead of with density e^{-y / 2^m} would show."""
    step = t // (2**m * parts)
    edges = np.arange(1, 4 * 2**m * parts + 1) * step  # cells [edges[i-1], edges[i])
    magnitude = np.abs(draws)
    cells = np.bincount(np.searchsorted(edges, magnitude, side="right"), minlength=edges.size + 1)
    starts = np.concatenate([[0], edges])
    at_least = magnitude_at_least(starts, 1 / t)
    p = np.append(-np.diff(at_least), at_least[-1])
    return float(stats.chisquare(cells, p / p.sum() * draws.size).pvalue)


@pytest.mark.parametrize(
    ("m", "length"), [(2, 8), (2, 40), (et.FRACTION_BITS, 64), (et.FRACTION_BITS, 200)]
)
@pytest.mark.parametrize(("s", "t"), [(1, 2**16), (1, 3), (5, 2)])
def test_law_with_small_tables_takes_every_path(m: int, length: int, s: int, t: int) -> None:
    """Tables of 2 fraction bits (a zero gate, so a chain, in a quarter of the remainders)
    and of few thresholds (the tail, z >= J and a fresh uniform, with probability e^{-J/2^m}
    up to e^-2): the law is still exact."""
    table = et.exp_table(m, length)
    out = np.empty(300_000, dtype=np.int64)
    el._fill(np.random.default_rng(m * 1000 + length + t), s, t, out, 4096, table=table)
    assert chi_square_pvalue(out, s / t) > 1e-4
    if t == 2**16:
        assert fine_cells_pvalue(out, t, m) > 1e-4


def test_a_wrong_table_is_rejected_by_the_same_tests() -> None:
    """Controls: the kernel with thresholds exp(-1.03 i / 2^m) (E of a 3% smaller scale) and
    a sampler whose remainder is uniform instead of density e^{-y / 2^m} (2 fraction bits,
    numpy) are rejected by the chi-square tests above; the right table passes them."""
    m, length = et.FRACTION_BITS, 256
    wrong = et.table_from(
        m,
        [[int(math.exp(-1.03 * i / 2**m) * 2**64), 0] for i in range(1, length + 1)],
        et.GUIDE_BITS,
    )
    out = np.empty(300_000, dtype=np.int64)
    el._fill(np.random.default_rng(3), 1, 3, out, 4096, table=wrong)
    assert chi_square_pvalue(out, 1 / 3) < 1e-6
    # the remainder drawn uniform (no gate, no chain), z by the right table of 2 fraction bits
    right = et.exp_table(2, 40)
    rng = np.random.default_rng(4)
    u = rng.bit_generator.random_raw(out.size)
    z = (right.first[1:][None, :] > u[:, None]).sum(axis=1).astype(np.int64)  # ties: 2^-64
    y = rng.bit_generator.random_raw(out.size) >> np.uint64(47)  # floor(2 t y), 2t = 2^17
    uniform_remainder = ((2**17 * z + y.astype(np.int64)) >> 2) + 1 >> 1
    assert fine_cells_pvalue(uniform_remainder, 2**16, 2) < 1e-6
    el._fill(np.random.default_rng(4), 1, 2**16, out, 4096, table=right)
    assert fine_cells_pvalue(out, 2**16, 2) > 1e-4


@pytest.mark.parametrize(("s", "t"), [(1, 2**43), (1, 256), (1, 1), (5, 2)])
def test_words_per_draw(s: int, t: int) -> None:
    """About 2.1 raw words a draw when the remainder is needed (gamma <= 2^-6), about 1 when
    z alone decides |N| (gamma 1, 5/2): half the von Neumann sampler's 4.3 or less."""
    count = 100_000
    words = np.random.PCG64(5).random_raw(5 * count)
    state = np.zeros(3, dtype=np.int64)
    table = et.exp_table()
    out = np.empty(count, dtype=np.int64)
    two_s = 2 * s
    done = laplace_kernel.rounded_laplace_kernel(
        words, state, np.zeros(1, dtype=np.uint64), np.zeros((3, 4), dtype=np.uint64),
        table.first, table.deeper, table.guide, table.first, table.deeper, table.guide,
        np.uint64(table.fraction_bits), np.uint64(64 - table.guide_bits), np.uint64(s),
        np.uint64(t), np.int64(two_s.bit_length() - 1 if two_s & (two_s - 1) == 0 else -1),
        (s << table.fraction_bits) > t, np.uint64(el._max_k(s, t)), False, out, np.int64(0),
    )  # fmt: skip
    assert done == count and state[2] == 0
    per_draw = int(state[0]) / count
    assert (2.0 < per_draw < 2.2) if s / t <= 2**-6 else (per_draw < 1.2), per_draw


# --- the law at a tiny gamma --------------------------------------------------------------


def magnitude_at_least(j: np.ndarray, gamma: float) -> np.ndarray:
    """P(|N| >= j) = e^{-(j - 1/2) gamma} for integers j >= 1 (and 1 for j = 0)."""
    j = np.asarray(j, dtype=np.float64)
    out: np.ndarray = np.where(j <= 0, 1.0, np.exp(-(j - 0.5) * gamma))
    return out


def test_law_at_gamma_1e9_by_whole_and_fractional_part() -> None:
    """gamma = 1 / t, t ~ 1e9: |N| // t and the tenth of t that |N| mod t falls in, jointly,
    against the exact law (cells [q t + a, q t + b) have mass P(|N| >= q t + a) - P(|N| >= q t
    + b)), and the sign; plus |N| mod m for small m against the exact sums."""
    s, t = gamma_ratio(2.0**-30, dyadic_scale(2.0**-30 * 1e9))
    assert s == 1 and 10**9 < t < 2 * 10**9
    gamma = s / t
    count = 400_000
    draws = rounded_laplace(np.random.default_rng(20261126), s, t, count)
    magnitude = np.abs(draws)
    whole = np.minimum(magnitude // t, 6)  # 6 means >= 6
    tenth = (magnitude % t) * 10 // t
    starts = np.array([q * t + (a * t + 9) // 10 for q in range(6) for a in range(10)])
    ends = np.array([q * t + ((a + 1) * t + 9) // 10 for q in range(6) for a in range(10)])
    p = magnitude_at_least(starts, gamma) - magnitude_at_least(ends, gamma)
    p = np.append(p, magnitude_at_least(np.array([6 * t]), gamma))
    observed = np.bincount(np.where(whole == 6, 60, whole * 10 + tenth), minlength=61)
    assert stats.chisquare(observed, p / p.sum() * count).pvalue > 1e-4
    negative = int(np.count_nonzero(draws < 0))
    assert abs(negative - count / 2) < 6 * math.sqrt(count / 4)
    for m in (2, 3, 5, 64):
        # P(|N| = j) = e^{-gamma/2} (1 - e^{-gamma}) e^{-(j-1) gamma}, j >= 1
        first = np.array([r if r >= 1 else m for r in range(m)])
        p = (
            math.exp(-gamma / 2)
            * math.expm1(-gamma)
            / math.expm1(-m * gamma)
            * np.exp(-(first - 1) * gamma)
        )
        p[0] += -math.expm1(-gamma / 2)  # N = 0
        observed = np.bincount(magnitude % m, minlength=m)
        assert stats.chisquare(observed, p / p.sum() * count).pvalue > 1e-4, m


def test_a_wrong_tiny_gamma_is_rejected_by_the_same_test() -> None:
    t = 1_000_000_512
    draws = np.abs(rounded_laplace(np.random.default_rng(11), 1, t, 400_000))
    wrong = 1 / (1.02 * t)  # the law of a 2% larger scale
    edges = np.arange(1, 40) * t // 8
    cells = np.bincount(np.searchsorted(edges, draws, side="right"), minlength=40)
    p = -np.diff(np.concatenate([[1.0], magnitude_at_least(edges, wrong), [0.0]]))
    assert stats.chisquare(cells, p * draws.shape[0]).pvalue < 1e-6
    p = -np.diff(np.concatenate([[1.0], magnitude_at_least(edges, 1 / t), [0.0]]))
    assert stats.chisquare(cells, p * draws.shape[0]).pvalue > 1e-4


@register_pass(mutates_CFG=False, analysis_only=True)
class StopAfterTypeAnnotation(AnalysisPass):
    """The last pass of :class:`TypingOnlyCompiler`: its result is the type annotation."""

    _name = "stop_after_type_annotation"

    def __init__(self) -> None:
        AnalysisPass.__init__(self)

    def run_pass(self, state: Any) -> bool:
        state.cr = state.type_annotation
        return False


class TypingOnlyCompiler(CompilerBase):
    """numba's nopython pipeline up to its type annotation, without the lowering to LLVM and
    machine code: the untyped and typed passes, then the lowering pipeline's validation,
    legalisation and annotation (the annotation inspect_types prints), and stop."""

    def define_pipelines(self) -> list[PassManager]:
        passes = PassManager("typing only")
        passes.passes.extend(DefaultPassBuilder.define_untyped_pipeline(self.state).passes)
        passes.passes.extend(DefaultPassBuilder.define_typed_pipeline(self.state).passes)
        passes.add_pass(NoPythonSupportedFeatureValidation, "validate features")
        passes.add_pass(IRLegalization, "legalise the IR")
        passes.add_pass(AnnotateTypes, "annotate types")
        passes.add_pass(StopAfterTypeAnnotation, "stop")
        passes.finalize()
        return [passes]


def typed_listing(function: Any, signature: tuple[Any, ...]) -> str:
    """numba's type annotation of ``function`` (a Python function) at ``signature``, as
    ``inspect_types`` lists it, typed afresh in nopython mode without NRT (as the kernels)."""
    flags = Flags()
    flags.nrt = False
    flags.no_cpython_wrapper = True
    annotation = compile_extra(
        cpu_target.typing_context, cpu_target.target_context, function, signature, None,
        flags, {}, pipeline_class=TypingOnlyCompiler,
    )  # fmt: skip
    return str(annotation)


@pytest.mark.slow
def test_no_float_in_the_compiled_integer_path() -> None:
    """numba types a uint64/int64 mix as float64: no value in the kernels is a float (each
    typed afresh here, since a copy loaded from numba's cache carries no type listing; typing
    alone, as the types are fixed before the lowering, which took a third of the time)."""
    u64, i64 = numba.types.uint64, numba.types.int64
    words, ints, table = u64[::1], i64[::1], u64[:, ::1]
    guide = numba.types.int32[::1]
    boolean = numba.types.boolean
    # scratch, first, deeper, guide, the tail's first, deeper, guide, m, guide_shift, s, t,
    # s_shift, coarse, max_k, pair_sum
    shared = (table, words, table, guide, words, table, guide, u64, u64, u64, u64, i64, boolean,
              u64, boolean)  # fmt: skip
    signatures = {
        laplace_kernel.rounded_laplace_kernel: (words, ints, words, *shared, ints, i64),
        laplace_kernel.draw_one: (words, i64, u64, i64, *shared),
        laplace_kernel.ratio_gate: (words, i64, u64, i64, table, u64, u64),
        exact_words.von_neumann_chain: (words, i64, table, u64, u64, i64, u64),
        exact_words.threshold_tie: (words, i64, table, i64),
        exact_words.tie: (words, i64, table, i64, i64, i64),
        exact_words.carry: (words, i64, table, i64, u64, u64),
        exact_bernoulli.bernoulli_exp_unit_kernel: (words, ints, words, u64, u64),
        exact_bernoulli.bernoulli_exp_kernel: (words, ints, words, u64, u64),
    }
    for kernel, signature in signatures.items():
        listing = typed_listing(kernel.py_func, signature)  # type: ignore[attr-defined]
        typed = re.findall(r"::\s*(\w+)", listing)
        assert "uint64" in typed, kernel
        assert not [name for name in typed if "float" in name], kernel


def test_the_type_listing_shows_a_float_in_an_integer_function() -> None:
    """Control: typing alone lists a float value of an integer function (a true division of
    a uint64 by an int64), so the test above can fail."""

    def divided(a: int, b: int) -> float:
        c = a / b
        return c

    typed = re.findall(
        r"::\s*(\w+)", typed_listing(divided, (numba.types.uint64, numba.types.int64))
    )
    assert "uint64" in typed and "float64" in typed
