"""Pure protocol functions (no training, no store): splits, retrieval metrics, statistics."""

from mlrc.protocol.metrics import concatenate_embeddings, retrieval_metrics
from mlrc.protocol.splits import Fold, Split, SplitError, mlrc_split
from mlrc.protocol.stats import confidence_interval

__all__ = [
    "Fold",
    "Split",
    "SplitError",
    "concatenate_embeddings",
    "confidence_interval",
    "mlrc_split",
    "retrieval_metrics",
]
