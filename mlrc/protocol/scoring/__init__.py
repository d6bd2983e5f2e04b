"""Retrieval and verification metrics as plug-ins: a registry (``METRICS``, entry-point group
``mlrc.metrics``), :func:`parse_metrics` for ``"map_at_r,recall_at_k@10"`` and :func:`score`
for a query set against a reference set (PML's ``get_accuracy`` conventions).

Built-ins (one module each in :mod:`mlrc.protocol.scoring.builtin`): ``map_at_r``,
``precision_at_1``, ``r_precision``, ``recall_at_k@K``, ``map_at_k@K``, ``mrr`` (``mrr@K``),
``map_at_k_hits@K``, ``ndcg_at_k@K``, ``hierarchical_ndcg_at_k@K`` and
``hierarchical_ndcg_exp_at_k@K`` (need super labels) and ``fnmr_at_fmr@F``.
Formulas and conventions: docs/guide/metrics.md and :mod:`.engine`.
"""

from mlrc.protocol.scoring.base import (
    METRICS,
    Metric,
    MetricInfo,
    PairScores,
    Ranked,
    higher_is_better,
    parse_metrics,
    register,
)
from mlrc.protocol.scoring.engine import Scores, score, score_details
from mlrc.registry import import_submodules

import_submodules("mlrc.protocol.scoring.builtin")


def list_metrics() -> list[str]:
    """Registered metric names (built-in and plug-in), sorted."""
    return METRICS.available()


__all__ = [
    "METRICS",
    "Metric",
    "MetricInfo",
    "PairScores",
    "Ranked",
    "Scores",
    "higher_is_better",
    "list_metrics",
    "parse_metrics",
    "register",
    "score",
    "score_details",
]
