"""Exact comparisons of lazily drawn uniforms given as raw 64-bit words (numba kernels).

A uniform ``U`` in [0, 1) is the binary expansion ``0.w1 w2 w3 ...`` of raw 64-bit words of a
stream, drawn only as far as a comparison needs, so ``w1 / 2^64 <= U < (w1 + 1) / 2^64``. Two
numbers whose first words differ are ordered by them; when the first words are equal nothing
is decided yet, and the comparison goes on with the SAME uniform's next word (each further tie
has probability ``2^-64``), never with a fresh uniform (which would bias the answer). The
kernels here are the rare paths of :mod:`service.mechanisms.exact_laplace`, none of which
depends on its rounding (``s``, ``t``): a uniform against an exact binary expansion held in a
table (:func:`threshold_tie`), two uniforms against each other (:func:`tie`, drawing further
words of both while they are equal), a uniform's words after its first against a rational
(:func:`carry`), and von Neumann's chain ``y 2^-m > u_1 > u_2 > ...`` of such comparisons past
a first gate of zero (:func:`von_neumann_chain`; the whole chain accepts a uniform ``y`` with
probability ``e^(-y / 2^m)``).
Every decision is an exact integer comparison. docs/privacy.md, "The Laplace sampler and its
stated delta", has the argument.

Each kernel reads words from ``words[pos:]`` and returns the position after the last word it
read and a status: :data:`OK` (decided), :data:`EXHAUSTED` (the buffer ran out), :data:`DEEP`
(a uniform needs more words than the scratch array holds) or :data:`DIGITS` (a threshold needs
more words than the table holds). On any status but ``OK`` the caller rewinds the whole draw
and draws it again from its first word, from the same words, with more of what ran out.
Compiled without numba's reference counting (``_nrt=False``): the kernels allocate nothing.
All integer arithmetic on words is in uint64 (numba would turn a uint64/int64 mix into
float64).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numba import njit

__all__ = [
    "DEEP",
    "DIGITS",
    "EXHAUSTED",
    "OK",
    "carry",
    "jit",
    "jit_inline",
    "next_gate",
    "threshold_tie",
    "tie",
    "von_neumann_chain",
]

# status codes the kernels return (exact_laplace's kernel keeps them in state[2]); 2 is left
# to the caller (exact_laplace's overflow of the integer part)
OK = 0
EXHAUSTED = 1
DEEP = 3
DIGITS = 4

_Function = TypeVar("_Function", bound=Callable[..., Any])
_NJIT: Any = njit


def jit(function: _Function) -> _Function:
    """numba's njit as the exact Laplace sampler's kernels use it: no GIL, cached on disk, no
    reference counting, numpy's error model."""
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False, error_model="numpy")(function)
    return compiled


def jit_inline(function: _Function) -> _Function:
    """:func:`jit`, and inlined into every kernel that calls it (numba's ``inline="always"``):
    one copy of a few lines the hot loop runs, at no call's cost."""
    compiled: _Function = _NJIT(
        nogil=True, cache=True, _nrt=False, error_model="numpy", inline="always"
    )(function)
    return compiled


@jit_inline
def next_gate(
    words: np.ndarray, pos: np.int64, reservoir: np.uint64, left: np.int64, m: np.uint64
) -> tuple[np.uint64, np.int64, np.uint64, np.int64, bool]:  # pragma: no cover
    """The next ``m`` bits of the reservoir of raw bits, a fresh word taken first when fewer
    than ``m`` are left (those are never read). Returns (the gate, position, reservoir, bits
    left, False when the words ran out before it)."""
    if left < np.int64(m):
        if pos >= words.shape[0]:
            return np.uint64(0), pos, reservoir, left, False
        reservoir = words[pos]
        pos += 1
        left = np.int64(64)
    gate = reservoir & ((np.uint64(1) << m) - np.uint64(1))
    return gate, pos, reservoir >> m, left - np.int64(m), True


@jit
def threshold_tie(
    words: np.ndarray, pos: np.int64, deeper: np.ndarray, i: np.int64
) -> tuple[bool, np.int64, np.int64]:  # pragma: no cover
    """The uniform's first word equals the first word of threshold ``i``: compare the
    uniform's further words (fresh ones) with the threshold's further words. Returns (uniform
    < threshold, position, status); ``DIGITS`` when the table holds too few words."""
    n = words.shape[0]
    for d in range(deeper.shape[1]):
        if pos >= n:
            return False, pos, np.int64(EXHAUSTED)
        word = words[pos]
        pos += 1
        digit = deeper[i, d]
        if word != digit:
            return word < digit, pos, np.int64(OK)
    return False, pos, np.int64(DIGITS)


