"""The batch-sampler interface (:class:`BatchSampler`, with an explicit, checkpointable random
state), its registration metadata (:class:`SamplerInfo`) and the registry ``SAMPLERS``.

Batch samplers are a study's ``sampler: {name, params}``, as compared in the Revisiting paper
(§3.2). A sampler yields ``iterations`` batches of indices into the fold's training set per
epoch; ``m`` is the protocol's images per class for the loss (4 for pair losses, 1 for
classification/proxy losses). Memory-bank samplers (``needs_bank = True``) get the embeddings of
every training image once at the start of a fold (``set_bank``; eval transforms, current model)
and the current batch's embeddings after every iteration (``update``), as the reference code
does. The bank is rebuilt, not checkpointed, when a fold resumes.

A sampler's factory takes ``(labels, batch_size, m, iterations, seed)`` positionally (mlrc passes
them) and its own parameters as keyword-only arguments with defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrc.registry import Entry, Registry


class BatchSampler:
    """Yields ``iterations`` lists of training-set indices per epoch; state is checkpointable."""

    needs_bank = False  # True: wants set_bank()/update() with training-set embeddings

    def __init__(self, labels: Sequence[int] | np.ndarray, iterations: int, seed: int) -> None:
        self.labels = np.asarray(labels)
        self.iterations = iterations
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.iterations

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.iterations):
            yield self.next_batch()

    def next_batch(self) -> list[int]:
        raise NotImplementedError

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state

    def set_bank(self, embeddings) -> None:  # noqa: B027 (optional hook)
        """Embeddings (n × d) of every training item, in training-set order."""

    def update(self, indices, embeddings) -> None:  # noqa: B027 (optional hook)
        """Overwrite the bank rows of ``indices`` with the current batch's embeddings."""


@dataclass(frozen=True, kw_only=True)
class SamplerInfo(Entry):
    """What mlrc knows about a sampler without building it: its own parameters (beyond the common
    ones), their defaults and declared types (the fields of :class:`mlrc.registry.Entry`)."""


SAMPLERS: Registry[BatchSampler] = Registry("sampler", group="mlrc.samplers", entry=SamplerInfo)

available = SAMPLERS.available
info: Callable[[str], SamplerInfo] = SAMPLERS.info
params = SAMPLERS.params  # accepted parameters beyond the common ones, with defaults


def register(
    name: str, **meta: Any
) -> Callable[[Callable[..., BatchSampler]], Callable[..., BatchSampler]]:
    """Decorator for ``factory(labels, batch_size, m, iterations, seed, **params)``."""
    return SAMPLERS.register(name, **meta)


def build(
    name: str,
    labels: np.ndarray,
    batch_size: int,
    m: int,
    iterations: int,
    seed: int,
    **kwargs: Any,
) -> BatchSampler:
    """Sampler ``name`` over ``labels`` (the fold's training labels): ``iterations`` batches of
    ``batch_size`` indices per epoch, ``m`` images per class where it applies, seeded by ``seed``."""
    return SAMPLERS.build(name, labels, batch_size, m, iterations, seed, **kwargs)
