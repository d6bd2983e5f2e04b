"""FoldLoader: worker processes that live for the whole fold give, epoch after epoch and across
a resume, the very batches of torch DataLoaders started afresh at every epoch (the reference:
torch's own per-epoch workers), and advance the global torch RNG as they do."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import train_tiny_fold
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.worker import _generate_state  # torch's own, as the reference

from mlrc.config import load_preset
from mlrc.data.transforms import train_transform
from mlrc.methods import samplers
from mlrc.protocol import mlrc_split
from mlrc.train import make_loaders
from mlrc.train.embed import IndexedView, View
from mlrc.train.loaders import FoldLoader, worker_seed_state


class Draws(Dataset):
    """Each sample: its index and one draw from each RNG a transform may use."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        t = torch.rand(3)
        other = torch.tensor([np.random.rand(), random.random()], dtype=torch.float64)
        return t, other, i


class Batches:
    """A batch sampler with its own checkpointable numpy RNG, like mlrc's samplers."""

    def __init__(self, n: int = 40, size: int = 4, iterations: int = 5, seed: int = 0) -> None:
        self.n, self.size, self.iterations = n, size, iterations
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.iterations

    def __iter__(self):
        for _ in range(self.iterations):
            yield self.rng.choice(self.n, self.size, replace=False).tolist()


def epochs(loader, k: int) -> list:
    """``k`` epochs of batches, each followed by the global torch RNG state."""
    out = []
    for _ in range(k):
        out.append([tuple(x.clone() if torch.is_tensor(x) else x for x in b) for b in loader])
        out.append(torch.get_rng_state())
    return out


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        if torch.is_tensor(ea):  # an RNG state
            assert torch.equal(ea, eb)
            continue
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb, strict=True):
            for xa, xb in zip(ba, bb, strict=True):
                assert torch.equal(xa, xb)


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1, 2**32 + 5, 2**62 + 12345, 2**63 - 1])
@pytest.mark.parametrize("worker", [0, 1, 3, 15])
def test_numpy_seed_of_a_worker_is_torch_s(seed, worker):
    assert worker_seed_state(seed, worker).tolist() == list(_generate_state(seed, worker))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_persistent_workers_give_per_epoch_workers_batches(workers):
    torch.manual_seed(7)
    fresh = epochs(DataLoader(Draws(), batch_sampler=Batches(), num_workers=workers), 3)
    torch.manual_seed(7)
    kept = FoldLoader(Draws(), batch_sampler=Batches(), num_workers=workers)
    assert_same(epochs(kept, 3), fresh)


def seed_all(seed: int) -> None:
    """The main process's RNGs (without workers, the transforms draw from them)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_in_order_batches_and_no_workers_too():
    for workers in (0, 2):
        seed_all(3)
        fresh = epochs(DataLoader(Draws(), batch_size=6, num_workers=workers), 2)
        seed_all(3)
        kept = epochs(FoldLoader(Draws(), batch_size=6, num_workers=workers), 2)
        assert_same(kept, fresh)


def test_a_resumed_loader_gives_the_next_epoch_of_an_uninterrupted_one():
    """Resume as a fold does: global RNG and sampler state as they were after epoch 2, a new
    FoldLoader (new worker processes), epoch 3 = per-epoch workers' epoch 3."""
    torch.manual_seed(11)
    fresh = epochs(DataLoader(Draws(), batch_sampler=Batches(), num_workers=2), 3)
    torch.manual_seed(11)
    sampler = Batches()
    first = FoldLoader(Draws(), batch_sampler=sampler, num_workers=2)
    epochs(first, 2)
    rng, sampler_state = torch.get_rng_state(), sampler.rng.bit_generator.state
    del first
    torch.manual_seed(999)  # whatever happened in between
    torch.set_rng_state(rng)
    resumed_sampler = Batches()
    resumed_sampler.rng.bit_generator.state = sampler_state
    resumed = FoldLoader(Draws(), batch_sampler=resumed_sampler, num_workers=2)
    assert_same(epochs(resumed, 1), fresh[4:6])


def test_the_fold_s_training_images_are_the_same(glyphs_ds):
    """The reference preset's kind of pipeline (random crops, uint8) on real images, through
    make_loaders: persistent (FoldLoader) vs per-epoch DataLoaders, 3 epochs."""
    fold = mlrc_split(glyphs_ds.labels, scheme="mlrc").folds[0]
    spec = {"input_range": 1, "bgr": False, "mean": [0.5] * 3, "std": [0.5] * 3}
    tf = train_transform(36, 32, (0.2, 1.0), (0.75, 1.33), True, spec, uint8=True)
    view = View(glyphs_ds, fold.train_classes, tf)
    got = {}
    for persistent in (False, True):
        p = load_preset(
            "cpu", {"num_workers": 2, "persistent_workers": persistent, "iterations_per_epoch": 4}
        )
        sampler = samplers.build(
            "m_per_class", labels=view.labels, batch_size=32, m=4, iterations=4, seed=5
        )
        torch.manual_seed(5)
        train, val = make_loaders(p, view, view, sampler, "cpu")
        assert isinstance(train, FoldLoader) == persistent
        got[persistent] = epochs(train, 3) + epochs(val, 1)
    assert_same(got[True], got[False])
    assert isinstance(IndexedView(view)[0][0], torch.Tensor)


def test_a_fold_with_persistent_workers_is_the_fold_of_per_epoch_workers(glyphs_ds, tmp_path):
    """A whole cpu-preset fold, 2 loader workers: epoch histories equal bit for bit."""
    histories = []
    for persistent in (False, True):
        res = train_tiny_fold(
            glyphs_ds,
            tmp_path / str(persistent),
            iterations=3,
            preset_overrides={
                "num_workers": 2,
                "persistent_workers": persistent,
                "max_epochs": 3,
                "image": {"flip": True},
            },
        )
        assert res.status == "complete", res.reason
        histories.append([vars(h) for h in res.history])
    assert histories[0] == histories[1]
    assert len(histories[0]) == 4  # epoch 0 and three trained epochs


EXIT_WITH_A_LIVE_ITERATOR = """
import sys, torch
from torch.utils.data import DataLoader
from mlrc.train.loaders import ignore_stop_signals

loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, worker_init_fn=ignore_stop_signals)
it = iter(loader)
next(it)
keep = [it, None]
keep[1] = keep  # a cycle, as a kept traceback makes: no refcount frees the iterator before exit
print("exiting", flush=True)
"""


def test_a_process_exits_with_its_loader_workers_still_alive(tmp_path):
    """A loader iterator still alive at exit (its workers ignore SIGTERM) does not hang the
    process: ``multiprocessing`` would SIGTERM and join them forever; mlrc kills them first."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_WITH_A_LIVE_ITERATOR)
    try:
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung at exit, joining its loader workers")
    assert out.returncode == 0 and "exiting" in out.stdout, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr  # the exit hook ran to its end
