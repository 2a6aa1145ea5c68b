"""Edge-list loading: formats, ids, header and comments, dedup, versions, errors, real data."""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.errors import GraphLoadError, UnknownNode
from service.graph.build import build_graph
from service.graph.loader import MAX_ID_BYTES, load_edge_list
from service.graph.model import Graph
from tests.shared_data import shared_file

TRIANGLE_PLUS = [("1", "2"), ("2", "3"), ("3", "1"), ("3", "4"), ("10", "4")]


# --------------------------------------------------------------------------- helpers


def assert_csr_invariants(graph: Graph) -> None:
    """Symmetric, sorted, no self-loops or repeats, degrees == diff(indptr), consistent maps."""
    n = graph.n
    assert graph.indptr.shape == (n + 1,) and graph.indptr[0] == 0
    assert graph.indptr[-1] == graph.indices.size == 2 * graph.m
    assert np.array_equal(graph.degrees, np.diff(graph.indptr))
    assert graph.degrees.dtype == np.int64
    assert graph.indices.dtype == np.int32 and graph.indptr.dtype in (np.int32, np.int64)
    if graph.indices.size:
        assert graph.indices.min() >= 0 and graph.indices.max() < n
    rows = np.repeat(np.arange(n), graph.degrees)
    assert not np.any(rows == graph.indices), "self-loop stored"
    same_row = rows[1:] == rows[:-1]
    assert np.all(graph.indices[1:][same_row] > graph.indices[:-1][same_row]), "unsorted/repeat"
    adjacency = graph.adjacency
    assert (adjacency != adjacency.T).nnz == 0, "not symmetric"
    assert graph.stats.nodes == n and graph.stats.edges == graph.m
    assert graph.stats.isolated_nodes == int(np.sum(graph.degrees == 0))
    if n:
        assert graph.stats.degree_min == graph.degrees.min()
        assert graph.stats.degree_max == graph.degrees.max()
        assert graph.stats.degree_mean == pytest.approx(2 * graph.m / n)
    assert len(graph.ids) == n
    assert all(graph.index_of(s) == i for i, s in enumerate(graph.node_ids.tolist()))
    assert not graph.indices.flags.writeable and not graph.degrees.flags.writeable


def edge_set(graph: Graph) -> set[frozenset[str]]:
    u, v = graph.edge_arrays()
    ids = graph.node_ids
    return {frozenset((ids[a], ids[b])) for a, b in zip(u.tolist(), v.tolist(), strict=True)}


