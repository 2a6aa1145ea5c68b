"""A stream of raw 64-bit words stepped inside compiled code: numpy's SFC64 generator.

The diffusion's noise reads about 2.5 raw words a draw, and taking them from numpy's bit
generator (``random_raw``, a new array per call, filled through a function pointer a word) cost
a third of a noisy step's draws. Here the same generator's algorithm runs in numba: a stream is
its state, four uint64 words ``(a, b, c, counter)`` in an array, and :func:`fill_words` writes
its next words into a buffer, word for word the words numpy's ``SFC64`` bit generator at that
state returns from ``random_raw`` (the tests check both the words and the state after them).

SFC64 (Chris Doty-Humphrey's Small Fast Chaotic generator, 256 bits of state, one of numpy's
bit generators) passes PractRand and BigCrush; its counter guarantees a period of at least
2^64 words from any state. Like numpy's ``PCG64DXSM``, which seeds it, it is not a
cryptographic generator. A stream is seeded by three raw words of the query's own generator
(:func:`stream_from`): in the service that generator is seeded from the OS entropy source per
request (:func:`service.mechanisms.randomness.fresh_generator`), and a test's seeded generator
gives a reproducible stream. Seeding is numpy's own for SFC64 (the three words, the counter at
1, then :data:`SEED_ROUNDS` words discarded).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.mechanisms.exact_words import jit

__all__ = ["SEED_ROUNDS", "fill_words", "numpy_generator", "seeded", "stream_from"]

#: Words an SFC64 stream discards after it is seeded (numpy's ``sfc64_set_seed``).
SEED_ROUNDS = 12

_SHIFT_B = np.uint64(11)
_SHIFT_C = np.uint64(3)
_ROTATE = np.uint64(24)
_ROTATE_BACK = np.uint64(64 - 24)


@jit
def fill_words(state: Any, out: Any, start: np.int64) -> None:  # pragma: no cover - compiled
    """``out[start:]`` = the stream's next words; ``state`` is advanced past them."""
    a = state[0]
    b = state[1]
    c = state[2]
    counter = state[3]
    one = np.uint64(1)
    for i in range(start, out.shape[0]):
        word = a + b + counter
        counter += one
        a = b ^ (b >> _SHIFT_B)
        b = c + (c << _SHIFT_C)
        c = ((c << _ROTATE) | (c >> _ROTATE_BACK)) + word
        out[i] = word
    state[0] = a
    state[1] = b
    state[2] = c
    state[3] = counter


def seeded(seed_words: np.ndarray) -> np.ndarray:
    """A stream seeded by three words as numpy's SFC64 seeds itself: the words, the counter at
    1, then :data:`SEED_ROUNDS` words discarded."""
    seed = np.asarray(seed_words, dtype=np.uint64)
    if seed.shape != (3,):
        raise ValueError(f"an SFC64 stream is seeded by 3 words, got shape {seed.shape}")
    state = np.array([seed[0], seed[1], seed[2], 1], dtype=np.uint64)
    fill_words(state, np.empty(SEED_ROUNDS, dtype=np.uint64), np.int64(0))
    return state


def stream_from(rng: np.random.Generator) -> np.ndarray:
    """A new stream seeded by the next three raw words of ``rng``."""
    return seeded(rng.bit_generator.random_raw(3))


def numpy_generator(state: np.ndarray) -> np.random.Generator:
    """numpy's SFC64 generator at the stream's state (a copy: the stream does not advance):
    what the tests compare the compiled stream and the draws from it with."""
    bit_generator = np.random.SFC64()
    bit_generator.state = {
        "bit_generator": "SFC64",
        "state": {"state": np.array(state, dtype=np.uint64)},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return np.random.Generator(bit_generator)
