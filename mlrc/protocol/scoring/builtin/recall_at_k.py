"""Recall@K as deep metric learning reports it (Jégou et al. 2011; Oh Song et al. 2016)."""

from __future__ import annotations

import numpy as np

from mlrc.params import Count
from mlrc.protocol.scoring.base import Ranked, register


@register("recall_at_k", depth="k", param="k", key="recall_at_{k}")
def recall_at_k(ranked: Ranked, *, k: Count) -> np.ndarray:
    """Recall@K: 1 if any of the K nearest reference items is relevant, else 0 (a hit rate)."""
    return ranked.rel[:, :k].max(1)  # R@K = 𝟙[∃ i ≤ K: rel(i) = 1]
