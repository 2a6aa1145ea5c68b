"""A refund subtracts its curve from an exposure shard's total: the difference stays an upper
bound on what is left even when the refunded curve dwarfs it (the total was rounded to an ulp of
the larger sum)."""

from __future__ import annotations

import numpy as np

from service.ledger.ledger_rows import subtract_up
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve


def test_removing_a_large_curve_leaves_an_upper_bound_on_the_small_one() -> None:
    rng = np.random.default_rng(5)
    understated = 0
    for _ in range(300):
        small = laplace_curve(float(rng.uniform(1e-4, 1e-2)))
        large = laplace_curve(float(rng.uniform(1.0, 50.0))) * int(rng.integers(1, 5000))
        total = small + large
        left = subtract_up(total, large)
        assert np.all(left.rdp >= small.rdp) and left.pure >= small.pure
        naive = np.nextafter(total.rdp - large.rdp, np.inf)  # the rounding up of before
        understated += int(np.any(naive < small.rdp))
    assert understated > 0, "no pair where the old rounding understated: no control"


def test_a_small_removal_is_still_tight() -> None:
    a, b = laplace_curve(0.3), laplace_curve(0.2)
    left = subtract_up(a + b, b)
    assert np.allclose(left.rdp, a.rdp, rtol=1e-12) and abs(left.pure - a.pure) < 1e-12
    assert isinstance(left, RdpCurve)