def write(tmp_path: Path, text: str | bytes, name: str = "edges.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def lines_text(pairs: list[tuple[str, str]], sep: str = " ", end: str = "\n") -> str:
    return "".join(f"{a}{sep}{b}{end}" for a, b in pairs)


def load_text(tmp_path: Path, text: str | bytes, **kwargs: bool | None) -> Graph:
    return load_edge_list(write(tmp_path, text), **kwargs)


def assert_error(path: Path, pattern: str, line: int | None = None) -> GraphLoadError:
    with pytest.raises(GraphLoadError) as info:
        load_edge_list(path)
    error = info.value
    assert str(path) in str(error), "the message must name the file"
    assert re.search(pattern, str(error)), str(error)
    assert error.line == line
    if line is not None:
        assert f"{path}:{line}:" in str(error)
    assert error.code == "graph_load_error"
    return error


# --------------------------------------------------------------------------- formats


FORMATS = {
    "space": lines_text(TRIANGLE_PLUS, " "),
    "tab": lines_text(TRIANGLE_PLUS, "\t"),
    "comma": lines_text(TRIANGLE_PLUS, ","),
    "comma-space": lines_text(TRIANGLE_PLUS, ", "),
    "many-spaces": lines_text(TRIANGLE_PLUS, "   \t "),
    "crlf": lines_text(TRIANGLE_PLUS, " ", "\r\n"),
    "cr-only": lines_text(TRIANGLE_PLUS, " ", "\r"),
    "indented-trailing": "".join(f"  {a} {b}  \t\n" for a, b in TRIANGLE_PLUS),
    "no-final-newline": lines_text(TRIANGLE_PLUS).rstrip("\n"),
    "blank-lines": "\n\n"
    + lines_text(TRIANGLE_PLUS[:2])
    + "\n  \n"
    + lines_text(TRIANGLE_PLUS[2:]),
    "mixed-separators": "1 2\n2\t3\n3,1\n3 ,\t4\n10,4\n",
    "reversed": lines_text([(b, a) for a, b in TRIANGLE_PLUS]),
    "shuffled-duplicated": lines_text(TRIANGLE_PLUS[::-1] + TRIANGLE_PLUS[:2]),
    "bom": "\ufeff" + lines_text(TRIANGLE_PLUS),
}


@pytest.fixture
def reference(tmp_path: Path) -> Graph:
    return load_edge_list(write(tmp_path, lines_text(TRIANGLE_PLUS), "reference.txt"))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_format_variants_give_the_same_graph(tmp_path: Path, reference: Graph, name: str) -> None:
    graph = load_text(tmp_path, FORMATS[name])
    assert_csr_invariants(graph)
    assert graph.version == reference.version
    assert graph.node_ids.tolist() == ["1", "2", "3", "4", "10"]  # numeric order
    assert np.array_equal(graph.indptr, reference.indptr)
    assert np.array_equal(graph.indices, reference.indices)
    assert edge_set(graph) == {frozenset(p) for p in TRIANGLE_PLUS}


def test_reference_graph_structure(reference: Graph) -> None:
    assert (reference.n, reference.m) == (5, 5)
    assert reference.index_of("10") == 4
    assert reference.external_ids(reference.neighbors(reference.index_of("3"))) == ["1", "2", "4"]
    assert reference.degrees.tolist() == [2, 2, 3, 2, 1]
    assert reference.indices.dtype == np.int32 and reference.indptr.dtype == np.int32
    assert len(reference.version) == 20 and int(reference.version, 16) >= 0
    assert reference.stats.self_loops_dropped == 0
    assert reference.stats.duplicate_edges_dropped == 0
    assert not reference.stats.weights_ignored and not reference.stats.header_skipped
    assert reference.nbytes > 0


@pytest.mark.parametrize(
    ("compress", "name"),
    [
        (gzip.compress, "edges.txt.gz"),
        (gzip.compress, "edges.txt"),  # detected by magic bytes, not the name
        (bz2.compress, "edges.bz2"),
        (lzma.compress, "edges.dat"),
    ],
)
def test_compressed_files(tmp_path: Path, reference: Graph, compress: object, name: str) -> None:
    assert callable(compress)
    data = compress(FORMATS["shuffled-duplicated"].encode())
    graph = load_edge_list(write(tmp_path, data, name))
    assert graph.version == reference.version


def test_multi_member_gzip(tmp_path: Path, reference: Graph) -> None:
    text = lines_text(TRIANGLE_PLUS).encode()
    data = gzip.compress(text[:10]) + gzip.compress(text[10:])
    assert load_edge_list(write(tmp_path, data)).version == reference.version


def test_path_may_be_a_string(tmp_path: Path, reference: Graph) -> None:
    path = write(tmp_path, lines_text(TRIANGLE_PLUS))
    graph = load_edge_list(str(path))
    assert graph.version == reference.version and graph.stats.source == str(path)


# --------------------------------------------------------------------------- ids


def test_string_ids(tmp_path: Path) -> None:
    text = "alice bob\nbob carol\ncarol alice\ndave alice\nÉmile zoë\n"
    graph = load_text(tmp_path, text)
    assert_csr_invariants(graph)
    # canonical order is by UTF-8 bytes (== Python str order)
    assert graph.node_ids.tolist() == sorted(["alice", "bob", "carol", "dave", "Émile", "zoë"])
    assert graph.m == 5
    assert graph.has_node("zoë") and not graph.has_node("eve")
    assert graph.external_ids(graph.neighbors(graph.index_of("alice"))) == ["bob", "carol", "dave"]
    with pytest.raises(UnknownNode):
        graph.index_of("eve")


def test_ids_are_kept_as_written(tmp_path: Path) -> None:
    graph = load_text(tmp_path, "007 7\n7 08\n-1 +2\n0x1 1e3\n")
    assert set(graph.node_ids.tolist()) == {"007", "7", "08", "-1", "+2", "0x1", "1e3"}
    assert graph.m == 4
    assert graph.node_ids.tolist() == sorted(graph.node_ids.tolist())  # string order


def test_mixed_int_and_string_ids_use_string_order(tmp_path: Path) -> None:
    graph = load_text(tmp_path, "10 9\n9 x\n")
    assert graph.node_ids.tolist() == ["10", "9", "x"]


def test_large_and_sparse_integer_ids(tmp_path: Path) -> None:
    big = 10**17 + 3
    huge = "1" * 19  # more than 18 digits: read as a string id
    graph = load_text(tmp_path, f"{big} 5\n5 900000000000\n{huge} 5\n")
    assert graph.has_node(str(big)) and graph.has_node(huge)
    sparse = load_text(tmp_path, f"{big} 5\n5 900000000000\n")
    assert sparse.node_ids.tolist() == ["5", "900000000000", str(big)]  # numeric order
    assert_csr_invariants(sparse)


def test_long_ids_up_to_the_limit(tmp_path: Path) -> None:
    ids = ["a" * k for k in (1, 7, 8, 9, 16, 17, 100, 600, MAX_ID_BYTES)]
    pairs = [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))]
    graph = load_text(tmp_path, lines_text(pairs))
    assert sorted(graph.node_ids.tolist()) == sorted(ids)
    assert edge_set(graph) == {frozenset(p) for p in pairs}


