"""The per-coordinate bound on what numpy's float64 exponential sampler can add to a rounded
Laplace release (docs/privacy.md, "The Laplace sampler and its stated delta").

    .venv/bin/python benchmarks/laplace_sampler_bound.py

Reads numpy's ziggurat tables (numba's copy, the ones the serving sampler runs) and prints
each term of the coupling bound of one draw E (real) against E* ~ Exp(1) (ideal), then the
bound tau on P(round(b' S E / g) != round(b' S E* / g)) for cells of width >= 1/1024 in units
of the scale, which ``service.privacy.sampler.TAU_PER_COORDINATE`` must cover.
"""

from __future__ import annotations

import itertools

import mpmath as mp
import numpy as np
from numba.np.random import _constants as tables

mp.mp.dps = 40
U = mp.mpf(2) ** -53
KE = [int(k) for k in np.asarray(tables.ke_double, dtype=np.uint64)]
WE = [mp.mpf(float(w)) for w in tables.we_double]
FE = [mp.mpf(float(f)) for f in tables.fe_double]
R = mp.mpf(float(tables.ziggurat_exp_r))
X = [w * 2**53 for w in WE]  # layer widths (exact: a power-of-two scaling of a double)
T = [KE[i] * WE[i] for i in range(256)]  # end of each layer's fast region (exact)
CELLS_PER_UNIT = 1024  # cells of the grid are >= 1/1024 scale wide (docs/privacy.md)
TAIL_CUT = R + 30  # beyond this the coupling of the tail is counted as failed


def continuous_tv() -> tuple[mp.mpf, mp.mpf]:
    """(acceptance probability of one attempt, TV to Exp(1)) of the continuous ziggurat with
    these double tables and exact arithmetic (the tables' own inaccuracy)."""
    points = sorted({mp.mpf(0), R, *T, *X[1:]})
    pieces = []  # (a, b, alpha, beta): sub-density alpha + beta e^-x on [a, b)

    def density_parts(x: mp.mpf) -> tuple[mp.mpf, mp.mpf]:
        alpha, beta = mp.mpf(0), mp.mpf(0)
        for i in range(1, 256):
            if x < T[i]:
                alpha += 1 / (256 * X[i])
            elif x < X[i]:
                d = FE[i - 1] - FE[i]
                alpha += -FE[i] / (256 * X[i] * d)
                beta += 1 / (256 * X[i] * d)
        if x < T[0]:
            alpha += 1 / (256 * X[0])
        if x >= R:
            beta += (1 - T[0] / X[0]) / 256 * mp.e**R
        return alpha, beta

    for a, b in itertools.pairwise(points):
        pieces.append((a, b, *density_parts((a + b) / 2)))
    tail_alpha, tail_beta = density_parts(points[-1] + 1)
    mass = sum(al * (b - a) + be * (mp.e**-a - mp.e**-b) for a, b, al, be in pieces)
    mass += tail_beta * mp.e ** -points[-1]
    assert tail_alpha == 0
    tv = mp.mpf(0)
    for a, b, al, be in pieces:
        al, be = al / mass, be / mass - 1  # h(x) = al + be e^-x, normalised minus Exp(1)
        cuts = [a, b]
        if be != 0 and -al / be > 0:
            root = -mp.log(-al / be)
            if a < root < b:
                cuts = [a, root, b]
        for lo, hi in itertools.pairwise(cuts):
            tv += abs(al * (hi - lo) + be * (mp.e**-lo - mp.e**-hi))
    tv += abs(tail_beta / mass - 1) * mp.e ** -points[-1]
    return mass, tv / 2


def main() -> None:
    acceptance, tv_tables = continuous_tv()
    attempts = 1 / acceptance
    # wedge attempts whose accept decision may differ from the ideal's: the 53-bit u, the
    # lattice offset (<= w_i) of x, and the roundings of (fe[i-1] - fe[i]) u + fe[i] and exp(-x)
    wedge_fail = mp.mpf(0)
    for i in range(1, 256):
        d = FE[i - 1] - FE[i]
        share = (X[i] - T[i]) / X[i] / 256
        wedge_fail += share * (U + (WE[i] + 4 * U) * FE[i - 1] / d)
    gap = 256 * U / 256  # the sliver [ke_i w_i, x_{i-1}) decided by the wedge: <= one point
    tail_fail = (1 - T[0] / X[0]) / 256 * mp.e ** -(TAIL_CUT - R)
    fail = (wedge_fail + gap + tail_fail) * attempts + tv_tables
    # crossings: the real and the ideal draw fall in different cells
    body_offset = max(WE) + 2 * U * (R + 1)  # lattice offset + the rounding of b' E
    body = 2 * body_offset * (CELLS_PER_UNIT + 2)
    tail_cells = CELLS_PER_UNIT * (TAIL_CUT - R) + 1
    p_tail = (1 - T[0] / X[0]) / 256
    tail = tail_cells * 2 * U * p_tail * mp.mpf("1.01") * attempts
    tail += 6 * U * TAIL_CUT * (CELLS_PER_UNIT * mp.e**-R + 1)
    tau = fail + body + tail
    rows = [
        ("acceptance of one attempt", acceptance),
        ("TV of the tables' continuous ziggurat to Exp(1)", tv_tables),
        ("wedge decisions that may differ (per draw)", wedge_fail * attempts),
        ("tail beyond r + 30 (per draw)", tail_fail * attempts),
        ("cell crossings in the body (per draw)", body),
        ("cell crossings in the tail (per draw)", tail),
        ("tau: per rounded coordinate", tau),
    ]
    for name, value in rows:
        print(f"{name:52s} {mp.nstr(value, 6)}")


if __name__ == "__main__":
    main()
