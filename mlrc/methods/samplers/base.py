"""The batch-sampler interface and SPC-m, with an explicit, checkpointable random state."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import numpy as np


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
