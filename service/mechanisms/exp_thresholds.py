"""The thresholds of the exact Laplace sampler: exact binary expansions of ``exp(-i / 2^m)``
(and of ``exp(-i / 2^m) (1 + i / 2^(m+1))``, for the sum of two Laplace draws), by integer
interval arithmetic, and the guide to them.

:mod:`service.mechanisms.exact_laplace` draws ``z = floor(2^m E)``, ``E ~ Exp(1)``, by
inversion of one uniform ``U`` against the thresholds ``T_i = exp(-i / 2^m)``, i = 1..J
(``m = FRACTION_BITS``, ``J = TABLE_LENGTH``). A threshold is held as the first words of its
exact binary expansion ``0.f1 f2 f3 ...`` (64-bit words), never as an approximation:
:func:`threshold_words` takes integer bounds ``lo <= 2^p exp(-1 / 2^m) <= hi``
(:func:`service.mechanisms.exact_bernoulli.exp_neg_bounds`) and their powers rounded outward
(``lo`` down, ``hi`` up), which bound every ``2^p T_i``, at a precision ``p`` doubled until the
bounds of every ``T_i`` agree on every word held; each ``T_i`` is irrational
(Lindemann-Weierstrass), so they always do in the end, and each word held is a digit of
``T_i``. A draw that needs more words of a threshold than a table holds asks for a table twice
as deep (:func:`exp_table` with more ``words``).

The guide, indexed by a word's top ``GUIDE_BITS`` bits, gives the range of thresholds every
word of that cell lies between; it only chooses which comparisons a draw makes, never their
answer. The first words of the thresholds are strictly decreasing (:func:`table_from` refuses
a table where they are not), so a word ties with at most one threshold. docs/privacy.md, "The
Laplace sampler and its stated delta", has the whole argument.

The pair-sum table (:func:`pair_sum_table`) holds ``T_i = exp(-i / 2^m) (1 + i / 2^(m+1))``,
``P(X >= i / 2^m)`` for ``X = |L1 + L2|``, L1, L2 independent Lap(1) (X has density ``(1 + x)
e^-x / 2``): the same bounds of ``2^p exp(-i / 2^m)`` times the integer ``2^(m+1) + i``, shifted
right by ``m + 1`` bits (``lo`` rounded down, ``hi`` up), so they bound ``2^p T_i``; ``T_i`` is a
rational multiple of an irrational, irrational too, and the same argument gives its digits.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from service.mechanisms.exact_bernoulli import exp_neg_bounds

__all__ = [
    "FRACTION_BITS",
    "GUIDE_BITS",
    "TABLE_LENGTH",
    "TABLE_WORDS",
    "ExpTable",
    "deeper_table",
    "exp_table",
    "pair_sum_table",
    "table_from",
    "threshold_words",
]

_U64_MAX = (1 << 64) - 1

#: E ~ Exp(1) is drawn as z = floor(2^FRACTION_BITS E) and a remainder (exact_laplace).
FRACTION_BITS = 6
#: Thresholds in the table: z below TABLE_LENGTH is read from one uniform, at or above it
#: (probability e^-20 = 2.1e-9) the draw adds TABLE_LENGTH and reads a fresh uniform.
TABLE_LENGTH = 20 << FRACTION_BITS
#: Top bits of a uniform's first word that index the guide to the table.
GUIDE_BITS = 11
#: Words of each threshold's binary expansion the table holds at first (doubled on demand).
TABLE_WORDS = 2


@dataclass(frozen=True)
class ExpTable:
    """The thresholds ``T_i = exp(-i / 2^m)``, i = 0..J, as exact binary expansions, and the
    guide to them. ``first[i]`` is the first word of ``T_i`` (``floor(T_i 2^64)``; ``first[0]``,
    for ``T_0 = 1``, is never read), ``deeper[i, d]`` its word ``d + 2``; ``guide[c]`` packs
    ``lo + (hi << 16)``: every word ``w`` with ``w >> (64 - guide_bits) == c`` and ``w >=
    first[J]`` has ``lo <= #{i in 1..J: first[i] > w} <= hi``."""

    fraction_bits: int  # m
    first: np.ndarray  # uint64[J + 1]
    deeper: np.ndarray  # uint64[J + 1, words - 1]
    guide: np.ndarray  # int32[2^guide_bits]
    guide_bits: int
    pair_sum: bool = False  # the thresholds of |L1 + L2| (pair_sum_table), not of Exp(1)

    @property
    def words(self) -> int:
        return int(self.deeper.shape[1]) + 1


