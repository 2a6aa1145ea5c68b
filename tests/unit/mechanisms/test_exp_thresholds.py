"""The thresholds of the exact Laplace sampler (service/mechanisms/exp_thresholds.py).

Every word the table holds is checked against the binary expansion of exp(-i / 2^m) computed
on its own, one word at a time from exp_neg_bounds (:func:`threshold_word`, which the sampler's
tests in test_exact_laplace.py use as their reference's thresholds too), at the table's usual
depth and at a deeper one; the first words strictly decrease; and the guide brackets every word
of every cell. The sampler's law with small and deliberately wrong tables is tested with the
sampler, in test_exact_laplace.py.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from service.mechanisms import exp_thresholds as et
from service.mechanisms.exact_bernoulli import exp_neg_bounds


@functools.cache
def threshold_word(i: int, m: int, d: int) -> int:
    """Word d (0 = the first) of the binary expansion of exp(-i / 2^m), computed on its own
    from exp_neg_bounds (not from the sampler's table)."""
    precision = 64 * (d + 1) + 64
    while True:
        lo, hi = exp_neg_bounds(Fraction(i, 1 << m), precision)
        shift = precision - 64 * (d + 1)
        if lo >> shift == hi >> shift:
            return (lo >> shift) & (2**64 - 1)
        precision *= 2


@functools.cache
def pair_sum_threshold_word(i: int, m: int, d: int) -> int:
    """Word d of the binary expansion of exp(-i / 2^m) (1 + i / 2^(m+1)), computed on its own
    from exp_neg_bounds (not from the sampler's table)."""
    precision = 64 * (d + 1) + 64
    factor, shift_out = (1 << (m + 1)) + i, m + 1
    while True:
        lo, hi = exp_neg_bounds(Fraction(i, 1 << m), precision)
        lo, hi = (lo * factor) >> shift_out, -((-hi * factor) >> shift_out)
        shift = precision - 64 * (d + 1)
        if lo >> shift == hi >> shift:
            return (lo >> shift) & (2**64 - 1)
        precision *= 2


@pytest.mark.parametrize("pair_sum", [False, True])
def test_the_table_is_the_binary_expansion_and_its_guide_brackets_every_word(
    pair_sum: bool,
) -> None:
    """For the exponential thresholds and the pair sum's (whose first words must also be
    exp(-x) (1 + x / 2) to float precision, a check of the formula itself)."""
    make = et.pair_sum_table if pair_sum else et.exp_table
    word = pair_sum_threshold_word if pair_sum else threshold_word
    table = make()
    m, length = table.fraction_bits, table.first.shape[0] - 1
    assert (m, length, table.pair_sum) == (et.FRACTION_BITS, et.TABLE_LENGTH, pair_sum)
    for i in (1, 2, 3, 63, 64, 500, length):
        assert int(table.first[i]) == word(i, m, 0)
        assert int(table.deeper[i, 0]) == word(i, m, 1)
        x = i / 2**m
        value = math.exp(-x) * (1 + x / 2 if pair_sum else 1)
        assert int(table.first[i]) / 2**64 == pytest.approx(value, rel=1e-14)
    deep = make(words=5)
    assert et.deeper_table(table).words == 4 and et.deeper_table(table).pair_sum == pair_sum
    for i in (1, 777, length):
        assert [int(w) for w in deep.deeper[i]] == [word(i, m, d) for d in (1, 2, 3, 4)]
    np.testing.assert_array_equal(deep.first, table.first)
    first = [int(w) for w in table.first[1:]]
    assert all(a > b for a, b in itertools.pairwise(first))
    ascending = first[::-1]
    shift = 64 - table.guide_bits
    for cell, packed in enumerate(table.guide.tolist()):
        lo, hi = packed & 0xFFFF, packed >> 16
        assert 0 <= lo <= hi <= length - 1
        for w in (cell << shift, ((cell + 1) << shift) - 1, (cell << shift) + 12345):
            if w >= first[-1]:
                above = length - bisect.bisect_right(ascending, w)
                assert lo <= above <= hi, (cell, w)
