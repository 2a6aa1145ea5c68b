"""Statistical checks the samplers' tests share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

import numpy as np
from scipy import stats


def homogeneity_p(first: list[Hashable], second: list[Hashable], floor: int = 10) -> float:
    """p-value of the chi-square test that two samples of categories have one law; categories
    with fewer than ``floor`` draws in both samples together are pooled into one."""
    a, b = Counter(first), Counter(second)
    keys = sorted(set(a) | set(b), key=repr)
    big = [k for k in keys if a[k] + b[k] >= floor]
    small = [k for k in keys if a[k] + b[k] < floor]
    table = [[a[k] for k in big], [b[k] for k in big]]
    if small:
        table[0].append(sum(a[k] for k in small))
        table[1].append(sum(b[k] for k in small))
    assert len(table[0]) >= 5, "too few categories for a meaningful test"
    return float(stats.chi2_contingency(np.array(table))[1])
