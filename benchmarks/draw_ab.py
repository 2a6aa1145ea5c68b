"""One count ranking's draw in two checkouts, side by side: thread CPU per query, the two
alternated in chunks.

Each checkout runs in a process of its own (its own ``service`` package, with this
interpreter), generates the same graph, and answers ``bench``'s queries
(``scale_where.bench_queries``: the same seeds, epsilon 0.1, the ranked top ``1000 + d(s)`` the
service stores, the degree release made once). After a warm-up of 50 queries, the driver asks
each process in turn for the next chunk of ``--size`` seeds (the side that goes first alternates
from chunk to chunk) and records the chunk's mean thread CPU per query. The minimum, first
quartile and median of the chunks are printed per side: thread CPU and alternation keep the
comparison fair on a machine that other work shares, where wall time and single runs are not.

    .venv/bin/python benchmarks/draw_ab.py --before-dir ../before --generate 1000000,10000000
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: The process each checkout runs: it reads "first last" lines and answers each with the
#: chunk's thread CPU seconds per query.
SIDE = r"""
import sys, time
root = sys.argv[1]
sys.path[:0] = [root, root + "/benchmarks"]
from service.graph.generate import generate_graph
from scale_where import bench_queries
graph = generate_graph(int(sys.argv[2]), int(sys.argv[3]), seed=0)
seeds, query = bench_queries(graph, int(sys.argv[5]))
for seed in seeds[:50]:
    query(sys.argv[4], int(seed))
print("ready", flush=True)
for line in sys.stdin:
    first, last = map(int, line.split())
    started = time.thread_time()
    for seed in seeds[first:last]:
        query(sys.argv[4], int(seed))
    print((time.thread_time() - started) / (last - first), flush=True)
"""


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(1000.0 * s for s in seconds)
    return (
        f"{label}: min {ms[0]:.3f}, p25 {ms[len(ms) // 4]:.3f}, median "
        f"{statistics.median(ms):.3f} ms CPU a query ({len(ms)} chunks)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before-dir", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after-dir", type=Path, default=HERE, help="default: this one")
    parser.add_argument("--generate", default="1000000,10000000", metavar="NODES,EDGES")
    parser.add_argument("--mechanism", default="blended",
                        choices=["blended", "friends_of_friends"])  # fmt: skip
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--size", type=int, default=200, help="queries a chunk")
    parser.add_argument("--chunks", type=int, default=20, help="chunks a side")
    args = parser.parse_args(argv)
    nodes, edges = (int(x) for x in args.generate.split(","))
    sides = {"before": args.before_dir.resolve(), "after": args.after_dir.resolve()}
    shared = [str(nodes), str(edges), args.mechanism, str(args.seeds)]
    procs = {
        label: subprocess.Popen(
            [sys.executable, "-c", SIDE, str(root), *shared],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for label, root in sides.items()
    }
    try:
        for label, proc in procs.items():
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"the {label} side did not start")
        seconds: dict[str, list[float]] = {label: [] for label in procs}
        labels = list(procs)
        for chunk in range(args.chunks):
            first = (chunk * args.size) % max(args.seeds - args.size, 1)
            for label in labels if chunk % 2 == 0 else labels[::-1]:
                proc = procs[label]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{first} {first + args.size}\n")
                proc.stdin.flush()
                seconds[label].append(float(proc.stdout.readline()))
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
    print(f"{args.mechanism}, n {nodes:,} m {edges:,}, chunks of {args.size} queries")
    for label, root in sides.items():
        print(summary(f"{label} ({root.name})", seconds[label]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
