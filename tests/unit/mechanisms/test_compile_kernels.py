"""Unit tests of :mod:`service.mechanisms.compile_kernels` (run before the workers of every
``make test`` by tests/conftest.py; here its function is checked on its own)."""

from __future__ import annotations

import pytest

from service.mechanisms.compile_kernels import compile_kernels


@pytest.mark.parametrize("parallel", [False, True], ids=["one process", "two processes"])
def test_every_kernel_family_is_compiled_and_timed(parallel: bool) -> None:
    seconds = compile_kernels(parallel)
    assert set(seconds) == {
        "exact Laplace",
        "exact Bernoulli",
        "exact binomial",
        "discrete Gaussian",
        "diffusion engine",
        "PushFlowCap",
        "count rankings",
    }
    assert all(value >= 0 for value in seconds.values())


_LARGE_GRAPH_MISSES = """
from service.graph.generate import generate_graph
from service.mechanisms import kernels
from service.mechanisms.engine import warm_engine
graph = generate_graph(70_000, 140_000, seed=1)  # above COMPACT_INDEX_NODES: int32 indices
warm_engine(graph)
walks = [*kernels.step_kernels(), kernels.walk_column_kernel(), kernels.block_kernel()]
print(sum(len(kernel.stats.cache_misses) for kernel in walks))
"""


def test_a_graph_above_the_16_bit_limit_finds_its_walk_kernels_compiled() -> None:
    """compile_kernels (run before the suite) compiles the walk kernels for the graph's own
    int32 indices too, so a process serving a graph of more than 65,536 nodes loads them."""
    import subprocess
    import sys

    compile_kernels()
    misses = subprocess.run(
        [sys.executable, "-c", _LARGE_GRAPH_MISSES], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert misses == "0"
