"""Every process after the first finds the compiled kernels in numba's on-disk cache.

numba keys a cached function on its bytecode and on the pickle of its closure cells. A cell
that pickles differently in every process (a numba intrinsic or dispatcher does: its pickle
carries a per-process id) makes every process miss the cache, compile the kernel again (about
a second for the walk kernel) and add one more entry to the cache index.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

from numba.core.serialize import dumps

_CLOSURE_DIGESTS = """
import hashlib
from numba.core.serialize import dumps
from service.mechanisms import kernels
for kernel in kernels.cached_kernels():
    cells = tuple(cell.cell_contents for cell in kernel.py_func.__closure__ or ())
    print(kernel.py_func.__name__, hashlib.sha256(dumps(cells)).hexdigest())
"""


def _digests() -> list[str]:
    from service.mechanisms import kernels

    out = []
    for kernel in kernels.cached_kernels():
        cells = tuple(cell.cell_contents for cell in kernel.py_func.__closure__ or ())
        out.append(f"{kernel.py_func.__name__} {hashlib.sha256(dumps(cells)).hexdigest()}")
    return out


def test_the_kernels_closures_pickle_the_same_in_another_process() -> None:
    here = _digests()
    assert {line.split()[0] for line in here} >= {"walk_rows", "clip_rows", "sum_neighbour_rows"}
    there = subprocess.run(
        [sys.executable, "-c", _CLOSURE_DIGESTS], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert [line for line in there if line] == here
