"""Memory of ``serve --workers N``, measured as PSS (proportional set size).

PSS divides each shared page among the processes that map it, so the sum over the server's
processes (the supervisor and its workers) is what the machine holds for it; RSS would count
shared pages once per process. For each worker count the script starts the server on the
given graph and ledger (once every worker has loaded the graph and mapped its prefix tables),
sums ``Pss`` from ``/proc/PID/smaps_rollup`` over the process tree at ready, then sends
``--queries`` fresh queries on distinct random seeds (without a prefix table each is cold: it
computes and caches a noise-free prefix, which fills the prefix cache; ``--prefix-cache-mib``
sets PPR_PREFIX_CACHE_BYTES, the machine's bound) and measures again.
``--prefix-table-mib`` sets PPR_PREFIX_TABLE_BYTES (0: off); the tables' pages count as file
pages. ``--repeat`` runs each count several times (interleaved) and reports the median, since
what the kernel has paged in varies between runs. Prints a table with the ratio of each total
to the first worker count's.

    python benchmarks/worker_memory.py --graph /tmp/g100k.txt --workers 1 2 --repeat 3 \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/ppr_mem
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from service.config import MechanismSettings
from service.loadtest.server import (
    admin_key,
    served_process,
    service_account_key,
    wait_for_prefix_table,
)


def children(pid: int) -> list[int]:
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):  # it exited meanwhile
        pass
    return found


def tree(pid: int) -> list[int]:
    out = [pid]
    for child in children(pid):
        out += tree(child)
    return out


def rollup_kib(pid: int) -> dict[str, int]:
    """``Pss``, ``Pss_Anon`` and ``Pss_File`` of a process (kB)."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Pss_Anon", "Pss_File"):
            out[name] = int(rest.split()[0])
    return out


def pss_kib(pid: int) -> int:
    return rollup_kib(pid).get("Pss", 0)


def snapshot(pid: int) -> tuple[int, list[int], int, int]:
    """Total PSS of the process tree, per process, and its anonymous and file parts (a child
    that exits meanwhile, e.g. a prefix table builder, is left out)."""
    rollups = []
    for p in tree(pid):
        try:
            rollups.append(rollup_kib(p))
        except (FileNotFoundError, ProcessLookupError):
            continue
    per = [r.get("Pss", 0) for r in rollups]
    anon = sum(r.get("Pss_Anon", 0) for r in rollups)
    files = sum(r.get("Pss_File", 0) for r in rollups)
    return sum(per), per, anon, files


def fill(base_url: str, key: str, nodes: int, queries: int, concurrency: int) -> int:
    """Fresh edge-mode queries on distinct random seeds; returns how many answered 200."""
    seeds = random.Random().sample(range(nodes), min(queries, nodes))
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=600) as client:

        def ask(seed: int) -> int:
            params: dict[str, str | float | int] = {"epsilon": 0.5, "k": 10, "mode": "edge"}
            return client.get(f"/v1/ppr/{seed}", params=params).status_code

        with ThreadPoolExecutor(concurrency) as pool:
            return sum(status == 200 for status in pool.map(ask, seeds))


def measure(args: argparse.Namespace, workers: int, nodes: int, edges: int) -> dict[str, object]:
    extra = {"PPR_PREFIX_CACHE_BYTES": str(args.prefix_cache_mib * 2**20),
             "PPR_PREFIX_TABLE_BYTES": str(args.prefix_table_mib * 2**20),
             "PPR_GRAPH_SNAPSHOTS": "true" if args.snapshots else "false"}  # fmt: skip
    key = service_account_key(args.database_url, delta=MechanismSettings().account_delta)
    with tempfile.TemporaryDirectory(prefix="ppr-mem-") as tmp, served_process(
        port=args.port, workers=workers, graph=args.graph, database_url=args.database_url,
        redis_url=None, log_path=Path(tmp) / "server.log", extra_env=extra,
    ) as (base_url, proc):  # fmt: skip
        table = wait_for_prefix_table(
            base_url, admin_key(args.database_url), workers=workers, timeout_s=600,
            say=lambda text: print(text, file=sys.stderr),
        )  # fmt: skip
        time.sleep(args.settle)
        ready, ready_per, ready_anon, ready_file = snapshot(proc.pid)
        answered = fill(base_url, key, nodes, args.queries, args.concurrency)
        time.sleep(args.settle)
        after, after_per, after_anon, after_file = snapshot(proc.pid)
    return {"ready": ready, "ready_per": ready_per, "ready_anon": ready_anon,
            "ready_file": ready_file, "after": after, "after_per": after_per,
            "after_anon": after_anon, "after_file": after_file, "answered": answered,
            "prefix_table": table}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--port", type=int, default=8650)
    parser.add_argument("--queries", type=int, default=200, help="fresh queries after ready")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefix-cache-mib", type=int, default=256,
                        help="PPR_PREFIX_CACHE_BYTES in MiB (the machine's bound)")  # fmt: skip
    parser.add_argument("--prefix-table-mib", type=int, default=1024,
                        help="PPR_PREFIX_TABLE_BYTES in MiB (0: no prefix table)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--no-snapshots", dest="snapshots", action="store_false",
                        help="PPR_GRAPH_SNAPSHOTS=false (each worker parses its copy)")  # fmt: skip
    args = parser.parse_args()
    from service.graph.loader import load_edge_list

    graph = load_edge_list(args.graph)
    nodes, edges = graph.n, graph.m
    arrays_mib = (graph.indptr.nbytes + graph.indices.nbytes + graph.degrees.nbytes) / 2**20
    del graph
    runs: dict[int, list[dict[str, object]]] = {n: [] for n in args.workers}
    for _ in range(args.repeat):
        for n in args.workers:
            runs[n].append(measure(args, n, nodes, edges))
            print(f"workers {n}: {runs[n][-1]}", file=sys.stderr, flush=True)

    def median(n: int, field: str) -> float:
        return statistics.median(float(r[field]) for r in runs[n])  # type: ignore[arg-type]

    fields = ("ready", "ready_anon", "ready_file", "after", "after_anon", "after_file")
    base = {field: median(args.workers[0], field) for field in fields}
    print(f"graph: {nodes:,} nodes, {edges:,} edges, CSR arrays {arrays_mib:.1f} MiB; "
          f"prefix cache bound {args.prefix_cache_mib} MiB per machine, prefix tables "
          f"{args.prefix_table_mib} MiB; {args.queries} fresh "
          f"queries; median of {args.repeat} run(s); PSS in MiB (anon: anonymous memory, only "
          f"ever shared within the server's own process tree; file: file pages, libraries "
          f"included, which other processes on the machine share too)")  # fmt: skip
    for stage in ("ready", "after"):
        title = "at ready" if stage == "ready" else f"after {args.queries} fresh queries"
        print(f"\n{title}:\n")
        print("| workers | PSS | x first | PSS anon | x first | PSS file | per process |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for n in args.workers:
            per = runs[n][-1][f"{stage}_per"]
            each = ", ".join(f"{p / 1024:.0f}" for p in per)  # type: ignore[attr-defined]
            total, anon = median(n, stage), median(n, f"{stage}_anon")
            files, anon_base = median(n, f"{stage}_file"), base[f"{stage}_anon"]
            print(f"| {n} | {total / 1024:.0f} | {total / base[stage]:.2f} | {anon / 1024:.0f} "
                  f"| {anon / anon_base:.2f} | {files / 1024:.0f} | {each} |")  # fmt: skip


if __name__ == "__main__":
    main()
