"""Batch samplers (study key ``sampler: {name, params}``), as compared in the Revisiting paper (§3.2).

A sampler yields ``iterations`` batches of indices into the fold's training set per epoch; ``m`` is
the protocol's images per class for the loss (4 for pair losses, 1 for classification/proxy
losses). Memory-bank samplers (``needs_bank = True``) get the embeddings of every training image
once at the start of a fold (``set_bank``; eval transforms, current model) and the current batch's
embeddings after every iteration (``update``), as the reference code does. The bank is rebuilt,
not checkpointed, when a fold resumes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, ClassBalancedBatchSampler
from mlrc.registry import Registry

SAMPLERS: Registry[Callable[..., BatchSampler]] = Registry("sampler")


def available() -> list[str]:
    return SAMPLERS.available()


def params(name: str) -> dict[str, Any]:
    """Accepted parameters of sampler ``name`` beyond the common ones, with defaults."""
    sig = inspect.signature(SAMPLERS.get(name))
    return {k: p.default for k, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY}


def build(
    name: str,
    labels: np.ndarray,
    batch_size: int,
    m: int,
    iterations: int,
    seed: int,
    **kwargs: Any,
) -> BatchSampler:
    unknown = sorted(set(kwargs) - set(params(name)))
    if unknown:
        raise TypeError(f"sampler {name!r} takes no parameter {', '.join(map(repr, unknown))}")
    return SAMPLERS.get(name)(labels, batch_size, m, iterations, seed, **kwargs)


@SAMPLERS.register("m_per_class")
def m_per_class(labels, batch_size, m, iterations, seed) -> BatchSampler:
    """SPC-m, the protocol's default: batch_size/m distinct classes × m images each."""
    return ClassBalancedBatchSampler(labels, batch_size, m, iterations, seed)


from mlrc.methods.samplers import memory_bank as _memory_bank  # noqa: E402,F401
from mlrc.methods.samplers import spc_random as _spc_random  # noqa: E402,F401

__all__ = ["SAMPLERS", "BatchSampler", "ClassBalancedBatchSampler", "available", "build", "params"]
