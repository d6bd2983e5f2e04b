"""mAP@k, two conventions, each under its own name (they differ when fewer than min(k, R)
relevant items are in the top k):

- ``map_at_k``: (1/min(k, R)) Σ_{i≤k} P(i)·rel(i) — OpenMetricLearning's ``map@k`` up to 0.3.10
  (``oml.functional.metrics.calc_map``), and the usual truncated AP; a stored ``map_at_k``
  keeps this meaning.
- ``map_at_k_hits``: (1/n_k) Σ_{i≤k} P(i)·rel(i), n_k the relevant items in the top k (0 when
  none) — OpenMetricLearning's ``map@k`` since 0.3.11 (commit eb7abcd9, "Change MAP formula")."""

from __future__ import annotations

import numpy as np

from mlrc.params import Count
from mlrc.protocol.scoring.base import Ranked, register


@register("map_at_k", depth="k", param="k", key="map_at_{k}")
def map_at_k(ranked: Ranked, *, k: Count) -> np.ndarray:
    """mAP@k over min(k, R): (1/min(k, R)) Σ_{i≤k} P(i)·rel(i); 1 when the top min(k, R) are
    all relevant (OpenMetricLearning ≤ 0.3.10's map@k)."""
    rel = ranked.rel[:, :k]
    return _precision_sum(rel) / np.minimum(k, ranked.R)


@register("map_at_k_hits", depth="k", param="k", key="map_at_k_hits_{k}")
def map_at_k_hits(ranked: Ranked, *, k: Count) -> np.ndarray:
    """mAP@k over the hits: (1/n_k) Σ_{i≤k} P(i)·rel(i), n_k = Σ_{i≤k} rel(i), 0 when n_k = 0
    (OpenMetricLearning ≥ 0.3.11's map@k): 1 whenever every hit precedes every miss."""
    rel = ranked.rel[:, :k]
    hits = rel.sum(1)
    return np.where(hits > 0, _precision_sum(rel) / np.maximum(hits, 1), 0.0)


def _precision_sum(rel: np.ndarray) -> np.ndarray:
    """Σ_{i≤k} P(i)·rel(i) of each row, P(i) the precision of the first i."""
    precision = rel.cumsum(1) / np.arange(1, rel.shape[1] + 1)
    return (precision * rel).sum(1)
