"""Where the noise's randomness comes from, and how the diffusion's Laplace noise is drawn.

Every release draws from a generator freshly seeded from the operating system's entropy
source. Nothing in the serving path accepts a seed; tests may pass their own generator to the
mechanism functions directly.

The count releases (``popular``, ``common_neighbours``, ``friends_of_friends``, ``blended``'s
counts) and DP-IE do NOT draw here: they draw exactly on their grid with
:func:`service.mechanisms.exact_laplace.grid_laplace` (raw words and integer comparisons only;
docs/privacy.md, "The Laplace sampler and its stated delta"). What follows is the float64
sampler the diffusion and PushFlowCap's evaluation baseline use.

Laplace draws are ``b * S * E`` with ``S`` a uniform random sign and ``E ~ Exp(1)``: the
density of ``S E`` is ``exp(-|x|) / 2``, the standard Laplace. ``E`` comes from numpy's
float64 ``standard_exponential`` (the ziggurat method, whose tail beyond the last layer is
sampled exactly as ``r - log U``), so the tail is not truncated. An exponential built as
``-log U`` from a float32 uniform would stop at ``-log 2^-24 = 16.6`` scales, a cut that tens of
thousands of draws per release reach with non-negligible probability; nothing here does that.
The signs are the bits of raw 64-bit words of the same generator, 64 signs per word.

:func:`draw_step_randomness` draws a step's exponentials and sign words; for the serving
generator (PCG64DXSM) it runs numpy's own ziggurat on an inlined copy of the generator, compiled
(``kernels.draw_kernel``): the same values and the same generator state afterwards as numpy's
calls, bit for bit, checked against numpy in each process before its first use.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from service.mechanisms.kernels import draw_kernel

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1


def fresh_generator() -> np.random.Generator:
    """A new generator seeded with 128 bits from the OS entropy source (``secrets``)."""
    return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence()))


def _pcg_draws(bit_generator: np.random.BitGenerator, exps: np.ndarray, words: np.ndarray) -> None:
    kernel = draw_kernel()
    assert kernel is not None
    with bit_generator.lock:  # as numpy's own calls hold it
        state = bit_generator.state
        inner = state["state"]
        words_state = np.array(
            [inner["state"] >> 64, inner["state"] & _MASK64, inner["inc"] >> 64,
             inner["inc"] & _MASK64],
            dtype=np.uint64,
        )  # fmt: skip
        kernel(words_state, exps, words)
        inner["state"] = (int(words_state[0]) << 64) | int(words_state[1])
        bit_generator.state = state


@functools.cache
def compiled_draws_match_numpy() -> bool:
    """Whether the compiled sampler reproduces numpy here: 2^17 exponentials (some from the
    ziggurat's rejection and tail branches), 64 words and the generator's next state, from a
    probe generator (not used for any noise)."""
    if draw_kernel() is None:  # pragma: no cover - numba is a dependency
        return False
    count = 1 << 17
    try:
        ours = np.random.Generator(np.random.PCG64DXSM(20261124))
        exps, words = np.empty(count), np.empty(64, dtype=np.uint64)
        _pcg_draws(ours.bit_generator, exps, words)
        theirs = np.random.Generator(np.random.PCG64DXSM(20261124))
        same = (
            np.array_equal(exps, theirs.standard_exponential(count))
            and np.array_equal(words, theirs.bit_generator.random_raw(64))
            and ours.bit_generator.state == theirs.bit_generator.state
        )
    except Exception:  # pragma: no cover - a numba/LLVM that cannot build it
        log.exception("the compiled PCG64DXSM sampler failed; numpy's is used")
        return False
    if not same:  # pragma: no cover - a numpy whose sampler differs from numba's copy
        log.warning("the compiled PCG64DXSM sampler differs from numpy's here; numpy's is used")
    return same


def draw_step_randomness(rng: np.random.Generator, exps: np.ndarray, words: np.ndarray) -> None:
    """``exps[:] = rng.standard_exponential(len(exps))``, then ``words[:] =
    rng.bit_generator.random_raw(len(words))`` (``exps`` float64, ``words`` uint64, both
    contiguous): the same values and the same generator state afterwards, from the compiled
    sampler when ``rng`` is a PCG64DXSM generator and the sampler matches numpy here."""
    bit_generator = rng.bit_generator
    if isinstance(bit_generator, np.random.PCG64DXSM) and compiled_draws_match_numpy():
        _pcg_draws(bit_generator, exps, words)
        return
    rng.standard_exponential(out=exps)
    words[:] = bit_generator.random_raw(words.shape[0])


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
