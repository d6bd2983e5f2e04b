"""Random batches: the traditional papers' DataLoader with ``shuffle=True, drop_last=True``."""

from __future__ import annotations

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, register


class ShuffleSampler(BatchSampler):
    """Batches of ``batch_size`` items taken in order from a random permutation of the training
    set; a new permutation when fewer than ``batch_size`` items are left (the rest dropped, as
    ``drop_last``). With ``iterations`` = ⌊n / batch_size⌋ an epoch is one pass over the data,
    as in the Proxy Anchor and Metrix code; classes are not balanced (a batch may hold no
    positive pair). Its state (RNG, permutation, position) is checkpointed."""

    def __init__(self, labels, batch_size: int, iterations: int, seed: int) -> None:
        super().__init__(labels, iterations, seed)
        if batch_size > len(self.labels):
            raise ValueError(
                f"batch size {batch_size} is larger than the {len(self.labels)} training images"
            )
        self.batch_size = batch_size
        self.order = np.empty(0, dtype=np.int64)
        self.position = 0

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > len(self.order):
            self.order = self.rng.permutation(len(self.labels))
            self.position = 0
        batch = self.order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [int(i) for i in batch]

    def state(self) -> dict:
        return {
            "rng": self.rng.bit_generator.state,
            "order": [int(i) for i in self.order],
            "position": self.position,
        }

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.order = np.asarray(state["order"], dtype=np.int64)
        self.position = int(state["position"])


@register("shuffle")
def shuffle(labels, batch_size, m, iterations, seed) -> BatchSampler:
    """Random batches, one pass over the training images per ⌊n / batch⌋ iterations
    (``shuffle=True, drop_last=True``), as the traditional papers' code on CUB and Cars."""
    return ShuffleSampler(labels, batch_size, iterations, seed)
