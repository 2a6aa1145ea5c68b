"""Where the noise's randomness comes from, and the float64 Laplace sampler of the baselines.

Every release draws from a generator freshly seeded from the operating system's entropy
source (:func:`fresh_generator`). Nothing in the serving path accepts a seed; tests may pass
their own generator to the mechanism functions directly.

The served noise is drawn EXACTLY, from the generator's raw 64-bit words, by
:mod:`service.mechanisms.exact_laplace`: the count releases and DP-IE on their grids
(:func:`~service.mechanisms.exact_laplace.grid_laplace`), the noisy diffusion on its state grid
(:mod:`service.mechanisms.grid_noise`). :func:`laplace_noise` is the float64 sampler the
evaluation's baselines use (DP-PushFlowCap as the papers run it): ``b * S * E`` with ``S`` a
uniform random sign (bits of raw 64-bit words, 64 signs per word) and ``E`` numpy's float64
``standard_exponential`` (the ziggurat, whose tail beyond the last layer is sampled as
``r - log U``, so the tail is not truncated at 16.6 scales as a float32 ``-log U`` would be).
Its law is within a float64 lattice of Laplace, not exactly Laplace (docs/privacy.md, section 10).
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


def laplace_noise(rng: np.random.Generator, scale: float, count: int) -> np.ndarray:
    """``count`` i.i.d. Lap(scale) draws (``scale`` is the SCALE b, not a standard deviation).

    Draw order, for reproducibility with a given generator: ``count`` float64 standard
    exponentials, then ``ceil(count / 64)`` raw 64-bit words for the signs.
    """
    draws = rng.standard_exponential(count)
    signed_scale = np.array([scale, -scale], dtype=np.float64)
    draws *= signed_scale.take(random_signs(rng, count).view(np.uint8))
    return draws
