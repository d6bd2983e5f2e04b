"""The fold trainer: train one fold until validation MAP@R stops improving, with checkpoints to
resume from. Knows nothing of Optuna or the store.

- :mod:`~mlrc.train.loop`: :func:`train_fold`, the fold loop as small named steps;
- :mod:`~mlrc.train.setup`: building the model, loss, optimisers, sampler and loaders of a fold;
- :mod:`~mlrc.train.checkpoint`: ``last.pt`` / ``best.pt``, written all or nothing;
- :mod:`~mlrc.train.embed`: dataset views and embedding them;
- :mod:`~mlrc.train.model`: the trunk → embedder network;
- :mod:`~mlrc.train.export`: a study's model for use outside mlrc;
- :mod:`~mlrc.train.distributed`: the pieces of a fold trained as K ``torch.distributed``
  processes (distributed batch sampler, embedding gather, synced BatchNorm);
- :mod:`~mlrc.train.spec`: :class:`FoldSpec`, :class:`EpochRecord`, :class:`FoldResult`.
"""

from mlrc.train.checkpoint import CheckpointError
from mlrc.train.embed import IndexedView, View, embed
from mlrc.train.export import EmbeddingModel, OnnxExportError, export_model, load_exported
from mlrc.train.loop import FoldRun, train_fold
from mlrc.train.model import (
    AMP_DTYPES,
    UNTRAINED_SEED,
    Model,
    build_model,
    load_model,
    untrained_trunk,
)
from mlrc.train.setup import FoldParts, build_fold, fold_inputs, loader_options, make_loaders
from mlrc.train.spec import NONFINITE, EpochRecord, FoldResult, FoldSpec, trained_best

__all__ = [
    "AMP_DTYPES",
    "NONFINITE",
    "UNTRAINED_SEED",
    "CheckpointError",
    "EmbeddingModel",
    "EpochRecord",
    "FoldParts",
    "FoldResult",
    "FoldRun",
    "FoldSpec",
    "OnnxExportError",
    "IndexedView",
    "Model",
    "View",
    "build_fold",
    "build_model",
    "embed",
    "export_model",
    "load_exported",
    "load_model",
    "fold_inputs",
    "loader_options",
    "make_loaders",
    "trained_best",
    "train_fold",
    "untrained_trunk",
]
