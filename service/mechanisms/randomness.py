"""Where the noise's randomness comes from, and how Laplace noise is drawn from it.

Every release draws from a generator freshly seeded from the operating system's entropy
source. Nothing in the serving path accepts a seed; tests may pass their own generator to the
mechanism functions directly.

Laplace draws are ``b * S * E`` with ``S`` a uniform random sign and ``E ~ Exp(1)``: the
density of ``S E`` is ``exp(-|x|) / 2``, the standard Laplace. ``E`` comes from numpy's
float64 ``standard_exponential`` (the ziggurat method, whose tail beyond the last layer is
sampled exactly as ``r - log U``), so the tail is not truncated. An exponential built as
``-log U`` from a float32 uniform would stop at ``-log 2^-24 = 16.6`` scales, a cut that tens of
thousands of draws per release reach with non-negligible probability; nothing here does that.
The signs are the bits of raw 64-bit words of the same generator, 64 signs per word.
"""

from __future__ import annotations

import numpy as np


def fresh_generator() -> np.random.Generator:
    """A new generator seeded with 128 bits from the OS entropy source (``secrets``)."""
    return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence()))


def sign_words(count: int) -> int:
    """Raw 64-bit words that carry ``count`` signs."""
    return (count + 63) // 64


def signs_from_words(words: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` signs carried by raw words: bit ``7 - t % 8`` of byte ``t // 8`` of
    the words as little-endian bytes (numpy's ``unpackbits`` order); True means negative."""
    bits = np.unpackbits(np.asarray(words, dtype="<u8").view(np.uint8), count=count)
    return bits.view(np.bool_)


def random_signs(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` independent booleans, True with probability 1/2 (True means negative)."""
    return signs_from_words(rng.bit_generator.random_raw(sign_words(count)), count)


def signed_pairs(exps: np.ndarray, words: np.ndarray, scale: float, n: int) -> np.ndarray:
    """xi1 + xi2 from 2n standard exponentials and their sign words: draw t is
    ``exps[t] * (-scale if sign t else scale)``, xi1 the first n draws, xi2 the next n."""
    signed_scale = np.array([scale, -scale], dtype=np.float64)
    draws = exps * signed_scale.take(signs_from_words(words, 2 * n).view(np.uint8))
    out: np.ndarray = draws[:n] + draws[n:]
    return out


def laplace_noise(rng: np.random.Generator, scale: float, count: int) -> np.ndarray:
    """``count`` i.i.d. Lap(scale) draws (``scale`` is the SCALE b, not a standard deviation).

    Draw order, for reproducibility with a given generator: ``count`` float64 standard
    exponentials, then ``ceil(count / 64)`` raw 64-bit words for the signs.
    """
    draws = rng.standard_exponential(count)
    signed_scale = np.array([scale, -scale], dtype=np.float64)
    draws *= signed_scale.take(random_signs(rng, count).view(np.uint8))
    return draws


def step_noise(rng: np.random.Generator, scale: float, n: int) -> np.ndarray:
    """xi1 + xi2 of one noisy diffusion step: two independent vectors of n Lap(scale) draws,
    drawn as one block of 2n (the first n are xi1)."""
    draws = laplace_noise(rng, scale, 2 * n)
    out: np.ndarray = draws[:n] + draws[n:]
    return out
