"""How wide a campaign's confidence intervals will be: the 95 % Student-t half-width of the test
MAP@R over n reproductions from a spread ``s`` (:func:`half_width`). Also the smallest n that
reaches a width (:func:`reproductions_for`), and the spread itself (:func:`spread_of`). The spread
is measured from a study's tested reproductions in the store, pooled over the studies of the same
dataset and preset, or the reality check's typical spread (:data:`TYPICAL`), each marked as such.

Units: MAP@R **points** (percent, as the paper prints 26.53 ± 0.29), spreads too."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from mlrc.store.costs import ReproductionValue

__all__ = ["MODE", "TYPICAL", "Spread", "half_width", "reproductions_for", "spread_of"]

MODE = "concatenated"  # the reality check's headline numbers: the 512-D concatenation
LEVEL = 0.95
MAX_REPRODUCTIONS = 100_000  # searched for a target width; beyond: unreachable in practice


@dataclass(frozen=True)
class Spread:
    """The standard deviation (ddof 1) of the test MAP@R across reproductions, in points;
    ``source``: where it comes from; ``kind``: measured | pooled | typical."""

    s: float
    source: str
    kind: str


def _typical() -> Spread:
    """The reality check's CUB-200 contrastive MAP@R, 26.53 ± 0.29 at n = 10 (concatenated, its
    Table 4, as recalled in the project's notes): s = 0.29 · √10 / t(0.975, 9) ≈ 0.41 points.
    Its other half-widths are ≈ 0.1–0.7 points."""
    s = 0.29 * math.sqrt(10) / float(stats.t.ppf(0.975, 9))
    return Spread(
        s,
        "typical: the reality check's CUB-200 contrastive MAP@R ± 0.29 at n = 10 "
        f"(Musgrave et al. 2020, Table 4), s ≈ {s:.2f} points",
        "typical",
    )


TYPICAL = _typical()


def half_width(s: float, n: int, level: float = LEVEL) -> float:
    """Half-width of the two-sided Student-t interval over ``n`` ≥ 2 reproductions with sample
    standard deviation ``s``: t(0.5 + level/2, n − 1) · s / √n (units of ``s``)."""
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 reproductions, got {n}")
    return float(stats.t.ppf(0.5 + level / 2, n - 1) * s / math.sqrt(n))


def reproductions_for(s: float, target: float, level: float = LEVEL) -> int | None:
    """The smallest n ≥ 2 whose :func:`half_width` is at most ``target`` (units of ``s``); None
    when even :data:`MAX_REPRODUCTIONS` do not reach it. The half-width falls as n grows."""
    if target <= 0:
        raise ValueError(f"a target half-width must be positive, got {target}")
    n = np.arange(2, MAX_REPRODUCTIONS + 1)
    widths = stats.t.ppf(0.5 + level / 2, n - 1) * s / np.sqrt(n)
    reached = np.flatnonzero(widths <= target)
    return int(n[reached[0]]) if reached.size else None


def _std_points(values: Sequence[float]) -> float:
    return float(np.std(np.asarray(values, dtype=np.float64) * 100, ddof=1))


def spread_of(
    study: str,
    dataset: str,
    preset_key: str,
    values: Sequence[ReproductionValue],
    key_of: Callable[[dict[str, Any]], str],
) -> Spread:
    """The spread of study ``study``'s test MAP@R (:data:`MODE`): its own tested
    reproductions when it has ≥ 2; else the pooled standard deviation (√(Σ(nᵢ−1)sᵢ² / Σ(nᵢ−1)))
    of the studies of ``dataset`` with the same preset (``key_of(preset) == preset_key``) that
    have ≥ 2; else :data:`TYPICAL`."""
    by_study: dict[str, list[float]] = {}
    for v in values:
        if v.mode == MODE and v.dataset == dataset and key_of(v.preset) == preset_key:
            by_study.setdefault(v.study, []).append(v.map_at_r)
    own = by_study.get(study, [])
    if len(own) >= 2:
        return Spread(
            _std_points(own), f"measured: this study's {len(own)} tested reproductions", "measured"
        )
    others = {k: v for k, v in by_study.items() if len(v) >= 2}
    if not others:
        return TYPICAL
    dof = sum(len(v) - 1 for v in others.values())
    pooled = math.sqrt(sum((len(v) - 1) * _std_points(v) ** 2 for v in others.values()) / dof)
    return Spread(
        pooled,
        f"pooled: {len(others)} other {'study' if len(others) == 1 else 'studies'} of {dataset} "
        "with this preset "
        f"({dof + len(others)} reproductions)",
        "pooled",
    )
