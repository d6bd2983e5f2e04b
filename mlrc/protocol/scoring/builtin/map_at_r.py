"""MAP@R (Musgrave et al., "A Metric Learning Reality Check", ECCV 2020)."""

from __future__ import annotations

import numpy as np

from mlrc.protocol.metrics import average_precision_at_r
from mlrc.protocol.scoring.base import Ranked, register


@register("map_at_r", depth="R")
def map_at_r(ranked: Ranked) -> np.ndarray:
    """MAP@R: mean over queries of (1/R) Σ_{i≤R} P(i)·rel(i), R = relevant reference items."""
    # AP@R = (1/R) Σ_{i≤R} P(i)·rel(i),  P(i) = (1/i) Σ_{j≤i} rel(j)
    return average_precision_at_r(ranked.rel, ranked.R)
