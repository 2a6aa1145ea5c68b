"""Edge-list loading benchmark: time and memory of ``load_edge_list`` on a generated file.

    python benchmarks/graph_load.py --edges 10000000          # 1M nodes, 10M edges
    python benchmarks/graph_load.py --edges 2000000 10000000 --gzip

For each size, a deterministic power-law graph (``generate_graph(edges // 10, edges)``) is
written, lines shuffled and directions flipped at random, to a temporary directory (plain and,
with ``--gzip``, gzip). Each file is then loaded in a fresh Python process so the memory
numbers are the loader's own:

* load s           wall-clock seconds of ``load_edge_list`` (read + parse + build + hash)
* peak RSS delta   peak resident set during the load minus the resident set before it
* retained delta   resident set after the load (garbage collected, free heap returned with
                   malloc_trim) minus before: the graph with its id map and id strings
* arrays B/entry   ``graph.nbytes`` per stored adjacency entry (2 per undirected edge)
* retained B/entry retained delta per adjacency entry
* version ok       the loaded graph's version equals the generated graph's
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.graph.generate import write_generated_edge_list  # noqa: E402
from service.graph.loader import load_edge_list  # noqa: E402

MB = 1024.0 * 1024.0


def _proc_status_bytes(field: str) -> int | None:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status in bytes (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss_bytes() -> int:
    """Current resident set size."""
    current = _proc_status_bytes("VmRSS")
    return current if current is not None else _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process image. VmHWM is preferred: ru_maxrss also
    counts the forked parent's memory from before exec on Linux."""
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss if sys.platform == "darwin" else maxrss * 1024)


def _release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc), so RSS shows live memory only."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(path: str) -> dict[str, Any]:
    """Load ``path`` once in this (fresh) process and report time and memory."""
    gc.collect()
    before = _rss_bytes()
    start = time.perf_counter()
    graph = load_edge_list(path)
    seconds = time.perf_counter() - start
    peak = _peak_rss_bytes()
    gc.collect()
    _release_free_memory()
    after = _rss_bytes()
    entries = max(1, 2 * graph.m)
    return {
        "seconds": seconds,
        "nodes": graph.n,
        "edges": graph.m,
        "version": graph.version,
        "peak_delta": peak - before,
        "retained_delta": after - before,
        "array_bytes_per_entry": graph.nbytes / entries,
        "retained_bytes_per_entry": (after - before) / entries,
        "indices_dtype": str(graph.indices.dtype),
        "indptr_dtype": str(graph.indptr.dtype),
    }


def _measure_in_child(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--nodes", type=int, default=None, help="default: edges // 10")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gzip", action="store_true", help="also load a gzip copy")
    parser.add_argument("--keep", type=Path, default=None, help="write the files here")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return 0

    headers = ["file", "nodes", "edges", "file MB", "write s", "load s", "peak RSS delta MB",
               "retained delta MB", "arrays B/entry", "retained B/entry", "version ok"]  # fmt: skip
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for edges in args.edges:
            nodes = args.nodes or max(2, edges // 10)
            suffixes = [".txt", ".txt.gz"] if args.gzip else [".txt"]
            for suffix in suffixes:
                path = folder / f"generated-{nodes}-{edges}{suffix}"
                start = time.perf_counter()
                graph = write_generated_edge_list(path, nodes, edges, args.seed)
                written = time.perf_counter() - start
                version = graph.version
                del graph
                gc.collect()
                r = _measure_in_child(path)
                rows.append([
                    path.name, f"{r['nodes']:,}", f"{r['edges']:,}",
                    f"{path.stat().st_size / MB:.1f}", f"{written:.1f}", f"{r['seconds']:.2f}",
                    f"{r['peak_delta'] / MB:.0f}", f"{r['retained_delta'] / MB:.0f}",
                    f"{r['array_bytes_per_entry']:.2f}", f"{r['retained_bytes_per_entry']:.2f}",
                    "yes" if r["version"] == version else "NO",
                ])  # fmt: skip
                print(_table(rows[-1:], headers).splitlines()[-1], file=sys.stderr, flush=True)
    print(_table(rows, headers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
