"""Mean reciprocal rank (Voorhees, TREC-8 QA track, 1999)."""

from __future__ import annotations

import numpy as np

from mlrc.params import Count, ParamType, Range
from mlrc.protocol.scoring.base import Ranked, register


@register(
    "mrr",
    depth="k",
    param="k",
    key="mrr_at_{k}",
    key_without="mrr",
    param_type=ParamType("integer", range=Range(ge=1)),
)
def mrr(ranked: Ranked, *, k: Count | None = None) -> np.ndarray:
    """MRR: 1/rank of the first relevant reference item (0 if none in the top k; no k: all)."""
    rel = ranked.rel if k is None else ranked.rel[:, :k]
    hit = rel.any(1)
    first = rel.argmax(1) + 1.0  # rank of the first relevant item
    return np.where(hit, 1.0 / first, 0.0)  # RR = 1 / rank_first
