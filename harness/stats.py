"""The one geomean: every ratio and rate aggregate in turbo-opt is taken with it."""

from __future__ import annotations

import math
from collections.abc import Iterable


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of the positive, finite values (NaN when there are none): a FAIL row's NaN or a
    missing measurement is left out rather than poisoning the aggregate."""
    good = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, good)) / len(good)) if good else math.nan