@jit
def tie(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray, p: np.int64, p_depth: np.int64,
    c: np.int64,
) -> tuple[bool, np.int64, np.int64, np.int64, np.int64]:  # fmt: skip  # pragma: no cover
    """The new uniform (slot ``c``) equals the previous one (slot ``p``, ``p_depth`` words
    known) on the first word: compare their further words, drawing those not yet drawn.
    Word ``i >= 1`` of slot j is ``scratch[j, i - 1]``. Returns (new < previous, the new
    one's known words, the previous one's known words, position, status)."""
    cap = scratch.shape[1]
    n = words.shape[0]
    i = 1
    while True:
        if i > cap:
            return False, np.int64(0), p_depth, pos, np.int64(DEEP)
        if i >= p_depth:
            if pos >= n:
                return False, np.int64(0), p_depth, pos, np.int64(EXHAUSTED)
            scratch[p, i - 1] = words[pos]
            pos += 1
            p_depth = np.int64(i + 1)
        if pos >= n:
            return False, np.int64(0), p_depth, pos, np.int64(EXHAUSTED)
        new = words[pos]
        pos += 1
        scratch[c, i - 1] = new
        old = scratch[p, i - 1]
        if new != old:
            return new < old, np.int64(i + 1), p_depth, pos, np.int64(OK)
        i += 1


@jit
def carry(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray, y_depth: np.int64, low: np.uint64,
    two_t: np.uint64,
) -> tuple[bool, np.int64, np.int64]:  # fmt: skip  # pragma: no cover
    """Whether f = 0.w2 w3 ... (the words of a uniform y after its first: ``scratch[0]`` for
    the ``y_depth - 1`` already drawn, then fresh ones) is >= (2^64 - low) / (2t), given
    low > 2^64 - 2t (``2t`` below 2^53). Returns (the answer, position, status)."""
    n = words.shape[0]
    one = np.uint64(1)
    c = np.uint64(0) - low  # in (0, 2t): compare f with c / (2t)
    i = 1
    while True:
        if c == np.uint64(0):
            return True, pos, np.int64(OK)
        q = np.uint64(0)  # q, c = divmod(c 2^64, 2t), bit by bit (c < 2t < 2^53)
        for _ in range(64):
            c = c << one
            q = q << one
            if c >= two_t:
                c -= two_t
                q |= one
        if i < y_depth:
            w = scratch[0, i - 1]
        else:
            if pos >= n:
                return False, pos, np.int64(EXHAUSTED)
            w = words[pos]
            pos += 1
        if w != q:
            return w > q, pos, np.int64(OK)
        i += 1


#: (accepted, y's known words, position, reservoir, bits left, status)
_ChainResult = tuple[bool, np.int64, np.int64, np.uint64, np.int64, np.int64]


@jit
def von_neumann_chain(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray, y: np.uint64, reservoir: np.uint64,
    left: np.int64, m: np.uint64,
) -> _ChainResult:  # fmt: skip  # pragma: no cover
    """The uniform y (first word ``y``, its further words in ``scratch[0]``) whose first
    gate was all zero: von Neumann's chain ``y 2^-m > u_1 > u_2 > ...``, u_j = 2^-m (gate_j
    + v_j) with gate_j m bits of the reservoir and v_j a uniform of fresh words (slots 1, 2
    of the scratch alternate). u_j < u_(j-1) when gate_j is 0 and v_j < v_(j-1) (v_0 = y).
    Returns (accepted: the chain broke at an odd index, y's known words, position,
    reservoir, bits left, status)."""
    n_words = words.shape[0]
    y_depth = np.int64(1)
    previous = y  # first word of v_(j-1)
    p = np.int64(0)  # its scratch slot (0: y itself)
    p_depth = np.int64(1)
    odd = True  # the index j of the uniform being compared is odd (j = 1 here)
    while True:
        # gate_j was 0: compare v_j with v_(j-1)
        if pos >= n_words:
            return False, y_depth, pos, reservoir, left, np.int64(EXHAUSTED)
        word = words[pos]
        pos += 1
        if word > previous:
            return odd, y_depth, pos, reservoir, left, np.int64(OK)
        if word < previous:
            previous = word
            p = np.int64(1)
            p_depth = np.int64(1)
        else:
            c = np.int64(2) if p == 1 else np.int64(1)
            less, c_depth, p_depth, pos, status = tie(words, pos, scratch, p, p_depth, c)
            if status != OK:
                return False, y_depth, pos, reservoir, left, status
            if p == 0:
                y_depth = p_depth
            if not less:
                return odd, y_depth, pos, reservoir, left, np.int64(OK)
            p = c
            p_depth = c_depth
        odd = not odd  # u_j < u_(j-1): the chain goes on to u_(j+1)
        gate, pos, reservoir, left, drawn = next_gate(words, pos, reservoir, left, m)
        if not drawn:
            return False, y_depth, pos, reservoir, left, np.int64(EXHAUSTED)
        if gate != np.uint64(0):  # u_(j+1) >= 2^-m > u_j: the chain breaks at j + 1
            return odd, y_depth, pos, reservoir, left, np.int64(OK)