# --------------------------------------------------------------------------- header, comments


@pytest.mark.parametrize(
    "header_line",
    ["source,target", "src dst", "from to weight", "Source\tTarget", "node1,node2",
     '"source","target"', "FromNodeId ToNodeId", "u_id v_id", "a b"],
)  # fmt: skip
def test_header_is_detected_and_skipped(tmp_path: Path, reference: Graph, header_line: str) -> None:
    text = f"# a comment\n{header_line}\n" + lines_text(TRIANGLE_PLUS, ",")
    graph = load_text(tmp_path, text)
    assert graph.version == reference.version
    assert graph.stats.header_skipped


def test_header_with_string_ids(tmp_path: Path) -> None:
    graph = load_text(tmp_path, "source,target\nalice,bob\nbob,carol\n")
    assert graph.node_ids.tolist() == ["alice", "bob", "carol"] and graph.stats.header_skipped


def test_first_line_of_string_ids_is_not_a_header(tmp_path: Path) -> None:
    graph = load_text(tmp_path, "alice bob\nbob carol\n")
    assert graph.m == 2 and graph.has_node("alice") and not graph.stats.header_skipped


def test_candidate_header_in_a_string_file_is_an_edge(tmp_path: Path) -> None:
    graph = load_text(tmp_path, "x y\n1 2\nz 2\n")  # not all other ids are integers
    assert graph.has_node("x") and graph.m == 3 and not graph.stats.header_skipped


@pytest.mark.parametrize(
    "text",
    [
        "node1 node2\nnode2 node3\n",  # column-like names that are node ids
        "user-1,user-0\nuser-2,user-1\n",
        "source target\nsource x\n",
    ],
)
def test_column_like_names_that_are_nodes_are_not_a_header(tmp_path: Path, text: str) -> None:
    graph = load_text(tmp_path, text)
    assert graph.m == 2 and not graph.stats.header_skipped


def test_header_argument_overrides_detection(tmp_path: Path) -> None:
    assert load_text(tmp_path, "u v\n1 2\n", header=False).m == 2
    forced = load_text(tmp_path, "alice bob\nbob carol\n", header=True)
    assert forced.m == 1 and not forced.has_node("alice") and forced.stats.header_skipped
    assert load_text(tmp_path, "1 2\n2 3\n", header=True).m == 1


def test_comments_anywhere(tmp_path: Path, reference: Graph) -> None:
    text = "# SNAP style\n% konect style\n   # indented\n"
    text += lines_text(TRIANGLE_PLUS[:3]) + "#1 9\n%%9 1\n" + lines_text(TRIANGLE_PLUS[3:])
    graph = load_text(tmp_path, text)
    assert graph.version == reference.version and not graph.has_node("9")


def test_matrix_market_size_line_is_skipped(tmp_path: Path, reference: Graph) -> None:
    text = "%%MatrixMarket matrix coordinate pattern symmetric\n% comment\n10 10 5\n"
    graph = load_text(tmp_path, text + lines_text(TRIANGLE_PLUS))
    assert graph.version == reference.version and not graph.stats.header_skipped


# --------------------------------------------------------------------------- columns


