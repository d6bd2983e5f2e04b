"""mAP@k: average precision truncated at rank k (as OpenMetricLearning's map@k)."""

from __future__ import annotations

import numpy as np

from mlrc.params import Count
from mlrc.protocol.scoring.base import Ranked, register


@register("map_at_k", depth="k", param="k", key="map_at_{k}")
def map_at_k(ranked: Ranked, *, k: Count) -> np.ndarray:
    """mAP@k: (1/min(k, R)) Σ_{i≤k} P(i)·rel(i); 1 when the top min(k, R) are all relevant."""
    rel = ranked.rel[:, :k]
    precision = rel.cumsum(1) / np.arange(1, rel.shape[1] + 1)  # P(i)
    # AP@k = (1/min(k, R)) Σ_{i≤k} P(i)·rel(i)
    return (precision * rel).sum(1) / np.minimum(k, ranked.R)
