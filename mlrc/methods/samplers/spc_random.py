"""SPC-R (Revisiting DML §3.2; notes/000 §3.1, the reference code's ``random`` class sampler)."""

from __future__ import annotations

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, register


class SPCRandom(BatchSampler):
    """b − 1 items drawn class-uniformly (a random class, then a random item of it, as the
    reference code does rather than item-uniformly), then a last item from the class of one of
    those b − 1, so every batch holds at least one positive pair; the number of distinct classes
    varies from batch to batch."""

    def __init__(self, labels, batch_size: int, iterations: int, seed: int) -> None:
        super().__init__(labels, iterations, seed)
        classes, inverse = np.unique(self.labels, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"a training fold needs at least 2 classes, got {len(classes)}")
        self.by_class = [np.flatnonzero(inverse == c) for c in range(len(classes))]
        self.class_of = inverse
        self.batch_size = batch_size

    def next_batch(self) -> list[int]:
        picked = [
            int(self.rng.choice(self.by_class[c]))
            for c in self.rng.integers(0, len(self.by_class), self.batch_size - 1)
        ]
        anchor_class = self.class_of[picked[int(self.rng.integers(len(picked)))]]
        return picked + [int(self.rng.choice(self.by_class[anchor_class]))]


@register("spc_random")
def spc_random(labels, batch_size, m, iterations, seed) -> BatchSampler:
    """SPC-R (Revisiting DML): class-uniform random items plus one guaranteed positive."""
    return SPCRandom(labels, batch_size, iterations, seed)
