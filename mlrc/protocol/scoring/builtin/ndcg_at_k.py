"""NDCG@k (Järvelin & Kekäläinen, TOIS 2002), linear gains as scikit-learn's ``ndcg_score``.

Hierarchical NDCG (classes nested in super-classes) names its gain: ``hierarchical_ndcg_at_k``
(the default, and what stored values mean) gives the graded level itself — 2 for the query's
class, 1 for another class of its super-class, 0 else (Järvelin & Kekäläinen's cumulated gain
of graded relevance); ``hierarchical_ndcg_exp_at_k`` gives 2^level − 1 — 3, 1, 0 — the
exponential gain of Burges et al. (ICML 2005) that the hierarchical-retrieval work on SOP uses
(HAPPIER, Ramzi et al., ECCV 2022: ``happier/engine/metrics.py``, ``ndcg``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    """NDCG@k, graded, linear gain: the level, 2 for the query's class and super-class, 1 for
    one of them, else 0.

    With classes nested in super-classes (SOP's 12 categories) the gain is 2 for the same
    class, 1 for another class of the same super-class; IDCG sorts every reference item's gain.
    """
    return _hierarchical(ranked, k, lambda level: level)


@register(
    "hierarchical_ndcg_exp_at_k",
    depth="k",
    param="k",
    key="hierarchical_ndcg_exp_at_{k}",
    needs={"super_labels"},
)
def hierarchical_ndcg_exp_at_k(ranked: Ranked, *, k: Count) -> np.ndarray:
    """NDCG@k, graded, exponential gain 2^level − 1: 3 for the query's class, 1 for another
    class of its super-class, else 0 (HAPPIER's NDCG on SOP)."""
    return _hierarchical(ranked, k, lambda level: 2.0**level - 1.0)


def _hierarchical(ranked: Ranked, k: int, gain_of: Callable[[Any], Any]) -> np.ndarray:
    """DCG@k / IDCG@k with gain ``gain_of(level)``, level = 𝟙[class] + 𝟙[super-class]."""
    assert ranked.super_rel is not None and ranked.S is not None and ranked.both is not None
    level = ranked.rel[:, :k] + ranked.super_rel[:, :k]
    two, one = ranked.both, ranked.R + ranked.S - 2.0 * ranked.both
    i = np.arange(1, k + 1, dtype=np.float64)[None, :]
    ideal = np.where(i <= two[:, None], 2.0, np.where(i <= (two + one)[:, None], 1.0, 0.0))
    return _dcg(gain_of(level.astype(np.float64))) / _dcg(gain_of(ideal))


def _dcg(gain: np.ndarray) -> np.ndarray:
    """Σ_i g(i) / log₂(i + 1) of each row (ranks 1, 2, …)."""
    return (gain / np.log2(np.arange(2, gain.shape[1] + 2, dtype=np.float64))).sum(1)
