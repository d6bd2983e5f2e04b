"""SPC-m, the protocol's default sampler (``m_per_class``): batch_size/m classes × m images."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, register


class ClassBalancedBatchSampler(BatchSampler):
    """Batches of ``classes_per_batch`` distinct classes × ``m`` images each.

    Pair-based losses use m = 4 (8 classes × 4 = 32), classification/proxy losses m = 1
    (32 classes × 1). A class with fewer than m images is sampled with replacement. If there are
    fewer classes than a batch wants, every batch uses all of them (with a warning); fewer than
    2 classes is an error. ``state()`` / ``set_state()`` make a resumed run draw the same batches.
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray,
        batch_size: int,
        m: int,
        iterations: int,
        seed: int,
    ) -> None:
        super().__init__(labels, iterations, seed)
        self.classes, inverse = np.unique(self.labels, return_inverse=True)
        if len(self.classes) < 2:
            raise ValueError(f"a training fold needs at least 2 classes, got {len(self.classes)}")
        if m < 1 or batch_size < m:
            raise ValueError(f"batch size {batch_size} and images per class {m} do not fit")
        self.m = m
        self.classes_per_batch = batch_size // m
        if len(self.classes) < self.classes_per_batch:
            warnings.warn(
                f"only {len(self.classes)} training classes for batches of "
                f"{self.classes_per_batch} classes × {m}: using all {len(self.classes)} classes "
                f"(batch size {len(self.classes) * m})",
                stacklevel=2,
            )
            self.classes_per_batch = len(self.classes)
        self.by_class = [np.flatnonzero(inverse == c) for c in range(len(self.classes))]

    def next_batch(self) -> list[int]:
        chosen = self.rng.choice(len(self.by_class), self.classes_per_batch, replace=False)
        return self.fill(chosen)

    def fill(self, classes: Sequence[int], with_first: Sequence[int] | None = None) -> list[int]:
        """m images of each class position in ``classes`` (the first one given, if any)."""
        batch = []
        for j, c in enumerate(classes):
            pool = self.by_class[c]
            if with_first is None:
                batch += self.rng.choice(pool, self.m, replace=len(pool) < self.m).tolist()
            else:
                batch.append(int(with_first[j]))
                if self.m > 1:
                    batch += self.rng.choice(
                        pool, self.m - 1, replace=len(pool) < self.m - 1
                    ).tolist()
        return batch


@register("m_per_class")
def m_per_class(labels, batch_size, m, iterations, seed) -> BatchSampler:
    """SPC-m, the protocol's default: batch_size/m distinct classes × m images each."""
    return ClassBalancedBatchSampler(labels, batch_size, m, iterations, seed)
