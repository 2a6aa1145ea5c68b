"""The exact Binomial(u, 1/2) sampler has the binomial law: chi-square goodness of fit against
scipy's pmf at tiny, odd, threshold and large u, through the float decisions and through the
exact integer path alone (the float error bound made infinite), with a buffer that keeps
running out; a control showing the same test rejects the sampler with too narrow an envelope;
and the envelope's domination ``r(d) <= g(d)`` checked exactly (every d for small u, the
critical d of the first levels for large u)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from service.mechanisms import exact_binomial
from service.mechanisms.exact_binomial import (
    POPCOUNT_LIMIT,
    acceptance_rate,
    binomial_half,
    binomial_half_popcount,
    binomial_half_rejection,
    envelope_level,
    ratio,
    step_width,
)

#: Reject the fit below this p-value (deterministic generators: the tests cannot flake).
ALPHA = 1e-3
#: Draws per goodness-of-fit test.
DRAWS = 3000

Sampler = Callable[[np.random.Generator, int], int]


def fit_p(draws: list[int], u: int, bins: int = 24) -> float:
    """p-value of the chi-square goodness of fit of ``draws`` to Binomial(u, 1/2), in about
    ``bins`` bins of equal probability (the tails pooled; each bin's expectation >= 5)."""
    k = np.asarray(draws, dtype=np.int64)
    assert k.min() >= 0 and k.max() <= u
    quantiles = np.linspace(0.0, 1.0, bins + 1)[1:-1]
    cuts = stats.binom.ppf(quantiles, u, 0.5).astype(np.int64)
    upper = np.unique(np.append(cuts, u))  # bin i: upper[i - 1] < k <= upper[i]
    mass = np.diff(np.concatenate([[0.0], stats.binom.cdf(upper, u, 0.5)]))
    observed = np.bincount(np.searchsorted(upper, k, side="left"), minlength=upper.shape[0])
    expected = mass / mass.sum() * k.shape[0]
    assert expected.min() >= 5 and upper.shape[0] >= 2
    return float(stats.chisquare(observed, expected).pvalue)


def draw(sampler: Sampler, u: int, count: int = DRAWS, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [sampler(rng, u) for _ in range(count)]


@pytest.mark.parametrize("u", [1, 2, 3, 4, 7, 50, 101, 1000, 4097])
def test_rejection_sampler_fits_the_binomial_law_at_small_and_odd_u(u: int) -> None:
    assert fit_p(draw(binomial_half_rejection, u, seed=u), u) > ALPHA


@pytest.mark.parametrize("u", [POPCOUNT_LIMIT - 1, POPCOUNT_LIMIT, POPCOUNT_LIMIT + 1])
def test_binomial_half_fits_on_both_sides_of_the_threshold(u: int) -> None:
    assert fit_p(draw(binomial_half, u, seed=u), u) > ALPHA


def test_popcount_fits_the_binomial_law() -> None:
    assert fit_p(draw(binomial_half_popcount, 129, seed=5), 129) > ALPHA


@pytest.mark.parametrize("u", [10**6, 2**25 + 1])
def test_large_u_fits_the_binomial_law(u: int) -> None:
    draws = draw(binomial_half, u, seed=7)
    assert fit_p(draws, u) > ALPHA
    assert abs(np.mean(draws) - u / 2) < 5 * math.sqrt(u / 4 / len(draws))


def test_exact_path_alone_fits_the_binomial_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the float test's error bound infinite, no attempt is settled in floats: every
    acceptance is decided by the integer comparison, which must give the same law."""
    calls = {"exact": 0}
    exact = exact_binomial.exact_accept

    def counted(*args: object) -> tuple[bool, np.ndarray, int]:
        calls["exact"] += 1
        return exact(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(exact_binomial, "settle_slack", lambda: math.inf)
    monkeypatch.setattr(exact_binomial, "exact_accept", counted)
    u = 2 * POPCOUNT_LIMIT + 3
    draws = draw(binomial_half, u, count=2000, seed=11)
    assert calls["exact"] >= 2000  # every draw's acceptance (and each rejection) went there
    assert fit_p(draws, u) > ALPHA


def test_exact_accept_reads_further_words_of_the_same_uniform() -> None:
    """U's first word equal to the threshold's: the answer comes from U's next words."""
    rng = np.random.default_rng(3)
    m, d, level = 8, 1, 0  # A = r(1) = 8/9 = 0.111000111...b
    first = (8 << 64) // 9  # floor(A 2^64): U's first word ties
    words = np.array([first, 0, 0], dtype=np.uint64)  # U = first 2^-64 + 0 < A
    accepted, _, pos = exact_binomial.exact_accept(rng, words, 1, m, d, level)
    assert accepted and pos == 2
    words = np.array([first, 2**64 - 1], dtype=np.uint64)  # U above A
    accepted, _, pos = exact_binomial.exact_accept(rng, words, 1, m, d, level)
    assert not accepted and pos == 2
    words = np.array([first], dtype=np.uint64)  # the buffer runs out: more words are drawn
    accepted, more, pos = exact_binomial.exact_accept(rng, words, 1, m, d, level)
    assert more.shape[0] > 1 and pos >= 2


def test_running_out_of_words_redraws_the_attempt_from_the_same_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A buffer of one word runs out in every attempt: each is taken again from its first word
    with more words appended, which must not change the law."""
    monkeypatch.setattr(exact_binomial, "BUFFER_WORDS", 1)
    u = 3 * POPCOUNT_LIMIT
    assert fit_p(draw(binomial_half_rejection, u, count=2000, seed=13), u) > ALPHA
    a = binomial_half_rejection(np.random.default_rng(21), u)
    monkeypatch.setattr(exact_binomial, "BUFFER_WORDS", 64)
    assert binomial_half_rejection(np.random.default_rng(21), u) == a  # same stream, same draw


def test_control_too_narrow_an_envelope_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a quarter of the step, ``s / 4``, no longer dominates (at level 1, from about
    ``sigma / 2``, ``r`` is about ``e^-1/8 = 0.88`` above the height 1/2), so acceptances there
    are clipped at 1; the same test, with the same draws, rejects it (p about 1e-33; a third
    of the step, a subtler error, is caught at p 1e-7 to 3e-3 in five runs of 3000)."""
    u = 2 * POPCOUNT_LIMIT + 3
    assert fit_p(draw(binomial_half_rejection, u, seed=17), u) > ALPHA
    monkeypatch.setattr(exact_binomial, "step_width", lambda m: (math.isqrt(2 * m - 1) + 1) // 4)
    assert fit_p(draw(binomial_half_rejection, u, seed=17), u) < ALPHA


def test_control_acceptance_one_level_off_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control of the exact path: accepting with probability ``r(d) 2^(J + 1)`` (the envelope
    taken one step lower, so it no longer dominates at level 0, where ``2 r(d) > 1`` for
    ``|d| < 1.18 sigma``) is rejected by the same test, p 1e-18 to 1e-31 in five runs.
    (Forgetting ``2^J`` altogether only thins the tails beyond ``2 sigma``: the test needs
    about 4000 draws for it, p 8e-5 to 5e-3 in five runs.)"""
    exact = exact_binomial.exact_accept

    def one_off(
        rng: np.random.Generator, words: np.ndarray, pos: int, m: int, d: int, level: int
    ) -> tuple[bool, np.ndarray, int]:
        return exact(rng, words, pos, m, d, level + 1)

    monkeypatch.setattr(exact_binomial, "settle_slack", lambda: math.inf)
    monkeypatch.setattr(exact_binomial, "exact_accept", one_off)
    u = 2 * POPCOUNT_LIMIT + 3
    assert fit_p(draw(binomial_half, u, count=2000, seed=11), u) < ALPHA


def dominated(m: int, d: int) -> bool:
    num, den = ratio(m, d)
    return num << envelope_level(m, d) <= den  # r(d) 2^J <= 1


def test_envelope_dominates_every_offset_for_small_u() -> None:
    for m in range(1, 80):
        assert all(dominated(m, d) for d in range(-m, m + 1)), m


def test_envelope_dominates_the_first_levels_for_large_u() -> None:
    """Where domination is tightest: each level's first offsets on both sides (r decreases
    in |d|, so within a level the first offset has the largest r)."""
    for m in (2**15 + 1, 5 * 10**5, 2**24 - 7):
        s = step_width(m)
        assert (s - 1) ** 2 < 2 * m <= s**2
        for level in range(1, 4):
            for d in (level * s, level * s + 1, -(level * s) - 1, -(level * s) - 2):
                assert envelope_level(m, d) == level
                assert dominated(m, d)
            assert envelope_level(m, level * s - 1) == level - 1


def test_ratio_is_the_binomial_ratio() -> None:
    m = 9
    for d in range(-m, m + 1):
        num, den = ratio(m, d)
        assert Fraction(num, den) == Fraction(math.comb(2 * m, m + d), math.comb(2 * m, m))


def test_acceptance_rate_is_the_mass_over_the_envelope() -> None:
    for m in (1, 5, 40):
        mass = sum(Fraction(*ratio(m, d)) for d in range(-m, m + 1))
        exact = mass / (4 * step_width(m))
        assert math.isclose(acceptance_rate(m), float(exact), rel_tol=1e-9)
    assert abs(acceptance_rate(2**24) - math.sqrt(math.pi / 2) / 4) < 1e-3


def test_rejection_refuses_u_out_of_range() -> None:
    with pytest.raises(ValueError):
        binomial_half_rejection(np.random.default_rng(), 0)
    with pytest.raises(ValueError):
        binomial_half_rejection(np.random.default_rng(), 2**50)
