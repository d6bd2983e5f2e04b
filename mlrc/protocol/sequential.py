"""A fully sequential elimination test with an indifference zone (Kim & Nelson 2001), for the
paired fold differences of a trial against the incumbent. Pure functions of floats.

A trial's folds end one by one. After ``r`` of them, with ``d_k`` = the trial's fold value minus
the incumbent's on the same fold k (validation MAP@R, a fraction; higher is better), the trial
is eliminated when its sum of differences falls below the continuation region:

    Σ_{k≤r} d_k  <  −max(0, h² s² / (2δ) − δ r / 2)          (Kim & Nelson 2001, eq. 1–2)

- ``δ`` (delta): the indifference zone — a difference smaller than δ does not matter;
- ``s²``: the variance of one paired difference, pooled from the study's complete trials
  (:func:`pooled_variance`), with ``df`` degrees of freedom;
- ``h² = df · ((2α)^(−2/df) − 1)`` (KN's constant for two systems, ``n0 − 1 = df``): a trial
  whose mean is better than the incumbent's by δ or more is eliminated with probability at most
  ``α``. A trial within δ may be eliminated: the choice then loses at most δ.

The region is a triangle: wide after the first fold (only a clearly bad trial leaves), closing
as folds accumulate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["eliminated", "h_squared", "pooled_variance", "region"]


def h_squared(alpha: float, df: int) -> float:
    """KN's constant ``h²`` for two systems with ``df`` degrees of freedom in ``s²`` and error
    ``α`` (0 < α < 0.5); its limit for ``df → ∞`` is ``−2 ln(2α)``."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5) (got {alpha})")
    if df < 1:
        raise ValueError(f"df must be ≥ 1 (got {df})")
    return df * ((2 * alpha) ** (-2 / df) - 1)


def region(r: int, s2: float, delta: float, alpha: float, df: int) -> float:
    """The half-width of the continuation region after ``r`` stages (folds):
    ``max(0, h² s² / (2δ) − δ r / 2)``, in the units of the differences' sum."""
    if delta <= 0:
        raise ValueError(f"delta must be > 0 (got {delta})")
    return max(0.0, h_squared(alpha, df) * s2 / (2 * delta) - delta * r / 2)


def eliminated(diffs: Sequence[float], s2: float, delta: float, alpha: float, df: int) -> bool:
    """True when the sum of ``diffs`` (trial − incumbent, fold by fold) is below the region."""
    return sum(diffs) < -region(len(diffs), s2, delta, alpha, df)


def pooled_variance(groups: Iterable[Sequence[float]]) -> tuple[float, int]:
    """The pooled within-group variance of ``groups`` (each a trial's paired fold differences)
    and its degrees of freedom: ``Σ_j Σ_k (d_jk − d̄_j)² / Σ_j (n_j − 1)``; groups of one value
    add nothing. (nan, 0) without any degree of freedom."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) < 2:
            continue
        mean = math.fsum(g) / len(g)
        ss += math.fsum((x - mean) ** 2 for x in g)
        df += len(g) - 1
    return (ss / df, df) if df else (math.nan, 0)
