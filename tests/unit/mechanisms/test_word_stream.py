"""The compiled SFC64 word stream (service/mechanisms/word_stream.py) is numpy's SFC64, word for
word: the words, the state after them, and the seeding. Tests use seeded generators; the service
never does."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.word_stream import (
    SEED_ROUNDS,
    fill_words,
    numpy_generator,
    seeded,
    stream_from,
)


def numpy_state(generator: np.random.Generator) -> np.ndarray:
    state: np.ndarray = generator.bit_generator.state["state"]["state"]
    return state


@pytest.mark.parametrize("entropy", [0, 1, 20261201, 2**127 + 12345])
def test_seeding_is_numpys(entropy: int) -> None:
    """Three words, the counter at 1, 12 words discarded: numpy's SFC64 seeded by the same
    SeedSequence has the same state."""
    words = np.random.SeedSequence(entropy).generate_state(3, dtype=np.uint64)
    ours = seeded(words)
    theirs = np.random.SFC64(np.random.SeedSequence(entropy))
    np.testing.assert_array_equal(ours, theirs.state["state"]["state"])
    assert SEED_ROUNDS == 12


@pytest.mark.parametrize(("start", "size"), [(0, 1), (0, 1000), (7, 8), (100, 5000), (3, 3)])
def test_words_and_state_are_numpys(start: int, size: int) -> None:
    stream = stream_from(np.random.default_rng(start * 1000 + size))
    reference = numpy_generator(stream)
    out = np.full(size, 99, dtype=np.uint64)
    fill_words(stream, out, np.int64(start))
    np.testing.assert_array_equal(out[:start], np.full(start, 99, dtype=np.uint64))
    np.testing.assert_array_equal(out[start:], reference.bit_generator.random_raw(size - start))
    np.testing.assert_array_equal(stream, numpy_state(reference))


def test_the_counter_and_the_state_wrap_as_uint64() -> None:
    """Words near 2^64 in every part of the state, the counter about to wrap."""
    top = np.uint64(2**64 - 1)
    stream = np.array([top, top - np.uint64(5), top, top - np.uint64(1)], dtype=np.uint64)
    reference = numpy_generator(stream)
    out = np.empty(64, dtype=np.uint64)
    fill_words(stream, out, np.int64(0))
    np.testing.assert_array_equal(out, reference.bit_generator.random_raw(64))
    np.testing.assert_array_equal(stream, numpy_state(reference))


def test_numpy_generator_leaves_the_stream_where_it_is() -> None:
    stream = stream_from(np.random.default_rng(5))
    before = stream.copy()
    numpy_generator(stream).bit_generator.random_raw(10)
    np.testing.assert_array_equal(stream, before)


def test_a_stream_is_seeded_by_the_next_three_words_of_its_generator() -> None:
    rng = np.random.default_rng(8)
    again = np.random.default_rng(8)
    np.testing.assert_array_equal(stream_from(rng), seeded(again.bit_generator.random_raw(3)))
    # the generator moved on: the next stream is another one
    assert not np.array_equal(stream_from(rng), stream_from(np.random.default_rng(8)))


def test_fresh_generators_give_distinct_streams() -> None:
    from service.mechanisms.randomness import fresh_generator

    streams = {tuple(stream_from(fresh_generator()).tolist()) for _ in range(50)}
    assert len(streams) == 50


def test_seeded_refuses_other_than_three_words() -> None:
    with pytest.raises(ValueError, match="3 words"):
        seeded(np.zeros(4, dtype=np.uint64))
