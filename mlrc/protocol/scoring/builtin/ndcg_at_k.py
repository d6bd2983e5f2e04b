"""NDCG@k (Järvelin & Kekäläinen, TOIS 2002), linear gains as scikit-learn's ``ndcg_score``."""

from __future__ import annotations

import numpy as np

from mlrc.params import Count
from mlrc.protocol.scoring.base import Ranked, register


@register("ndcg_at_k", depth="k", param="k", key="ndcg_at_{k}")
def ndcg_at_k(ranked: Ranked, *, k: Count) -> np.ndarray:
    """NDCG@k, binary relevance by class: DCG@k / IDCG@k, gain rel(i) ∈ {0, 1}."""
    rel = ranked.rel[:, :k]
    ideal = (np.arange(1, k + 1)[None, :] <= ranked.R[:, None]).astype(np.float64)
    return _dcg(rel) / _dcg(ideal)  # NDCG@k = Σ_{i≤k} g(i)/log₂(i+1) ÷ the same, sorted


@register(
    "hierarchical_ndcg_at_k",
    depth="k",
    param="k",
    key="hierarchical_ndcg_at_{k}",
    needs={"super_labels"},
)
def hierarchical_ndcg_at_k(ranked: Ranked, *, k: Count) -> np.ndarray:
    """NDCG@k, graded: gain 2 for the query's class and super-class, 1 for one of them, else 0.

    With classes nested in super-classes (SOP's 12 categories) the gain is 2 for the same
    class, 1 for another class of the same super-class; IDCG sorts every reference item's gain.
    """
    assert ranked.super_rel is not None and ranked.S is not None and ranked.both is not None
    gain = ranked.rel[:, :k] + ranked.super_rel[:, :k]  # g(i) = 𝟙[class] + 𝟙[super-class]
    two, one = ranked.both, ranked.R + ranked.S - 2.0 * ranked.both
    i = np.arange(1, k + 1, dtype=np.float64)[None, :]
    ideal = np.where(i <= two[:, None], 2.0, np.where(i <= (two + one)[:, None], 1.0, 0.0))
    return _dcg(gain) / _dcg(ideal)


def _dcg(gain: np.ndarray) -> np.ndarray:
    """Σ_i g(i) / log₂(i + 1) of each row (ranks 1, 2, …)."""
    return (gain / np.log2(np.arange(2, gain.shape[1] + 2, dtype=np.float64))).sum(1)
