"""The reference's batch order (``pml_m_per_class``): PyTorch Metric Learning's
``MPerClassSampler`` as powerful-benchmarker used it, drawn by PML's own arithmetic, index for
index.

The reference (powerful-benchmarker, ``metric-learning`` branch, PML 0.9.92) builds
``MPerClassSampler(labels, m)`` with no ``batch_size`` and PML's default
``length_before_new_iter`` of 100 000 (its sampler factory substitutes the training set's size
only when a config says ``dataset_length``, and none of its configs does), and PML's trainer
reads it through a ``DataLoader(batch_size=32, drop_last=True)`` whose iterator
lives for the whole fold (a new one when it runs out). Each time the sampler is iterated it
writes a list of L = N − (N mod m·C) indices (N = ``length_before_new_iter``, C classes;
L = m·C when m·C ≥ N): L / (m·C) *passes*, each shuffling the whole class list once and taking m images of
every class in that order (``np.random.choice``, with replacement only for a class with fewer
than m images). Batches are consecutive runs of ``batch_size`` indices of that list — a batch
may straddle two passes and then hold a class twice — and the last ⌊L / batch_size⌋-th
remainder is dropped. mlrc's ``m_per_class`` instead draws each batch's classes independently.

The random source is ``np.random.RandomState(seed)``: the generator ``np.random.seed(seed)``
seeds, which PML's ``c_f.NUMPY_RANDOM`` (the module ``np.random``) draws from; with the same
seed and labels this sampler yields exactly PML's batches (tested). Its state — generator,
current class order, current list and position — is checkpointed, so a resumed fold goes on
with the same batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, register

__all__ = ["PMLMPerClassSampler"]


class PMLMPerClassSampler(BatchSampler):
    """PML's ``MPerClassSampler`` (``batch_size=None``) read in batches of ``batch_size`` with
    ``drop_last``; ``length_before_new_iter`` (images; PML's default 100 000, as the reference
    ran it) is the length of one sampler iteration before rounding."""

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray,
        batch_size: int,
        m: int,
        iterations: int,
        seed: int,
        length_before_new_iter: int = 100_000,
    ) -> None:
        super().__init__(labels, iterations, seed)
        self.rng = np.random.RandomState(seed)  # type: ignore[assignment]  (np.random.seed's)
        by_label: dict[int, list[int]] = {}
        for i, label in enumerate(self.labels.tolist()):  # first-appearance order, as PML's
            by_label.setdefault(label, []).append(i)
        if len(by_label) < 2:
            raise ValueError(f"a training fold needs at least 2 classes, got {len(by_label)}")
        self.m, self.batch_size = int(m), int(batch_size)
        self.by_label = {k: np.array(v, dtype=int) for k, v in by_label.items()}
        self.order = list(by_label)  # shuffled in place pass after pass, as PML's self.labels
        single = self.m * len(self.order)
        self.list_size = int(length_before_new_iter)
        if single < self.list_size:
            self.list_size -= self.list_size % single
        self.passes = self.list_size // single if single < self.list_size else 1
        if max(self.list_size, single) < self.batch_size:
            raise ValueError(
                f"pml_m_per_class: a sampler iteration of {max(self.list_size, single)} images "
                f"is shorter than a batch of {self.batch_size} (drop_last would give no batch; "
                "raise length_before_new_iter)"
            )
        self.buffer: list[int] = []
        self.position = 0

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > len(self.buffer):  # drop_last, then a new iter
            self.buffer = self._iteration()
            self.position = 0
        batch = self.buffer[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def _iteration(self) -> list[int]:
        """One ``MPerClassSampler.__iter__``: its index list, drawn as PML draws it (a Python
        list written by slices: longer than ``list_size`` when one pass is)."""
        out: list[int] = [0] * self.list_size
        i = 0
        for _ in range(self.passes):
            self.rng.shuffle(self.order)
            for label in self.order:
                pool = self.by_label[label]
                out[i : i + self.m] = self.rng.choice(pool, size=self.m, replace=len(pool) < self.m)
                i += self.m
        return [int(k) for k in out]

    def state(self) -> dict:
        kind, key, pos, has_gauss, gauss = self.rng.get_state()
        return {
            "rng": [kind, [int(k) for k in key], int(pos), int(has_gauss), float(gauss)],
            "order": [int(k) for k in self.order],
            "buffer": np.asarray(self.buffer, dtype=np.int64),  # up to 100 000: an array
            "position": self.position,
        }

    def set_state(self, state: dict) -> None:
        kind, key, pos, has_gauss, gauss = state["rng"]
        self.rng.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
        self.order = [int(k) for k in state["order"]]
        self.buffer = np.asarray(state["buffer"]).astype(np.int64).tolist()
        self.position = int(state["position"])


@register("pml_m_per_class")
def pml_m_per_class(
    labels, batch_size, m, iterations, seed, *, length_before_new_iter: int = 100_000
) -> BatchSampler:
    """The reference's order: PML's MPerClassSampler, the class list shuffled once per pass of
    m × classes images, a new list every ``length_before_new_iter`` images (PML's default,
    100 000, as the reference), read in batches with ``drop_last`` (m per class; see the module)."""
    return PMLMPerClassSampler(labels, batch_size, m, iterations, seed, length_before_new_iter)
