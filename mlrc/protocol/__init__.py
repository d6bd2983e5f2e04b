"""Pure protocol functions (no training, no store): splits, retrieval metrics, statistics.

Modules: :mod:`~mlrc.protocol.splits` (class-disjoint folds), :mod:`~mlrc.protocol.metrics`
(MAP@R, R-Precision, P@1), :mod:`~mlrc.protocol.knn` (the exact k-NN search they read),
:mod:`~mlrc.protocol.stats` (confidence intervals), :mod:`~mlrc.protocol.analysis` (Recall@k,
NMI, mAP@1000, ρ, π_ratio, utilization; imported on its own: it needs faiss and sklearn) and
:mod:`~mlrc.protocol.retrieval` (the dashboard's sample retrievals and embedding map; imported on
its own) and :mod:`~mlrc.protocol.scoring` (every metric as a plug-in, query → reference;
imported on its own).
"""

from mlrc.protocol.knn import exact_knn, exact_neighbours, full_fp32_matmul, ranked_vectors
from mlrc.protocol.metrics import METRICS, concatenate_embeddings, retrieval_metrics
from mlrc.protocol.splits import Fold, Split, SplitError, mlrc_split
from mlrc.protocol.stats import confidence_interval

__all__ = [
    "METRICS",
    "Fold",
    "Split",
    "SplitError",
    "concatenate_embeddings",
    "confidence_interval",
    "exact_knn",
    "exact_neighbours",
    "full_fp32_matmul",
    "mlrc_split",
    "ranked_vectors",
    "retrieval_metrics",
]
