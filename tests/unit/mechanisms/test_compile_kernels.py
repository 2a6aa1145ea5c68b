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
