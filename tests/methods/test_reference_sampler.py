"""``pml_m_per_class`` (issue #26): the reference's batch order. The reference is PyTorch Metric
Learning's own ``MPerClassSampler`` (installed; its ``batch_size=None`` path is the code of PML
0.9.92, which powerful-benchmarker pinned) read as PML's trainer reads it: a ``DataLoader``
with ``drop_last=True`` whose iterator is renewed when it runs out
(``c_f.try_next_on_generator``), the global NumPy generator seeded with ``np.random.seed`` —
the only random source PML's sampler draws from (``c_f.NUMPY_RANDOM`` is ``np.random``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.samplers import MPerClassSampler
from pytorch_metric_learning.utils import common_functions as c_f

from mlrc.methods import samplers
from mlrc.train.checkpoint import plain


def pml_batches(
    labels: np.ndarray, m: int, batch: int, count: int, seed: int, length: int | None = None
) -> list[list[int]]:
    """``count`` batches as the reference draws them (a fold's stream, across epochs);
    ``length``: ``length_before_new_iter`` (None: PML's default, as the reference)."""
    np.random.seed(seed)
    more = {} if length is None else {"length_before_new_iter": length}
    sampler = MPerClassSampler(labels, m, **more)
    loader = torch.utils.data.DataLoader(
        list(range(len(labels))), batch_size=batch, sampler=sampler, drop_last=True
    )
    it, out = iter(loader), []
    for _ in range(count):
        it, b = c_f.try_next_on_generator(it, loader)
        out.append(b.tolist())
    return out


def mlrc_batches(
    labels: np.ndarray, m: int, batch: int, count: int, seed: int, length: int | None = None
) -> list:
    more = {} if length is None else {"length_before_new_iter": length}
    s = samplers.build("pml_m_per_class", labels, batch, m, 10, seed, **more)
    return [s.next_batch() for _ in range(count)]


def labels_of(sizes: list[int], seed: int) -> np.ndarray:
    """Class c has sizes[c] images, in a shuffled training-set order (PML keys the classes by
    first appearance: the order matters)."""
    y = np.repeat(np.arange(len(sizes)) * 7 + 3, sizes)  # non-contiguous label values
    return np.random.default_rng(seed).permutation(y)


CASES = {
    # CUB-like: 25 classes of 20–60 (pass of 100 images, not a multiple of 32: batches straddle)
    "pairs": (labels_of(list(range(20, 70, 2)), 1), 4, 32),
    # classes smaller than m (drawn with replacement), m = 1 (classification losses)
    "small classes": (labels_of([2, 3, 5, 1, 8, 13, 4, 6, 9, 2] * 4, 2), 4, 32),
    "m = 1": (labels_of([5, 7, 9, 11] * 12, 3), 1, 32),
    # one pass longer than the training set (m·C ≥ n): PML's list grows past its length
    "long pass": (labels_of([4] * 40 + [1] * 60, 4), 4, 32),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 12345])
def test_the_batches_are_pml_s_index_for_index(case, seed):
    """``length_before_new_iter`` = the training set's size: several sampler iterations."""
    labels, m, batch = CASES[case]
    count = 3 * (len(labels) // batch) + 5
    want = pml_batches(labels, m, batch, count, seed, len(labels))
    assert mlrc_batches(labels, m, batch, count, seed, len(labels)) == want
    # and not m_per_class's order (each batch's classes drawn independently)
    other = samplers.build("m_per_class", labels, batch, m, 10, seed)
    assert [other.next_batch() for _ in range(count)] != want


def test_with_pml_s_default_length_as_the_reference_ran_it():
    """100 000 images per sampler iteration (1000 passes of 100 here): 3125 batches of 32, then
    a new iteration."""
    labels, m, batch = CASES["pairs"]
    want = pml_batches(labels, m, batch, 3130, 3)
    assert mlrc_batches(labels, m, batch, 3130, 3) == want


def test_a_pass_shuffles_the_whole_class_list_once():
    """Independent of PML: within one pass (m·C = 100 images from position 0) every class
    appears exactly once, in m consecutive images of its own."""
    labels, m, _ = CASES["pairs"]
    flat = sum(mlrc_batches(labels, m, 20, 5, 7), [])  # 100 images: one pass, batch 20
    classes = labels[flat].reshape(-1, m)
    assert (classes == classes[:, :1]).all()
    assert sorted(classes[:, 0]) == sorted(np.unique(labels))


def test_a_resumed_sampler_goes_on_with_the_same_batches():
    labels, m, batch = CASES["pairs"]
    s = samplers.build("pml_m_per_class", labels, batch, m, 10, 5, length_before_new_iter=300)
    for _ in range(4):
        s.next_batch()
    state = plain(s.state())
    rest = [s.next_batch() for _ in range(12)]  # crosses a new sampler iteration
    t = samplers.build("pml_m_per_class", labels, batch, m, 10, 99, length_before_new_iter=300)
    t.set_state(state)
    assert [t.next_batch() for _ in range(12)] == rest


def test_a_length_shorter_than_a_batch_is_one_line():
    labels = labels_of([3] * 4, 0)
    with pytest.raises(
        ValueError, match=r"^pml_m_per_class: a sampler iteration of 12 images is shorter"
    ):
        samplers.build("pml_m_per_class", labels, 32, 1, 10, 0, length_before_new_iter=12)
