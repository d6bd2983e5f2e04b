"""R-Precision (Musgrave et al. 2020; Manning et al., "Introduction to IR", §8.4)."""

from __future__ import annotations

import numpy as np

from mlrc.protocol.metrics import r_precision as _r_precision
from mlrc.protocol.scoring.base import Ranked, register


@register("r_precision", depth="R")
def r_precision(ranked: Ranked) -> np.ndarray:
    """R-Precision: the fraction of the R nearest reference items that are relevant."""
    return _r_precision(ranked.rel, ranked.R)  # RP = (1/R) Σ_{i≤R} rel(i)
