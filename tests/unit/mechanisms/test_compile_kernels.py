"""Unit tests of :mod:`service.mechanisms.compile_kernels` (run before the workers of every
``make test`` by tests/conftest.py; here its function is checked on its own)."""

from __future__ import annotations

from service.mechanisms.compile_kernels import compile_kernels


def test_every_kernel_family_is_compiled_and_timed() -> None:
    seconds = compile_kernels()
    assert set(seconds) == {
        "exact Laplace",
        "exact Bernoulli",
        "discrete Gaussian",
        "diffusion engine",
        "PushFlowCap",
    }
    assert all(value >= 0 for value in seconds.values())