def test_weights_column_ignored_with_a_notice(
    tmp_path: Path, reference: Graph, caplog: pytest.LogCaptureFixture
) -> None:
    text = "".join(f"{a} {b} {i * 0.5}\n" for i, (a, b) in enumerate(TRIANGLE_PLUS))
    with caplog.at_level(logging.WARNING, logger="service.graph.loader"):
        graph = load_text(tmp_path, text)
    assert graph.version == reference.version
    assert graph.stats.weights_ignored and not graph.stats.extra_columns_ignored
    assert any("weight" in r.message and r.levelno == logging.WARNING for r in caplog.records)


def test_extra_columns_ignored_with_a_notice(
    tmp_path: Path, reference: Graph, caplog: pytest.LogCaptureFixture
) -> None:
    text = "".join(f"{a}\t{b}\t1\t{1600000000 + i}\n" for i, (a, b) in enumerate(TRIANGLE_PLUS))
    with caplog.at_level(logging.WARNING, logger="service.graph.loader"):
        graph = load_text(tmp_path, text)
    assert graph.version == reference.version
    assert graph.stats.weights_ignored and graph.stats.extra_columns_ignored
    assert any("4 fields" in r.message for r in caplog.records)


def test_string_weights_do_not_turn_integer_ids_into_strings(tmp_path: Path) -> None:
    graph = load_text(tmp_path, "10 9 heavy\n9 8 light\n")
    assert graph.node_ids.tolist() == ["8", "9", "10"] and graph.stats.weights_ignored


def test_no_notice_without_weights(
    tmp_path: Path, reference: Graph, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.graph.loader"):
        load_text(tmp_path, lines_text(TRIANGLE_PLUS))
    assert not caplog.records


# --------------------------------------------------------------------------- cleaning


def test_self_loops_and_duplicates_are_dropped_and_counted(tmp_path: Path) -> None:
    text = "1 2\n2 1\n1 2\n3 3\n3 3\n2 3\n4 4\n"
    graph = load_text(tmp_path, text)
    assert_csr_invariants(graph)
    assert graph.m == 2
    assert graph.stats.self_loops_dropped == 3
    assert graph.stats.duplicate_edges_dropped == 2
    # a node seen only in a self-loop is kept, isolated
    assert graph.has_node("4") and graph.degrees[graph.index_of("4")] == 0
    assert graph.stats.isolated_nodes == 1


# --------------------------------------------------------------------------- versions


def test_version_ignores_order_separators_direction_duplicates_and_compression(
    tmp_path: Path,
) -> None:
    rng = random.Random(5)
    pairs = [(str(rng.randrange(60)), str(rng.randrange(60))) for _ in range(300)]
    versions = set()
    for trial in range(6):
        shuffled = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in pairs]
        rng.shuffle(shuffled)
        shuffled += shuffled[: trial * 7]
        text = lines_text(shuffled, [" ", "\t", ",", " , "][trial % 4])
        data = gzip.compress(text.encode()) if trial % 2 else text.encode()
        versions.add(load_edge_list(write(tmp_path, data, f"v{trial}")).version)
    assert len(versions) == 1


def test_version_changes_with_the_graph(tmp_path: Path, reference: Graph) -> None:
    base = lines_text(TRIANGLE_PLUS)
    variants = {
        "extra edge": base + "1 4\n",
        "missing edge": lines_text(TRIANGLE_PLUS[:-1]),
        "extra isolated node": base + "99 99\n",
        "relabelled node": base.replace("10", "11"),
        "string form of an id": base.replace("10", "010"),
    }
    seen = {reference.version}
    for name, text in variants.items():
        version = load_text(tmp_path, text).version
        assert version not in seen, name
        seen.add(version)


def test_loaded_graph_equals_built_graph(tmp_path: Path, reference: Graph) -> None:
    ids = ["10", "4", "3", "2", "1"]  # any order: build_graph puts them in canonical order
    pos = {s: i for i, s in enumerate(ids)}
    src = [pos[a] for a, _ in TRIANGLE_PLUS]
    dst = [pos[b] for _, b in TRIANGLE_PLUS]
    built = build_graph(np.array(src), np.array(dst), ids)
    assert built.version == reference.version
    assert np.array_equal(built.indices, reference.indices)
    assert built.node_ids.tolist() == reference.node_ids.tolist()


