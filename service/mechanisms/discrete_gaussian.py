"""An exact sampler of the discrete Gaussian, from uniform random integers only.

Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for Differential Privacy",
Algorithm 3: for a scale parameter ``sigma`` the discrete Gaussian ``N_Z(0, sigma^2)`` has
``P(Z = z) ∝ exp(-z^2 / (2 sigma^2))`` on the integers. With ``sigma^2 = m t``, ``t = 2^tau``
(``m``, ``tau`` integers, :func:`discrete_gaussian_parameters`):

1. draw ``Y`` from the discrete Laplace law ``P(Y = y) ∝ exp(-|y| / t)`` (their Algorithm 2 with
   ``s = 1``): ``U`` uniform on ``{0, ..., t-1}``, kept with probability ``exp(-U / t)`` (else
   start again); ``V`` the number of successes of ``Bernoulli(exp(-1))`` before the first failure;
   ``X = U + t V``; a fair sign bit ``B``; ``B = 1`` with ``X = 0`` starts again; ``Y = ±X``;
2. accept ``Y`` with probability ``exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))`` =
   ``exp(-(X - m)^2 / (2 m t))``, else start again from 1.

The accepted ``Y`` has ``P(Y = y) ∝ exp(-|y|/t - (|y| - m)^2/(2mt)) ∝ exp(-y^2 / (2 m t))``: the
algorithm is exact for every ``t > 0`` (``t`` only sets how often it starts again; a power of two
near ``sigma`` keeps that below about 2 attempts and every quantity an integer).

Every Bernoulli is exact (:mod:`service.mechanisms.exact_bernoulli`: CKS Algorithm 1 for
``Bernoulli(exp(-a/b))``, Lemire's uniform integers). The acceptance of step 2 is split without
any rounding: with ``w = |X - m|``, ``w^2 = A t + r`` (``A = floor(w^2 / t)``, ``0 <= r < t``, from
the 128-bit product ``w w``), ``exp(-w^2 / (2mt)) = exp(-A / (2m)) exp(-r / (2mt))``, the product
of two independent exact Bernoullis; the second, whose exponent ``r / (2mt) < 1/(2m)`` may have a
denominator past 64 bits, runs CKS Algorithm 1 with ``Bernoulli(x / k) = Bernoulli(r / t)
Bernoulli(1 / (2 m k))``. So the only randomness is the generator's raw 64-bit words
(``random_raw``) and every decision is an exact integer comparison.

Guards (raise :class:`OverflowError` rather than return a value off the law): ``V`` at or above
``2^63 / t`` (probability ``e^(-2^(63 - tau))``, below ``e^-2048`` for the allowed
``tau <= 52``), and ``w^2 / t`` at or above ``2^64`` (``X`` beyond about ``2^(32 + tau/2)``:
probability below ``e^-(2^32 / sqrt(t))``, below ``e^-2^6`` only if ``tau > 52``).

Buffering as in :mod:`service.mechanisms.exact_laplace`: a draw that runs out of words is
rewound to its first word (and the bit reservoir to its state then) and drawn again from the
same words followed by fresh ones, so every draw is a deterministic function of one stream of
raw words whatever the buffer size.

Privacy (CKS, Proposition 5 and Theorem 15's proof): for integer vectors ``mu``, ``nu`` and
independent coordinates, ``D_alpha(N_Z(mu, sigma^2 I) || N_Z(nu, sigma^2 I)) <= alpha ||mu -
nu||_2^2 / (2 sigma^2)`` at every order, the continuous Gaussian's curve: a release ``q + Z``
of an integer vector ``q`` whose l2 sensitivity is at most ``Delta`` is ``alpha Delta^2 / (2
sigma^2)``-RDP (``tests/unit/mechanisms/test_discrete_gaussian.py`` checks the law and the curve).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numba import njit

from service.errors import InvalidParameter
from service.mechanisms.exact_bernoulli import (
    bernoulli_exp_kernel,
    bernoulli_exp_unit_kernel,
    bernoulli_ratio_kernel,
    bernoulli_scaled_kernel,
    mul_high_low,
    take_bits,
    uniform_below_kernel,
)
from service.privacy.discrete_gaussian import MAX_M, MAX_TAU

__all__ = ["discrete_gaussian"]

_OK = 0
_EXHAUSTED = 1
_OVERFLOW = 2

#: Raw words per draw the wrapper asks for at first (a draw reads about 4 on average).
_WORDS_PER_DRAW = 6
_MAX_CHUNK = 1 << 16

_Function = TypeVar("_Function", bound=Callable[..., Any])
_NJIT: Any = njit


def _jit(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False)(function)
    return compiled


def _jit_inline(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False, inline="always")(function)
    return compiled


@_jit_inline
def _bernoulli_exp_fraction(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, r: Any, t: Any, two_m: Any
) -> Any:  # pragma: no cover - compiled
    """Bernoulli(exp(-x)) for x = r / (t two_m) <= 1 (0 <= r < t): CKS Algorithm 1, K the first
    k >= 1 with Bernoulli(x / k) = 0, the result K odd; Bernoulli(x / k) is the product of the
    independent Bernoulli(r / t) and Bernoulli(1 / (two_m k))."""
    one = np.uint64(1)
    k = one
    while True:
        success = bernoulli_ratio_kernel(words, state, bits, r, t)
        if state[2] != _OK:
            return False
        if success:
            success = bernoulli_scaled_kernel(words, state, bits, one, two_m, k)
            if state[2] != _OK:
                return False
        if not success:
            return (k & one) == one
        k += one


@_jit
def _discrete_gaussian_kernel(
    words: np.ndarray,
    state: np.ndarray,
    bits: np.ndarray,
    m: Any,
    tau: Any,
    out: np.ndarray,
    done: Any,
) -> Any:  # pragma: no cover - compiled
    """Fill ``out[done:]`` with draws of N_Z(0, m 2^tau) (module docstring); returns how many
    are filled. On running out of words the unfinished draw is rewound (position and bit
    reservoir) and state[2] says so; on a guard, state[2] is _OVERFLOW."""
    zero = np.uint64(0)
    one = np.uint64(1)
    t = one << tau
    two_m = m + m
    v_limit = (one << np.uint64(63)) >> tau
    low_mask = t - one
    high_shift = np.uint64(64) - tau
    n = out.shape[0]
    i = done
    while i < n:
        position = state[0]
        left = state[1]
        reservoir = bits[0]
        value = np.int64(0)
        accepted = False
        while True:
            u = uniform_below_kernel(words, state, bits, t)
            if state[2] != _OK:
                break
            keep = bernoulli_exp_unit_kernel(words, state, bits, u, t)
            if state[2] != _OK:
                break
            if not keep:
                continue
            v = zero
            while True:
                more = bernoulli_exp_unit_kernel(words, state, bits, one, one)
                if state[2] != _OK or not more:
                    break
                v += one
                if v >= v_limit:
                    state[2] = _OVERFLOW
                    break
            if state[2] != _OK:
                break
            x = u + (v << tau)
            sign = take_bits(words, state, bits, 1)
            if state[2] != _OK:
                break
            if sign == one and x == zero:
                continue
            w = x - m if x >= m else m - x
            high, low = mul_high_low(w, w)
            if tau == zero:
                if high != zero:
                    state[2] = _OVERFLOW
                    break
                whole = low
                rest = zero
            else:
                if high >= t:
                    state[2] = _OVERFLOW
                    break
                whole = (high << high_shift) | (low >> tau)
                rest = low & low_mask
            accept = bernoulli_exp_kernel(words, state, bits, whole, two_m)
            if state[2] != _OK:
                break
            if not accept:
                continue
            accept = _bernoulli_exp_fraction(words, state, bits, rest, t, two_m)
            if state[2] != _OK:
                break
            if not accept:
                continue
            value = np.int64(x)
            if sign == one:
                value = -value
            accepted = True
            break
        if not accepted:
            if state[2] == _EXHAUSTED:
                state[0] = position
                state[1] = left
                bits[0] = reservoir
            return i
        out[i] = value
        i += 1
    return i


def _checked(m: object, tau: object) -> tuple[int, int]:
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or not 1 <= int(m) < MAX_M:
        raise InvalidParameter("m", f"must be an integer in [1, 2^62), got {m!r}")
    if isinstance(tau, bool) or not isinstance(tau, int | np.integer):
        raise InvalidParameter("tau", f"must be an integer, got {tau!r}")
    if not 0 <= int(tau) <= MAX_TAU:
        raise InvalidParameter("tau", f"must be in [0, {MAX_TAU}], got {tau}")
    return int(m), int(tau)


def discrete_gaussian(
    rng: np.random.Generator, m: int, tau: int, count: int, *, chunk: int | None = None
) -> np.ndarray:
    """``count`` independent draws of the discrete Gaussian N_Z(0, sigma^2), sigma^2 = ``m``
    2^``tau`` exactly, as int64 (module docstring). The only randomness is
    ``rng.bit_generator.random_raw``; ``chunk`` (tests only) is the raw words read at a time."""
    m, tau = _checked(m, tau)
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
        raise InvalidParameter("count", f"must be a non-negative integer, got {count!r}")
    out = np.empty(int(count), dtype=np.int64)
    if out.shape[0] == 0:
        return out
    size = chunk or max(64, min(_MAX_CHUNK, int(count) * _WORDS_PER_DRAW + 64))
    words = rng.bit_generator.random_raw(size)
    state = np.zeros(3, dtype=np.int64)
    bits = np.zeros(1, dtype=np.uint64)
    done = 0
    while True:
        done = int(
            _discrete_gaussian_kernel(
                words, state, bits, np.uint64(m), np.uint64(tau), out, np.int64(done)
            )
        )
        if state[2] == _OVERFLOW:
            raise OverflowError(
                "a discrete Gaussian draw left the 64-bit range (probability below e^-64)"
            )
        if done == out.shape[0]:
            return out
        kept = words[int(state[0]) :]
        words = np.concatenate([kept, rng.bit_generator.random_raw(size)])
        state[0] = 0
        state[2] = _OK
