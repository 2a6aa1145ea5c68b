"""The stored form of released results (``zlib:lengths+utf8+f64planes``), the older forms it
still reads, and the UTF-8 id columns it is written from (``utf8_names`` of both id tables)."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.graph.node_ids import ListedIds, PackedIds, utf8_join
from service.ledger.json_text import encode_json
from service.ledger.release_format import (
    FORMAT,
    FORMAT_COLUMNS,
    FORMAT_NODE_LIST,
    StoredResults,
    UnreadableResults,
    decode_results,
    deflate,
    encode_results,
    results_json,
)
from service.mechanisms.postprocess import RankedNode
from tests.graph_helpers import graph_from_edges

#: Deterministic property tests (the same examples every run), small enough to stay fast.
quick = settings(max_examples=60, deadline=None, derandomize=True, database=None)

LONG_ID = "λ" * 200  # 400 bytes of UTF-8: needs four-byte lengths

CASES: dict[str, list[str]] = {
    "ascii": ["a", "node-17", "42", "x y"],
    "non_ascii": ["é", "北京", "𝔘𝔫𝔦", "naïve café", "🙂"],
    "empty_list": [],
    "one_entry": ["only"],
    "empty_id": ["", "a", ""],
    "long_id": ["short", LONG_ID, "é"],
}


def ranked(nodes: list[str]) -> list[RankedNode]:
    """Scores that are exact binary fractions, with zeros among them."""
    return [RankedNode(node, 2.0**-25 * k if k % 3 else 0.0) for k, node in enumerate(nodes)]


def score_bytes(results: Sequence[RankedNode]) -> list[bytes]:
    return [np.float64(r.score).tobytes() for r in results]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def columns_doc(results: list[RankedNode]) -> dict[str, Any]:
    """The form before the packed one: the three columns, each base64 on its own."""
    data, lengths = utf8_join([r.node for r in results])
    width = 1 if not len(lengths) or int(lengths.max()) < 256 else 4
    return {
        "format": FORMAT_COLUMNS,
        "nodes": b64(data),
        "lengths": b64(np.asarray(lengths).astype(f"<u{width}").tobytes()),
        "length_bytes": width,
        "scores": b64(np.asarray([r.score for r in results], dtype="<f8").tobytes()),
    }


def unpacked(doc: dict[str, Any]) -> bytes:
    """The inflated body of a packed document."""
    return zlib.decompress(base64.b64decode(doc["packed"]))


def node_list_doc(results: list[RankedNode]) -> dict[str, Any]:
    """The previous form: ids as a JSON list, float64 scores in base64."""
    scores = np.asarray([r.score for r in results], dtype="<f8").tobytes()
    return {"format": FORMAT_NODE_LIST, "nodes": [r.node for r in results], "scores": b64(scores)}


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", list(CASES.values()), ids=list(CASES))
def test_results_round_trip_exactly(nodes: list[str]) -> None:
    results = ranked(nodes)
    doc = encode_results(results)
    assert doc["format"] == FORMAT
    assert doc["length_bytes"] == (4 if nodes == CASES["long_id"] else 1)
    decoded = decode_results(json.loads(json.dumps(doc)))  # as stored: through JSON text
    assert isinstance(decoded, StoredResults)
    assert list(decoded) == results and len(decoded) == len(results)
    assert decoded == results
    assert score_bytes(decoded) == score_bytes(results)
    # re-encoding what was read gives the same document (from the columns, not the strings)
    assert encode_results(decoded) == doc
    assert decode_results(encode_results(decoded)) == results


@pytest.mark.parametrize(("size", "width"), [(255, 1), (256, 4), (70000, 4)])
def test_lengths_take_four_bytes_from_an_id_of_256_bytes(size: int, width: int) -> None:
    results = [RankedNode("a", 0.5), RankedNode("b" * size, 0.25), RankedNode("é", 0.0)]
    doc = encode_results(results)
    assert doc["length_bytes"] == width
    body = unpacked(doc)
    assert len(body) == doc["size"] == 3 * width + (1 + size + 2) + 3 * 8
    assert np.frombuffer(body[: 3 * width], f"<u{width}").tolist() == [1, size, 2]
    assert list(decode_results(doc)) == results
    assert list(decode_results(columns_doc(results))) == results


@pytest.mark.parametrize(
    ("ids", "digits_only"),
    [
        ([str(i * 37 % 4039) for i in range(1000)], True),
        ([f"user_{i * 37 % 4039:07d}" for i in range(1000)], False),
        ([str(i) for i in range(999)] + ["-1"], False),
    ],
)
def test_ids_all_digits_are_deflated_by_runs_and_others_by_default(
    ids: list[str], digits_only: bool
) -> None:
    """A release whose ids are all decimal digits is deflated with zlib's run-length matching
    (faster on them, and smaller), any other with zlib's default matching; both inflate
    alike. (The two streams differ for these releases, so the test tells them apart.)"""
    results = [RankedNode(node, (len(ids) - i) * 2.0**-30) for i, node in enumerate(ids)]
    doc = encode_results(results)
    packed = base64.b64decode(doc["packed"])
    body = zlib.decompress(packed)
    assert deflate(body, True) != deflate(body, False)
    assert packed == deflate(body, digits_only)
    assert list(decode_results(doc)) == results


def test_scores_are_bit_identical_after_a_round_trip() -> None:
    special = [0.0, -0.0, 5e-324, 2.0**-1074 * 3, 1e-300, 1.0 - 2.0**-53, float("inf")]
    scores = [2.0**-25 * k for k in range(-40, 41)] + special
    results = [RankedNode(f"n{i}", s) for i, s in enumerate(scores)]
    for doc in (encode_results(results), columns_doc(results), node_list_doc(results)):
        decoded = decode_results(doc)
        assert score_bytes(decoded) == score_bytes(results)
        assert score_bytes(decoded[5:20]) == score_bytes(results[5:20])
        assert np.float64(decoded[-6].score).tobytes() == np.float64(-0.0).tobytes()


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=12),
            st.integers(-(2**30), 2**30).map(lambda k: 2.0**-25 * k),
        ),
        max_size=30,
    )
)
def test_any_ids_and_scores_round_trip(pairs: list[tuple[str, float]]) -> None:
    results = [RankedNode(node, score) for node, score in pairs]
    decoded = decode_results(encode_results(results))
    assert list(decoded) == results
    assert score_bytes(decoded) == score_bytes(results)
    assert results_json(decoded) == encode_json(encode_results(results))


# --- the JSON text ----------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", list(CASES.values()), ids=list(CASES))
def test_results_json_is_the_general_encoders_text(nodes: list[str]) -> None:
    results = ranked(nodes)
    expected = encode_json(encode_results(results))
    assert results_json(results) == expected  # a plain list
    stored = decode_results(encode_results(results))
    assert isinstance(stored, StoredResults)
    assert results_json(stored) == expected  # stored results, encoded once...
    assert results_json(stored) == expected  # ...and the cached text is the same
    of_lists = StoredResults.of_lists([r.node for r in results], [r.score for r in results])
    assert results_json(of_lists) == expected
    assert json.loads(expected) == encode_results(results)


# --- a sequence like a list -----------------------------------------------------------------


def stored_forms(results: list[RankedNode]) -> dict[str, Callable[[], Sequence[RankedNode]]]:
    """The ways a StoredResults is met: read lazily, from lists, and after a full iteration."""

    def iterated() -> Sequence[RankedNode]:
        stored = decode_results(encode_results(results))
        list(stored)  # every id decoded once: later reads use the strings
        return stored

    return {
        "lazy": lambda: decode_results(encode_results(results)),
        "of_lists": lambda: StoredResults.of_lists(
            [r.node for r in results], [r.score for r in results]
        ),
        "iterated": iterated,
        "columns_form": lambda: decode_results(columns_doc(results)),
        "node_list_form": lambda: decode_results(node_list_doc(results)),
    }


FORM_NAMES = ["lazy", "of_lists", "iterated", "columns_form", "node_list_form"]


@pytest.mark.parametrize("form", FORM_NAMES)
def test_indexing_behaves_like_a_list(form: str) -> None:
    results = ranked(["a", "é", "北", LONG_ID, "z", "", "🙂"])
    stored = stored_forms(results)[form]()
    n = len(results)
    assert len(stored) == n
    for i in range(-n, n):
        assert stored[i] == results[i]
    for bad in (n, n + 5, -n - 1):
        with pytest.raises(IndexError):
            stored[bad]
    for window in (slice(None), slice(2, 5), slice(-3, None), slice(None, None, 2),
                   slice(None, None, -1), slice(5, 1, -2), slice(10, 20), slice(-100, 2),
                   slice(3, 3)):  # fmt: skip
        assert stored[window] == results[window], window
    assert list(reversed(stored)) == results[::-1]
    assert RankedNode("北", results[2].score) in stored
    assert stored.index(results[4]) == 4


@quick
@given(st.data())
def test_any_slice_is_the_lists_slice(data: st.DataObject) -> None:
    nodes = data.draw(st.lists(st.text(max_size=6), max_size=20))
    results = ranked(nodes)
    form = data.draw(st.sampled_from(FORM_NAMES))
    stored = stored_forms(results)[form]()
    window = data.draw(st.slices(max(len(results), 1)))
    assert stored[window] == results[window]
    if results:
        i = data.draw(st.integers(-len(results), len(results) - 1))
        assert stored[i] == results[i]


# --- the older forms ------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", list(CASES.values()), ids=list(CASES))
def test_the_older_forms_read_as_equal_results(nodes: list[str]) -> None:
    results = ranked(nodes)
    from_columns = decode_results(json.loads(json.dumps(columns_doc(results))))
    from_node_list = decode_results(json.loads(json.dumps(node_list_doc(results))))
    pairs = json.loads(json.dumps([[r.node, r.score] for r in results]))
    from_pairs = decode_results(pairs)
    assert list(from_columns) == results and from_columns == results
    assert list(from_node_list) == results and from_node_list == results
    assert list(from_pairs) == results
    assert score_bytes(from_columns) == score_bytes(results) == score_bytes(from_pairs)
    assert score_bytes(from_node_list) == score_bytes(results)
    # written again, each is in the current form and reads back the same
    for old in (from_columns, from_node_list, from_pairs):
        doc = encode_results(old)
        assert doc["format"] == FORMAT and decode_results(doc) == results
        assert results_json(old) == encode_json(doc)


# --- corrupted documents ----------------------------------------------------------------------


GOOD = [RankedNode("ab", 0.5), RankedNode("é", 0.25), RankedNode("c", 0.0)]


def good_doc() -> dict[str, Any]:
    return columns_doc(GOOD)


def corrupt(**changes: Any) -> dict[str, Any]:
    doc = good_doc()
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def corrupt_packed(body: bytes | None = None, **changes: Any) -> dict[str, Any]:
    """The packed form of GOOD with ``changes``; ``body`` replaces its inflated bytes (and its
    size)."""
    doc = encode_results(GOOD)
    if body is not None:
        doc.update(size=len(body), packed=b64(zlib.compress(body)))
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


#: GOOD's inflated body: lengths 2, 2, 1; b"ab", "é", b"c"; three scores by byte plane.
GOOD_BODY = unpacked(encode_results(GOOD))
GOOD_PACKED = zlib.compress(GOOD_BODY)


CORRUPTED: dict[str, Any] = {
    "unknown_format": corrupt(format="utf16+lengths"),
    "no_format": corrupt(format=None),
    "not_an_object": "utf8+lengths+f64le",
    "a_number": 3,
    "bad_base64_nodes": corrupt(nodes="not base64!"),
    "bad_base64_scores": corrupt(scores="@@@@"),
    "bad_base64_lengths": corrupt(lengths="A"),
    "nodes_not_text": corrupt(nodes=[1, 2]),
    "scores_missing": corrupt(scores=None),
    "scores_not_float64": corrupt(scores=b64(b"\0" * 12)),
    "fewer_scores": corrupt(scores=b64(b"\0" * 16)),
    "lengths_too_long": corrupt(lengths=b64(bytes([2, 2, 2]))),
    "lengths_too_short": corrupt(lengths=b64(bytes([1, 2, 1]))),
    "fewer_lengths": corrupt(lengths=b64(bytes([2, 3]))),
    "width_2": corrupt(length_bytes=2),
    "width_8": corrupt(length_bytes=8),
    "width_missing": corrupt(length_bytes=None),
    "width_text": corrupt(length_bytes="1"),
    # four one-byte lengths read as one four-byte length: one id for three scores
    "width_4_for_1": corrupt(length_bytes=4, lengths=b64(bytes([2, 2, 1, 0])), nodes=b64(b"abcde")),
    "non_utf8": corrupt(nodes=b64(b"ab\xff\xfec"), lengths=b64(bytes([2, 2, 1]))),
    "old_form_count": {"format": FORMAT_NODE_LIST, "nodes": ["a"], "scores": b64(b"\0" * 16)},
    "old_form_not_text": {"format": FORMAT_NODE_LIST, "nodes": [1, 2], "scores": b64(b"\0" * 16)},
    "old_form_nodes_missing": {"format": FORMAT_NODE_LIST, "scores": b64(b"\0" * 8)},
    "packed_not_base64": corrupt_packed(packed="not base64!"),
    "packed_not_zlib": corrupt_packed(packed=b64(b"plain bytes, not zlib")),
    "packed_cut_short": corrupt_packed(packed=b64(GOOD_PACKED[:-3])),
    "packed_followed_by_more": corrupt_packed(packed=b64(GOOD_PACKED + b"more")),
    "packed_larger_than_size": corrupt_packed(size=len(GOOD_BODY) - 1),
    "packed_smaller_than_size": corrupt_packed(size=len(GOOD_BODY) + 1),
    "packed_missing": corrupt_packed(packed=None),
    "packed_count_missing": corrupt_packed(count=None),
    "packed_size_missing": corrupt_packed(size=None),
    "packed_count_negative": corrupt_packed(count=-1),
    "packed_count_text": corrupt_packed(count="3"),
    "packed_count_bool": corrupt_packed(count=True),
    "packed_count_float": corrupt_packed(count=3.0),
    "packed_size_float": corrupt_packed(size=float(len(GOOD_BODY))),
    "packed_more_results_than_bytes": corrupt_packed(count=10),
    "packed_fewer_results_than_lengths": corrupt_packed(count=2),
    "packed_width_2": corrupt_packed(length_bytes=2),
    "packed_width_4_for_1": corrupt_packed(length_bytes=4),
    "packed_lengths_too_long": corrupt_packed(bytes([2, 2, 2]) + GOOD_BODY[3:]),
    "packed_lengths_too_short": corrupt_packed(bytes([1, 2, 1]) + GOOD_BODY[3:]),
    "packed_non_utf8": corrupt_packed(bytes([2, 2, 1]) + b"ab\xff\xfec" + GOOD_BODY[8:]),
    "packed_splits_a_character": corrupt_packed(bytes([3, 1, 1]) + GOOD_BODY[3:]),
    "packed_empty": corrupt_packed(b""),
}

#: Subtler corruptions (each once raised something other than UnreadableResults): why each is bad.
CORRUPTED_SUBTLY: dict[str, tuple[Any, str]] = {
    "width_4_for_3_bytes": (
        corrupt(length_bytes=4),
        "three one-byte lengths read as four-byte ones: numpy's ValueError, not UnreadableResults",
    ),
    "width_float": (
        corrupt(length_bytes=1.0),
        "1.0 passes `in (1, 4)`, then numpy raises TypeError for dtype '<u1.0'",
    ),
    "width_bool": (
        corrupt(length_bytes=True),
        "True passes `in (1, 4)`, then numpy raises TypeError for dtype '<uTrue'",
    ),
    "lengths_split_a_character": (
        corrupt(nodes=b64("aé".encode()), lengths=b64(bytes([2, 1, 0]))),
        "each id is not checked to be UTF-8 on its own: 'é' split across two ids passes "
        "decode_results and raises UnicodeDecodeError only when read",
    ),
}


def read_all(doc: Any) -> list[RankedNode]:
    return list(decode_results(doc))


@pytest.mark.parametrize("doc", list(CORRUPTED.values()), ids=list(CORRUPTED))
def test_a_corrupted_document_is_unreadable(doc: Any) -> None:
    with pytest.raises(UnreadableResults):
        read_all(doc)


@pytest.mark.parametrize(
    "doc",
    [pytest.param(doc, id=name) for name, (doc, _) in CORRUPTED_SUBTLY.items()]
    + [pytest.param([["a"]], id="pair_list_of_one"), pytest.param([[None, "x"]], id="bad_pair")],
)
def test_a_corrupted_document_the_first_reader_missed_is_unreadable(doc: Any) -> None:
    with pytest.raises(UnreadableResults):
        read_all(doc)


def test_unreadable_results_is_a_value_error() -> None:
    assert issubclass(UnreadableResults, ValueError)
    assert read_all(good_doc()) == [
        RankedNode("ab", 0.5),
        RankedNode("é", 0.25),
        RankedNode("c", 0.0),
    ]  # the uncorrupted document the corruptions start from reads


# --- UTF-8 id columns -----------------------------------------------------------------------


def split(data: bytes, lengths: np.ndarray) -> list[str]:
    assert lengths.dtype == np.int64 and int(lengths.sum()) == len(data)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    return [data[lo:hi].decode("utf-8") for lo, hi in itertools.pairwise(offsets)]


ID_TABLES: dict[str, list[str]] = {
    "numeric": ["0", "7", "42", "1000", "123456789012345678"],
    "not_canonical": ["007", "1", "12", "x"],
    "non_ascii": sorted(["a", "é", "北京", "🙂", "z z", ""], key=lambda s: s.encode()),
    "long": sorted(["b", LONG_ID, "a"], key=lambda s: s.encode()),
}


@pytest.mark.parametrize("ids", list(ID_TABLES.values()), ids=list(ID_TABLES))
def test_utf8_names_are_the_names_bytes(ids: list[str]) -> None:
    rng = np.random.default_rng(7)
    for table in (PackedIds.pack(ids), ListedIds(ids)):
        for size in (0, 1, 5, 40):
            idx = rng.integers(0, len(ids), size=size)  # with repeats
            data, lengths = table.utf8_names(idx)
            assert split(data, lengths) == table.names(idx) == [ids[i] for i in idx]
            assert (data, lengths.tolist()) == (
                utf8_join(table.names(idx))[0],
                utf8_join(table.names(idx))[1].tolist(),
            )


@quick
@given(st.data())
def test_utf8_names_of_any_ids_decode_to_names(data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.text(max_size=8), min_size=1, max_size=25, unique=True))
    ids.sort(key=lambda s: s.encode("utf-8"))  # the canonical order of non-numeric ids
    idx = np.asarray(data.draw(st.lists(st.integers(0, len(ids) - 1), max_size=40)), dtype=np.int64)
    for table in (PackedIds.pack(ids), ListedIds(ids)):
        raw, lengths = table.utf8_names(idx)
        assert split(raw, lengths) == table.names(idx) == [ids[i] for i in idx.tolist()]


def test_a_graphs_external_ids_utf8_match_its_external_ids() -> None:
    graph = graph_from_edges([(0, 1), (1, 2), (2, 3)])
    names = ["a", "é", "北京", LONG_ID]
    for ids in (ListedIds(names), PackedIds.pack(sorted(names, key=lambda s: s.encode()))):
        g = dataclasses.replace(graph, ids=ids)
        idx = np.array([3, 0, 3, 2, 1, 1])
        data, lengths = g.external_ids_utf8(idx)
        assert split(data, lengths) == g.external_ids(idx)
        # what a release is written from: the same document as from the strings
        scores = np.array([0.5, 0.25, 0.125, 0.0, 0.0, 2.0**-25])
        stored = StoredResults(data, lengths, scores)
        expected = [
            RankedNode(n, float(s)) for n, s in zip(g.external_ids(idx), scores, strict=True)
        ]
        assert encode_results(stored) == encode_results(expected)
        assert results_json(stored) == encode_json(encode_results(expected))