def test_build_graph_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="distinct"):
        build_graph(np.array([0]), np.array([1]), ["a", "a"])
    with pytest.raises(ValueError, match="endpoints"):
        build_graph(np.array([0]), np.array([5]), ["a", "b"])
    with pytest.raises(ValueError, match="integers"):
        build_graph(np.array([0.5]), np.array([1.0]))
    with pytest.raises(ValueError, match="num_nodes"):
        build_graph(np.array([0]), np.array([5]), num_nodes=3)
    empty = build_graph(np.array([], dtype=np.int64), np.array([], dtype=np.int64), num_nodes=3)
    assert (empty.n, empty.m, empty.stats.isolated_nodes) == (3, 0, 3)
    assert_csr_invariants(empty)


def test_graph_arrays_are_read_only(reference: Graph) -> None:
    with pytest.raises(ValueError):
        reference.indices[0] = 3
    with pytest.raises(ValueError):
        reference.degrees[0] = 3


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    assert_error(tmp_path / "nope.txt", "no such file")


def test_directory(tmp_path: Path) -> None:
    assert_error(tmp_path, "directory")


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "1 2\n")
    if os.geteuid() != 0:  # root reads anything
        path.chmod(0)
        assert_error(path, "permission denied")
        path.chmod(0o600)

    def broken(self: Path) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Path, "read_bytes", broken)
    assert_error(path, "cannot read the file: Input/output error")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", "empty"),
        ("\n  \n\t\n", "empty"),
        ("# only\n% comments\n\n", "only comments"),
        ("source,target\n", "nothing but a header"),
        ("%%MatrixMarket matrix coordinate pattern general\n3 3 0\n", "nothing but a header"),
    ],
)
def test_nothing_to_load(tmp_path: Path, text: str, pattern: str) -> None:
    assert_error(write(tmp_path, text), pattern)


def test_only_self_loops(tmp_path: Path) -> None:
    assert_error(write(tmp_path, "1 1\n2 2\nx x\n"), "no edges left after dropping 3 self-loop")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("1 2\n2 3\n7\n3 4\n", 3),
        ("# comment\n\n1 2\n 42  \n", 4),
        ("a b\nb c\nc\n", 3),
        ("1,2\n3,\n", 2),
        ("single\n", 1),
    ],
)
def test_line_with_one_field(tmp_path: Path, text: str, line: int) -> None:
    error = assert_error(write(tmp_path, text), "only one field", line)
    assert "expected two node ids" in str(error)


def test_one_field_line_found_in_a_later_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.graph.loader.CHUNK_BYTES", 64)
    text = lines_text([(str(i), str(i + 1)) for i in range(100)]) + "5\n" + "1 2\n"
    assert_error(write(tmp_path, text), "only one field", 101)
    graph = load_text(tmp_path, lines_text([(str(i), f"n{i + 1}") for i in range(100)]))
    assert graph.m == 100  # string path across many slices


def test_undecodable_bytes(tmp_path: Path) -> None:
    data = b"1 2\n2 3\n# caf\xc3\xa9 is fine\n3 \xff\xfe4\n"
    assert_error(write(tmp_path, data), r"byte 0xff is not valid UTF-8", 4)


def test_nul_byte(tmp_path: Path) -> None:
    assert_error(write(tmp_path, b"1 2\n2 3\x00\n"), "NUL byte", 2)


