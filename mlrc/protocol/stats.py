"""Confidence intervals over reproductions, as the reality check reports them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def confidence_interval(
    values: Sequence[float] | np.ndarray, level: float = 0.95
) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t interval over n reproductions.

    half_width = t(0.5 + level/2, n − 1) · s / √n, with s the sample standard deviation (ddof = 1).
    Units are those of ``values`` (fractions in, fractions out). Raises ``ValueError`` for n < 2
    (no spread can be estimated from one reproduction), for non-finite values and for a level
    outside (0, 1).
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    if x.size < 2:
        raise ValueError(f"a confidence interval needs at least 2 reproductions, got {x.size}")
    if not np.isfinite(x).all():
        raise ValueError("confidence interval over non-finite values")
    n = x.size
    s = x.std(ddof=1)
    half_width = float(stats.t.ppf(0.5 + level / 2, n - 1) * s / np.sqrt(n))
    return float(x.mean()), half_width