def threshold_words(
    fraction_bits: int, length: int, words: int, pair_sum: bool = False
) -> list[list[int]]:
    """The first ``words`` 64-bit words of the binary expansions of ``T_i = exp(-i / 2^m)``,
    i = 1..J: integer bounds ``lo_i <= 2^p T_i <= hi_i`` (``exp_neg_bounds`` for ``T_1``, then
    ``T_i = T_(i-1) T_1`` rounded outward), at a precision doubled until the bounds of every
    ``T_i`` agree on all those words (each ``T_i`` is irrational: they always do in the end).
    ``pair_sum``: of ``T_i (2^(m+1) + i) / 2^(m+1)`` instead (the bounds times ``2^(m+1) + i``,
    shifted right outward)."""
    bits = 64 * words
    precision = bits + 64
    half = fraction_bits + 1
    while True:
        lo_1, hi_1 = exp_neg_bounds(Fraction(1, 1 << fraction_bits), precision)
        lo, hi = lo_1, hi_1
        shift = precision - bits
        expansions = []
        for i in range(1, length + 1):
            if i > 1:
                lo = (lo * lo_1) >> precision
                hi = -((-(hi * hi_1)) >> precision)
            low, high = lo, hi
            if pair_sum:
                low = (lo * ((1 << half) + i)) >> half
                high = -((-(hi * ((1 << half) + i))) >> half)
            if low >> shift != high >> shift:
                break  # pragma: no cover - the first precision settles every table entry
            value = low >> shift  # floor(T_i 2^bits): T_i < 1
            expansions.append([(value >> (64 * (words - 1 - d))) & _U64_MAX for d in range(words)])
        if len(expansions) == length:
            return expansions
        precision *= 2  # pragma: no cover


@lru_cache(maxsize=16)
def exp_table(
    fraction_bits: int = FRACTION_BITS, length: int = TABLE_LENGTH, guide_bits: int = GUIDE_BITS,
    words: int = TABLE_WORDS,
) -> ExpTable:  # fmt: skip
    """The table for ``m = fraction_bits``, ``J = length`` thresholds, ``words`` words each."""
    _check_parameters(fraction_bits, length, guide_bits)
    return table_from(fraction_bits, threshold_words(fraction_bits, length, words), guide_bits)


@lru_cache(maxsize=16)
def pair_sum_table(
    fraction_bits: int = FRACTION_BITS, length: int = TABLE_LENGTH, guide_bits: int = GUIDE_BITS,
    words: int = TABLE_WORDS,
) -> ExpTable:  # fmt: skip
    """The table of ``T_i = exp(-i / 2^m) (1 + i / 2^(m+1)) = P(|L1 + L2| >= i / 2^m)``."""
    _check_parameters(fraction_bits, length, guide_bits)
    expansions = threshold_words(fraction_bits, length, words, pair_sum=True)
    return table_from(fraction_bits, expansions, guide_bits, pair_sum=True)


def deeper_table(table: ExpTable) -> ExpTable:
    """The same table (same law, thresholds and guide) holding twice as many words of each
    threshold."""
    make = pair_sum_table if table.pair_sum else exp_table
    return make(table.fraction_bits, table.first.shape[0] - 1, table.guide_bits, 2 * table.words)


def _check_parameters(fraction_bits: int, length: int, guide_bits: int) -> None:
    if not (1 <= fraction_bits <= 10 and 1 <= length < 1 << 15 and 1 <= guide_bits <= 16):
        raise ValueError("table parameters out of range")


def table_from(
    fraction_bits: int, expansions: list[list[int]], guide_bits: int, pair_sum: bool = False
) -> ExpTable:
    """The table of the thresholds whose expansions (words, first first) are given, i = 1..J,
    and its guide (tests build deliberately wrong tables with it)."""
    length = len(expansions)
    words = len(expansions[0])
    first = np.array([_U64_MAX] + [e[0] for e in expansions], dtype=np.uint64)
    deeper = np.zeros((length + 1, words - 1), dtype=np.uint64)
    for i, expansion in enumerate(expansions, start=1):
        deeper[i, :] = expansion[1:]
    below = first[1:]
    if not (np.all(below[:-1] > below[1:]) and below[-1] > 0):
        # strictly decreasing first words: a word ties with at most one threshold
        raise ValueError("thresholds share a first word: use fewer fraction bits")
    ascending = below[::-1]
    shift = 64 - guide_bits
    cells = np.arange(1 << guide_bits, dtype=np.uint64)
    smallest = cells << np.uint64(shift)
    largest = smallest | np.uint64((1 << shift) - 1)
    # #{i: first[i] > w} = J - #{i: first[i] <= w}, decreasing in w
    lo = np.minimum(length - np.searchsorted(ascending, largest, side="right"), length - 1)
    hi = np.minimum(length - np.searchsorted(ascending, smallest, side="right"), length - 1)
    hi = np.maximum(hi, lo)  # (cells wholly below first[J]: only indices kept in range)
    guide = (lo + (hi << 16)).astype(np.int32)
    for array in (first, deeper, guide):
        array.flags.writeable = False  # shared by every draw (and thread): never written
    return ExpTable(fraction_bits, first, deeper, guide, guide_bits, pair_sum)
