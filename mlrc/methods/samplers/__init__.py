"""Batch samplers (study key ``sampler: {name, params}``), as compared in the Revisiting paper (§3.2).

A sampler yields ``iterations`` batches of indices into the fold's training set per epoch; ``m`` is
the protocol's images per class for the loss (4 for pair losses, 1 for classification/proxy
losses). Memory-bank samplers (``needs_bank = True``) get the embeddings of every training image
once at the start of a fold (``set_bank``; eval transforms, current model) and the current batch's
embeddings after every iteration (``update``), as the reference code does. The bank is rebuilt,
not checkpointed, when a fold resumes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, ClassBalancedBatchSampler
from mlrc.registry import Registry, import_submodules

SAMPLERS: Registry[BatchSampler] = Registry("sampler", group="mlrc.samplers")

available = SAMPLERS.available
params = SAMPLERS.params  # accepted parameters beyond the common ones, with defaults


def build(
    name: str,
    labels: np.ndarray,
    batch_size: int,
    m: int,
    iterations: int,
    seed: int,
    **kwargs: Any,
) -> BatchSampler:
    return SAMPLERS.build(name, labels, batch_size, m, iterations, seed, **kwargs)


@SAMPLERS.register("m_per_class")
def m_per_class(labels, batch_size, m, iterations, seed) -> BatchSampler:
    """SPC-m, the protocol's default: batch_size/m distinct classes × m images each."""
    return ClassBalancedBatchSampler(labels, batch_size, m, iterations, seed)


# Every module of this package registers its samplers on import.
import_submodules(__name__)

__all__ = ["SAMPLERS", "BatchSampler", "ClassBalancedBatchSampler", "available", "build", "params"]
