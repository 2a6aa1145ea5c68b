"""The exact samplers' compiled kernel (service/mechanisms/laplace_kernel.py) drawing the pair
sum M = round((L1 + L2) / gamma), L1, L2 independent Lap(1) (``rounded_laplace_pair_sum`` in
exact_laplace.py): the noisy diffusion's noise on its state grid. The same kernel's Laplace law
is tested in test_exact_laplace.py.

X = |L1 + L2| has density (1 + x) e^-x / 2 and survival F(x) = e^-x (1 + x / 2), so
P(|M| >= j) = F((j - 1/2) gamma) for j >= 1 and the sign is uniform. The law is checked by
chi-square tests against it (bins of equal mass at fine, coarse and unit gammas; the cells of
|M| and their eighths at gamma 2^-16 with tables of 2 fraction bits, where the remainder's
linear factor shows; the whole and fractional parts at gamma ~ 1e-9; small tables, so the tail
and its two continuations run), against numpy's round((L1 + L2) / gamma) by a two-sample test,
and against controls the same tests reject (a Laplace law of the same variance, the remainder
without its linear factor, the exponential thresholds). The kernel is checked to be the same
function of the word stream as the plain reference of test_exact_laplace.py, on random words
and on words that tie and sit on the ratio gates' boundaries, whatever the buffer, scratch and
table sizes. Over an SFC64 word stream (``streamed_kernel``, which refills its buffer itself:
the diffusion's noise) the draws are those of the buffered path from numpy's SFC64 at the
stream's state, whatever the buffer, with a deeper table when one runs out, clamped at the
saturation. Tests use seeded generators; the service never does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from service.errors import InvalidParameter
from service.mechanisms import exact_laplace as el
from service.mechanisms import exp_thresholds as et
from service.mechanisms import laplace_kernel
from service.mechanisms.exact_laplace import gamma_ratio, rounded_laplace_pair_sum
from service.mechanisms.word_stream import numpy_generator, stream_from
from tests.unit.mechanisms.test_exact_laplace import (
    THIRD,
    ScriptedWords,
    reference_draws,
    script_words,
)
from tests.unit.mechanisms.test_exp_thresholds import pair_sum_threshold_word


def survival(x: np.ndarray) -> np.ndarray:
    """P(|L1 + L2| >= x) = e^-x (1 + x / 2) for x >= 0."""
    x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
    out: np.ndarray = np.exp(-x) * (1.0 + x / 2.0)
    return out


def at_least(j: np.ndarray, gamma: float) -> np.ndarray:
    """P(|M| >= j) for integers j >= 0."""
    j = np.asarray(j, dtype=np.float64)
    out: np.ndarray = np.where(j <= 0, 1.0, survival((j - 0.5) * gamma))
    return out


def cdf(n: np.ndarray, gamma: float) -> np.ndarray:
    """P(M <= n) = P(L1 + L2 < (n + 1/2) gamma) for integers n."""
    x = (np.asarray(n, dtype=np.float64) + 0.5) * gamma
    out: np.ndarray = np.where(x < 0, survival(-x) / 2, 1.0 - survival(x) / 2)
    return out


def chi_square_pvalue(draws: np.ndarray, gamma: float, bins: int = 60) -> float:
    """Chi-square p-value of ``draws`` against the law of M on integer bins of about equal
    expected mass (upper edges from the continuous law's quantiles)."""
    grid = np.linspace(-45.0, 45.0, 400_001)
    continuous = np.where(grid < 0, survival(-grid) / 2, 1.0 - survival(grid) / 2)
    quantiles = np.interp(np.linspace(0, 1, bins + 1)[1:-1], continuous, grid) / gamma
    edges = np.unique(np.floor(quantiles).astype(np.int64))  # bin i: (edges[i-1], edges[i]]
    mass = np.diff(np.concatenate([[0.0], cdf(edges, gamma), [1.0]]))
    observed = np.bincount(np.searchsorted(edges, draws, side="left"), minlength=mass.size)
    keep = mass > 0
    assert observed[~keep].sum() == 0
    expected = mass[keep] / mass[keep].sum() * observed.sum()
    return float(stats.chisquare(observed[keep], expected).pvalue)


def fine_cells_pvalue(magnitude: np.ndarray, t: int, m: int, parts: int = 8) -> float:
    """At gamma = 1/t (t a multiple of 2^m parts): chi-square of (floor(2^m X), the eighth of
    its cell X falls in), X ~ |M| / t, for X < 4, and the rest: the shape inside a cell, where a
    remainder without its linear factor would show."""
    step = t // (2**m * parts)
    edges = np.arange(1, 4 * 2**m * parts + 1) * step  # cells [edges[i-1], edges[i])
    cells = np.bincount(np.searchsorted(edges, magnitude, side="right"), minlength=edges.size + 1)
    starts = np.concatenate([[0], edges])
    p = at_least(starts, 1 / t)
    p = np.append(-np.diff(p), p[-1])
    return float(stats.chisquare(cells, p / p.sum() * magnitude.size).pvalue)


def fill(
    seed: int, s: int, t: int, count: int, table: et.ExpTable | None = None, chunk: int = 4096
) -> np.ndarray:
    out = np.empty(count, dtype=np.int64)
    el._fill(np.random.default_rng(seed), s, t, out, chunk, table=table, pair_sum=True)
    return out


@pytest.mark.parametrize(
    ("s", "t"), [(1, 2**43), (1, 2**20), (1, 64), (65, 4096), (2, 3), (1, 1), (5, 2)]
)
def test_law_at_fine_coarse_and_unit_gammas(s: int, t: int) -> None:
    """Chi-square against the exact law at gamma 2^-43 (the diffusion's smallest), 2^-20, 2^-6
    (the last fine gamma), 65/4096 (the first coarse one), 2/3, 1 and 5/2; P(M = 0); the
    sign."""
    gamma, count = s / t, 400_000
    draws = rounded_laplace_pair_sum(np.random.default_rng(20261201 + s + t % 1000), s, t, count)
    assert draws.dtype == np.int64
    assert chi_square_pvalue(draws, gamma) > 1e-4
    p0 = 1.0 - float(survival(np.array(gamma / 2)))
    zeros = int(np.count_nonzero(draws == 0))
    assert abs(zeros - count * p0) < 6 * math.sqrt(count * p0 * (1 - p0)) + 1
    negative = int(np.count_nonzero(draws < 0))
    assert abs(negative - count * (1 - p0) / 2) < 6 * math.sqrt(count / 4)


@pytest.mark.parametrize(("m", "length"), [(2, 8), (2, 40), (et.FRACTION_BITS, 64)])
@pytest.mark.parametrize(("s", "t"), [(1, 2**16), (1, 3), (5, 2)])
def test_law_with_small_tables_takes_every_path(m: int, length: int, s: int, t: int) -> None:
    """Tables of 2 fraction bits (a chain in a quarter of the remainders, the linear factor
    in a fifth of them) and of few thresholds (the tail, X >= J / 2^m, with probability up
    to 2 e^-2, then the same law again or Exp(1)): the law is still exact, inside each cell
    too."""
    out = fill(m * 1000 + length + t, s, t, 300_000, et.pair_sum_table(m, length))
    assert chi_square_pvalue(out, s / t) > 1e-4
    if t == 2**16:
        assert fine_cells_pvalue(np.abs(out), t, m) > 1e-4


@pytest.mark.parametrize("m", [1, 2])
def test_inside_the_cells_the_remainder_has_its_linear_factor(m: int) -> None:
    """2,000,000 draws at gamma 2^-16 with tables of 1 and 2 fraction bits, by eighths of
    each cell below X = 4: the remainder's density on the cell z is (2^m + z + y) e^(-y / 2^m),
    and one a little off ((2^m + z + 2 + y), say) shows here."""
    t = 2**16
    out = fill(m + 77, 1, t, 2_000_000, et.pair_sum_table(m, 40))
    assert fine_cells_pvalue(np.abs(out), t, m) > 1e-4


def test_law_at_gamma_1e9_by_whole_and_fractional_part() -> None:
    """gamma = 1 / t, t ~ 1e9 (as on the diffusion's grids): |M| // t and the tenth of t that
    |M| mod t falls in, jointly, against the exact law."""
    s, t = gamma_ratio(2.0**-30, 2.0**-30 * 1_000_000_512)
    count = 400_000
    magnitude = np.abs(rounded_laplace_pair_sum(np.random.default_rng(3), s, t, count))
    whole = np.minimum(magnitude // t, 8)  # 8 means >= 8
    tenth = (magnitude % t) * 10 // t
    starts = np.array([q * t + (a * t + 9) // 10 for q in range(8) for a in range(10)])
    ends = np.array([q * t + ((a + 1) * t + 9) // 10 for q in range(8) for a in range(10)])
    p = at_least(starts, s / t) - at_least(ends, s / t)
    p = np.append(p, at_least(np.array([8 * t]), s / t))
    observed = np.bincount(np.where(whole == 8, 80, whole * 10 + tenth), minlength=81)
    assert stats.chisquare(observed, p / p.sum() * count).pvalue > 1e-4


def test_the_law_is_that_of_rounding_a_sum_of_two_laplace_draws() -> None:
    """g M against numpy's round_g(b L1 + b L2) by a two-sample test at gamma = 1/5."""
    grid, scale = 0.25, 1.25
    s, t = gamma_ratio(grid, scale)
    ours = rounded_laplace_pair_sum(np.random.default_rng(1), s, t, 200_000)
    rng = np.random.default_rng(2)
    theirs = np.round((rng.laplace(0, scale, 200_000) + rng.laplace(0, scale, 200_000)) / grid)
    values = np.union1d(ours, theirs)
    table = np.array(
        [np.bincount(np.searchsorted(values, x), minlength=values.size) for x in (ours, theirs)]
    )
    table = table[:, table.sum(axis=0) >= 20]
    assert stats.chi2_contingency(table).pvalue > 1e-4


def run_kernel(
    words: np.ndarray, s: int, t: int, count: int, table: et.ExpTable, pair_sum: bool
) -> tuple[np.ndarray, int]:
    """The kernel on one buffer of words, with any table and law flag (the controls): the
    draws and the words they read (s a power of two)."""
    tail = et.exp_table(table.fraction_bits, table.first.shape[0] - 1, table.guide_bits)
    out = np.empty(count, dtype=np.int64)
    state = np.zeros(3, dtype=np.int64)
    done = laplace_kernel.rounded_laplace_kernel(
        words, state, np.zeros(1, dtype=np.uint64), np.zeros((3, 8), dtype=np.uint64),
        table.first, table.deeper, table.guide, tail.first, tail.deeper, tail.guide,
        np.uint64(table.fraction_bits), np.uint64(64 - table.guide_bits), np.uint64(s),
        np.uint64(t), np.int64((2 * s).bit_length() - 1), (s << table.fraction_bits) > t,
        np.uint64(el._max_k(s, t)), pair_sum, out, np.int64(0),
    )  # fmt: skip
    assert done == count and state[2] == 0
    return out, int(state[0])


def test_controls_are_rejected_by_the_same_tests() -> None:
    """A Laplace law of the same variance (scale sqrt 2), the pair sum's thresholds with a
    remainder that lacks its linear factor, and the pair sum's remainder on the exponential
    thresholds are each rejected; the right sampler passes the same tests."""
    count = 300_000
    t = 2**16
    words = np.random.PCG64(9).random_raw(4 * count)
    # round(L / gamma') with 1 / gamma' = round(sqrt(2) t): sqrt(2) L in units of 1 / t
    laplace = el.rounded_laplace(np.random.default_rng(8), 1, round(math.sqrt(2) * t), count)
    assert chi_square_pvalue(laplace, 1 / t) < 1e-6
    small = et.pair_sum_table(2, 40)
    no_linear, _ = run_kernel(words, 1, t, count, small, pair_sum=False)
    assert fine_cells_pvalue(np.abs(no_linear), t, 2) < 1e-6
    exponential, _ = run_kernel(words, 1, t, count, et.exp_table(2, 40), pair_sum=True)
    assert chi_square_pvalue(exponential, 1 / t) < 1e-6
    right, _ = run_kernel(words, 1, t, count, small, pair_sum=True)
    assert chi_square_pvalue(right, 1 / t) > 1e-4
    assert fine_cells_pvalue(np.abs(right), t, 2) > 1e-4


@pytest.mark.parametrize(("s", "t"), [(1, 1_000_000_512), (1, 256), (5, 2), (1, 2**43), (65, 4096)])
def test_the_kernel_is_the_reference_on_random_words(s: int, t: int) -> None:
    words = np.random.PCG64(s * 31 + t % 1000).random_raw(30_000).tolist()
    ours = el.rounded_laplace_pair_sum(ScriptedWords(words, 0), s, t, 6000)  # type: ignore[arg-type]
    assert ours.tolist() == reference_draws(words, s, t, 6000, pair_sum=True)


def gate_words() -> list[int]:
    """Words whose 16-bit parts sit on the ratio gates' boundaries: h = 1008 against 1 / 65
    (the linear factor of the cell z = 0) and h = 5957 against 128 / 1408 (the tail's
    continuation), and the first words of the rationals the further words are compared with
    (16 / 65 and 9 / 11), so that the comparison goes on past them."""
    return [
        0x03F0_03F0_03F0_03F0,
        0x1745_1745_1745_1745,
        (16 << 64) // 65,
        ((16 << 64) // 65) + 1,
        (9 << 64) // 11,
        ((9 << 64) // 11) - 1,
    ]


def pair_tie_alphabet() -> list[int]:
    """Words that tie with each other and with the pair sum's thresholds (first and second
    words), zero gates, U past the table (0), U in the cell z = 0 (2^64 - 1), and the gate
    words above."""
    m = et.FRACTION_BITS
    picks = [1, 2, 64, 700, et.TABLE_LENGTH - 1, et.TABLE_LENGTH]
    firsts = [pair_sum_threshold_word(i, m, 0) for i in picks]
    seconds = [pair_sum_threshold_word(i, m, 1) for i in picks]
    return [0, 1, 2**63, 2**64 - 1, THIRD, THIRD + 1, 2**64 - 2, *firsts,
            *(w + 1 for w in firsts), *seconds, *gate_words()]  # fmt: skip


@pytest.mark.parametrize("scratch", [1, 2, el._SCRATCH_WORDS])
@pytest.mark.parametrize(("s", "t"), [(1, 3), (1, 2**20), (1, 1_000_000_512), (65, 4096)])
def test_the_kernel_is_the_reference_when_words_tie(scratch: int, s: int, t: int) -> None:
    """Every rare path (ties several words deep, past a one-word table; chains; the linear
    factor's gate decided by further words, then u against y; the tail and its ratio gate;
    the exponential thresholds after it), against the reference, whatever the buffer, scratch
    and table sizes."""
    words = script_words(pair_tie_alphabet(), 80_000, s * 100 + t % 97 + scratch)
    expected = reference_draws(words, s, t, 1500, pair_sum=True)
    for chunk, table in ((3, et.pair_sum_table(words=1)), (64, None), (4096, None)):
        out = np.empty(1500, dtype=np.int64)
        stub: np.random.Generator = ScriptedWords(words, 0)  # type: ignore[assignment]
        el._fill(stub, s, t, out, chunk, scratch=scratch, table=table, pair_sum=True)
        assert out.tolist() == expected
    assert len({abs(x) for x in expected}) > 10  # not a degenerate stream


def test_the_table_must_be_of_the_law_drawn() -> None:
    out = np.empty(4, dtype=np.int64)
    with pytest.raises(ValueError, match="law"):
        el._fill(np.random.default_rng(1), 1, 3, out, 64, table=et.exp_table(), pair_sum=True)


@pytest.mark.parametrize(("s", "t"), [(1, 2**43), (1, 256)])
def test_words_per_draw(s: int, t: int) -> None:
    """About 2.4 raw words a draw at the diffusion's gammas: one draw for two Laplace draws
    (2.1 words each)."""
    count = 100_000
    words = np.random.PCG64(5).random_raw(5 * count)
    _, read = run_kernel(words, s, t, count, et.pair_sum_table(), pair_sum=True)
    assert 2.2 < read / count < 2.5, read / count


# --- the kernel over an SFC64 word stream (streamed_kernel, pair_sum_from_stream) -----------


def buffered(stream: np.ndarray, s: int, t: int, count: int, pair_sum: bool, **kwargs: object):  # type: ignore[no-untyped-def]
    """The draws of the buffered path (random_raw chunks) from numpy's SFC64 generator at the
    stream's state."""
    out = np.empty(count, dtype=np.int64)
    el._fill(numpy_generator(stream), s, t, out, 4096, pair_sum=pair_sum, **kwargs)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("pair_sum", [True, False])
@pytest.mark.parametrize(("s", "t"), [(1, 2**43), (1, 11_274_289_152), (65, 4096), (1, 1), (5, 2)])
def test_streamed_draws_are_the_generators_draws(pair_sum: bool, s: int, t: int) -> None:
    """From an SFC64 stream the kernel refills its buffer itself, keeping an unfinished draw's
    words: the draws are those the buffered path makes from numpy's SFC64 at the stream's
    state, whatever the buffer (with 1 or 2 words every draw outgrows it and comes back for a
    larger one)."""
    for buffer in (1, 2, 3, 8, 64, el._STREAM_BUFFER):
        stream = stream_from(np.random.default_rng(buffer * 7 + t % 1000 + s))
        expected = buffered(stream, s, t, 3000, pair_sum)
        out = np.empty(3000, dtype=np.int64)
        el._fill(stream, s, t, out, buffer, pair_sum=pair_sum)
        assert out.tolist() == expected.tolist(), buffer
    assert len(set(expected.tolist())) > 4  # not a degenerate stream (9 values at gamma 5/2)


def stream_starting_with(word: int, seed: int) -> np.ndarray:
    """An SFC64 state whose first word is ``word`` (the word is a + b + counter)."""
    b, c, counter = np.random.default_rng(seed).integers(0, 2**63, size=3).tolist()
    a = (word - b - counter) % 2**64
    return np.array([a, b, c, counter], dtype=np.uint64)


def count_deepened_tables(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """A list that records, each time a draw asks for a deeper table, how many words past its
    first the table it deepens holds."""
    deepened: list[int] = []
    deeper = et.deeper_table

    def counted(table: et.ExpTable) -> et.ExpTable:
        deepened.append(table.deeper.shape[1])
        return deeper(table)

    monkeypatch.setattr(el, "deeper_table", counted)
    return deepened


def test_a_streamed_draw_past_the_tables_words_gets_a_deeper_table(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A first word equal to a threshold's first word, with a one-word table: the draw comes
    back for a deeper table and is drawn again from the same words, as on the buffered path."""
    deepened = count_deepened_tables(monkeypatch)
    table = et.pair_sum_table(words=1)
    for i in (1, 64, et.TABLE_LENGTH - 1):
        stream = stream_starting_with(pair_sum_threshold_word(i, et.FRACTION_BITS, 0), i)
        expected = buffered(stream, 1, 2**20, 50, True, table=table)
        deepened.clear()
        out = np.empty(50, dtype=np.int64)
        el._fill(stream, 1, 2**20, out, el._STREAM_BUFFER, table=table, pair_sum=True)
        assert deepened, "the first word did not tie with the threshold"
        assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("saturation", [0, 1, 5, 2**40])
def test_streamed_draws_are_clamped_at_the_saturation(saturation: int) -> None:
    stream = stream_from(np.random.default_rng(saturation))
    expected = buffered(stream, 1, 64, 20_000, True)
    out = np.empty(20_000, dtype=np.int64)
    el.pair_sum_from_stream(stream, 1, 64, out, saturation)
    assert out.tolist() == np.clip(expected, -saturation, saturation).tolist()


def test_the_stream_and_saturation_are_checked_and_only_streamed_draws_are_clamped() -> None:
    out = np.empty(4, dtype=np.int64)
    stream = stream_from(np.random.default_rng(1))
    for bad in (-1, 2**63):
        with pytest.raises(InvalidParameter, match="saturation"):
            el.pair_sum_from_stream(stream, 1, 64, out, bad)
    with pytest.raises(ValueError, match="SFC64"):
        el._fill(np.random.default_rng(1), 1, 3, out, 64, pair_sum=True, saturation=5)
    for not_a_stream in (np.random.default_rng(1), stream.astype(np.int64), stream[:3]):
        with pytest.raises(InvalidParameter, match="stream"):
            el.pair_sum_from_stream(not_a_stream, 1, 64, out, 5)  # type: ignore[arg-type]


def test_the_stream_moves_on_along_its_own_words() -> None:
    """After a call the stream is its own sequence, further on than every word the draws read
    (at least two a draw here): later draws never reuse a word."""
    stream = stream_from(np.random.default_rng(3))
    reference = numpy_generator(stream)
    out = np.empty(1000, dtype=np.int64)
    el.pair_sum_from_stream(stream, 1, 2**43, out, 2**62)
    moved = 0
    while not np.array_equal(reference.bit_generator.state["state"]["state"], stream):
        reference.bit_generator.random_raw(1)
        moved += 1
        assert moved <= 20 * out.shape[0], "the stream left its own sequence"
    assert moved >= 2 * out.shape[0]


@pytest.mark.parametrize(("s", "t"), [(1, 2**43), (5, 2)])
def test_streamed_law_at_a_fine_and_a_coarse_gamma(s: int, t: int) -> None:
    """The law, drawn the way the diffusion draws it: chi-square at gamma 2^-43 and 5/2."""
    draws = np.empty(300_000, dtype=np.int64)
    el.pair_sum_from_stream(stream_from(np.random.default_rng(t % 977)), s, t, draws, 2**62)
    assert chi_square_pvalue(draws, s / t) > 1e-4


# --- several columns in one call (streamed_columns_kernel, pair_sums_from_streams) -----------


def column_streams(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([stream_from(rng) for _ in range(count)])


@pytest.mark.parametrize(("s", "t"), [(1, 2**43), (1, 11_274_289_152), (65, 4096), (5, 2)])
def test_columns_in_one_call_are_the_calls_a_column(s: int, t: int) -> None:
    """Each column's draws, clamped, and where its stream moved on, are those of
    pair_sum_from_stream on that stream alone, whatever the order of the rows they go to."""
    streams = column_streams(7, t % 1000 + s)
    alone = streams.copy()
    rows = np.array([4, 0, 6, 2, 8, 1, 3], dtype=np.int64)
    saturation = max(2, 3 * t // s)  # three scales: some draws of every gamma are clamped
    out = np.full((9, 2000), -7, dtype=np.int64)
    el.pair_sums_from_streams(streams, s, t, out, rows, saturation)
    for c, row in enumerate(rows):
        expected = np.empty(2000, dtype=np.int64)
        el.pair_sum_from_stream(alone[c], s, t, expected, saturation)
        assert out[row].tolist() == expected.tolist(), c
    assert np.array_equal(streams, alone)
    assert (out[[5, 7]] == -7).all()  # rows no column names are left alone
    assert len(set(out[rows].ravel().tolist())) > 4
    assert (np.abs(out[rows]) == saturation).any()


@pytest.mark.parametrize("buffer", [1, 2, 3, 8])
def test_a_column_that_outgrows_the_buffer_is_finished_as_alone(buffer: int) -> None:
    """With 1 to 8 words of buffer most draws need more words than it holds: the kernel stops
    in that column, which is finished on its own path, and the next columns go on in one
    call; the draws and streams are those of the buffered path column by column."""
    streams = column_streams(3, buffer)
    alone = streams.copy()
    out = np.empty((3, 300), dtype=np.int64)
    el.pair_sums_from_streams(streams, 1, 2**43, out, np.arange(3), 2**62, buffer=buffer)
    for c in range(3):
        expected = np.empty(300, dtype=np.int64)
        el._fill(alone[c], 1, 2**43, expected, buffer, pair_sum=True, saturation=2**62)
        assert out[c].tolist() == expected.tolist(), c
    assert np.array_equal(streams, alone)


def test_a_column_past_the_tables_words_gets_a_deeper_table_alone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A column whose first word ties with a threshold of a one-word table comes back for a
    deeper table for itself; the columns after it start again from the one-word table."""
    deepened = count_deepened_tables(monkeypatch)
    table = et.pair_sum_table(words=1)
    tie = stream_starting_with(pair_sum_threshold_word(64, et.FRACTION_BITS, 0), 64)
    streams = np.stack([column_streams(1, 9)[0], tie, tie.copy()])
    alone = streams.copy()
    out = np.empty((3, 50), dtype=np.int64)
    el.pair_sums_from_streams(streams, 1, 2**20, out, np.arange(3), 2**62, table=table)
    # each tying column deepens the one-word table (no word past its first) for itself
    assert deepened == [0, 0]
    for c in range(3):
        expected = buffered(alone[c], 1, 2**20, 50, True, table=table)
        assert out[c].tolist() == expected.tolist(), c


def test_columns_in_one_call_check_their_arguments() -> None:
    streams = column_streams(2, 1)
    out = np.zeros((2, 5), dtype=np.int64)
    rows = np.arange(2)
    for bad_streams in (streams[:, :3], streams.astype(np.int64), streams[0], streams.T.copy()):
        with pytest.raises(InvalidParameter, match="streams"):
            el.pair_sums_from_streams(bad_streams, 1, 64, out, rows, 5)
    for bad_out in (out.astype(np.int32), out[0]):
        with pytest.raises(InvalidParameter, match="out"):
            el.pair_sums_from_streams(streams, 1, 64, bad_out, rows, 5)
    for bad_rows in (np.array([0, 2]), np.array([-1, 0]), np.arange(3), rows.astype(np.int32)):
        with pytest.raises(InvalidParameter, match="rows"):
            el.pair_sums_from_streams(streams, 1, 64, out, bad_rows, 5)
    with pytest.raises(InvalidParameter, match="saturation"):
        el.pair_sums_from_streams(streams, 1, 64, out, rows, -1)
    with pytest.raises(InvalidParameter, match="gamma"):
        el.pair_sums_from_streams(streams, 1, 2**51, out, rows, 5)
    before = streams.copy()
    el.pair_sums_from_streams(streams, 1, 64, np.zeros((2, 0), dtype=np.int64), rows, 5)
    assert np.array_equal(streams, before), "no draw to make: no stream moves, as alone"
