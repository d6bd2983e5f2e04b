"""P@1: the nearest reference item is relevant (Recall@1 of the DML literature)."""

from __future__ import annotations

import numpy as np

from mlrc.protocol.metrics import precision_at_1 as _rel_1
from mlrc.protocol.scoring.base import Ranked, register


@register("precision_at_1", depth=1)
def precision_at_1(ranked: Ranked) -> np.ndarray:
    """P@1: 1 if the nearest reference item shares the query's class, else 0."""
    return _rel_1(ranked.rel)  # P@1 = rel(1)