def test_utf16_file(tmp_path: Path) -> None:
    assert_error(write(tmp_path, "1 2\n".encode("utf-16")), "UTF-16", 1)


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = gzip.compress(b"1 2\n" * 1000)
    assert_error(write(tmp_path, data[: len(data) // 2]), "corrupt compressed data")


def test_zip_archive(tmp_path: Path) -> None:
    assert_error(write(tmp_path, b"PK\x03\x04rest"), "zip archives are not supported")


def test_id_too_long(tmp_path: Path) -> None:
    text = "a b\nb " + "c" * (MAX_ID_BYTES + 1) + "\n"
    assert_error(write(tmp_path, text), f"node id of {MAX_ID_BYTES + 1} bytes", 2)


# --------------------------------------------------------------------------- real data


def _reference_counts(path: Path) -> tuple[int, int, int]:
    """Nodes, undirected edges without self-loops, self-loop lines: plain Python."""
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()
    loops = 0
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields or line.lstrip().startswith(("#", "%")):
            continue
        a, b = fields[0], fields[1]
        nodes.update((a, b))
        if a == b:
            loops += 1
        else:
            edges.add((min(a, b), max(a, b)))
    return len(nodes), len(edges), loops


def _shared(name: str) -> Path:
    return shared_file(name)


def test_facebook() -> None:
    path = _shared("facebook_combined.txt")
    graph = load_edge_list(path)
    assert (graph.n, graph.m) == (4039, 88234)
    assert graph.stats.duplicate_edges_dropped == 88234  # every edge listed both ways
    assert graph.stats.self_loops_dropped == 0 and graph.stats.isolated_nodes == 0
    assert graph.node_ids[0] == "0" and graph.node_ids[-1] == "4038"
    assert_csr_invariants(graph)


def test_email_eu_core() -> None:
    path = _shared("email-Eu-core.txt")
    graph = load_edge_list(path)
    nodes, edges, loops = _reference_counts(path)
    assert graph.n == nodes == 1005
    assert graph.m == edges == 16064  # 25,571 directed lines, self-loops dropped, undirected
    assert graph.stats.self_loops_dropped == loops
    assert graph.stats.duplicate_edges_dropped == 25571 - loops - edges
    assert_csr_invariants(graph)


def test_real_file_gzipped_keeps_its_version(tmp_path: Path) -> None:
    path = _shared("email-Eu-core.txt")
    data = gzip.compress(path.read_bytes())
    assert load_edge_list(write(tmp_path, data, "email.gz")).version == load_edge_list(path).version


# --------------------------------------------------------------------------- property


_INT_TOKENS = st.integers(0, 30).map(str)
_STR_TOKENS = st.sampled_from(["a", "b", "bob", "007", "7", "0", "x-y", "é", "ü1", "Z", "10"])
_SEPARATORS = st.sampled_from([" ", "\t", ",", " , ", "  "])


def _reference_load(text: str) -> tuple[set[str], set[frozenset[str]], int, int, bool]:
    nodes: set[str] = set()
    edges: set[frozenset[str]] = set()
    loops = dups = 0
    weights = False
    for line in text.split("\n"):
        fields = [f for f in re.split(r"[ \t\r,]+", line) if f]
        if not fields or fields[0][0] in "#%":
            continue
        a, b = fields[0], fields[1]
        weights |= len(fields) > 2
        nodes.update((a, b))
        if a == b:
            loops += 1
        elif frozenset((a, b)) in edges:
            dups += 1
        else:
            edges.add(frozenset((a, b)))
    return nodes, edges, loops, dups, weights


@st.composite
def _edge_list_texts(draw: st.DrawFn) -> str:
    tokens = draw(st.sampled_from([_INT_TOKENS, _STR_TOKENS]))
    pairs = draw(st.lists(st.tuples(tokens, tokens), min_size=1, max_size=40))
    lines = []
    for a, b in pairs:
        sep = draw(_SEPARATORS)
        extra = draw(st.sampled_from(["", "", " 1.5", ",3,4"]))
        lines.append(f"{a}{sep}{b}{extra}")
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from(["# c", "% 1 2", "", "  "])))
    return draw(st.sampled_from(["\n", "\r\n"])).join(lines) + draw(st.sampled_from(["", "\n"]))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_edge_list_texts(), gz=st.booleans())
def test_loader_matches_pure_python_reference(tmp_path: Path, text: str, gz: bool) -> None:
    nodes, edges, loops, dups, weights = _reference_load(text)
    data = gzip.compress(text.encode()) if gz else text.encode()
    if not edges:
        with pytest.raises(GraphLoadError):
            load_edge_list(write(tmp_path, data, "prop"), header=False)
        return
    graph = load_edge_list(write(tmp_path, data, "prop"), header=False)
    assert_csr_invariants(graph)
    assert set(graph.node_ids.tolist()) == nodes
    assert edge_set(graph) == edges
    assert graph.stats.self_loops_dropped == loops
    assert graph.stats.duplicate_edges_dropped == dups
    assert graph.stats.weights_ignored == weights
    # same version as the graph built from the reference's edge set, in any id order
    ids = sorted(nodes, key=lambda s: (len(s), s[::-1]))
    pos = {s: i for i, s in enumerate(ids)}
    pairs = [tuple(e) for e in edges]
    src = np.array([pos[p[0]] for p in pairs], dtype=np.int64)
    dst = np.array([pos[p[-1]] for p in pairs], dtype=np.int64)
    built = build_graph(src, dst, ids)
    assert built.version == graph.version
    assert np.array_equal(built.indices, graph.indices)
