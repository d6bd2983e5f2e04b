"""The fold trainer: determinism, batch composition, early stopping, failures, kill-and-resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mlrc import data
from mlrc.config import load_preset
from mlrc.methods import losses
from mlrc.methods.samplers import ClassBalancedBatchSampler
from mlrc.protocol import mlrc_split
from mlrc.train import FoldSpec, train_fold

FAST = {
    "iterations_per_epoch": 4,
    "max_epochs": 3,
    "validate_every": {"default": 1},
    "patience": {"default": 100},
}


@pytest.fixture(scope="module")
def glyphs():
    ds = data.build("glyphs")
    return ds, mlrc_split(ds.labels, scheme="mlrc").folds[0]


def spec(glyphs, workdir: Path, loss="contrastive", params=None, loss_lr=None, seed=0, **over):
    ds, fold = glyphs
    return FoldSpec(
        ds,
        "glyphs",
        fold.train_classes,
        fold.val_classes,
        loss,
        params or {},
        loss_lr,
        load_preset("cpu", {**FAST, **over}),
        seed,
        workdir,
        progress=False,
    )


def history(res):
    return [
        (h.epoch, h.train_loss, h.map_at_r, h.precision_at_1, h.r_precision) for h in res.history
    ]


def test_same_seed_same_metrics_on_cpu(glyphs, tmp_path):
    a = train_fold(spec(glyphs, tmp_path / "a"))
    b = train_fold(spec(glyphs, tmp_path / "b"))
    c = train_fold(spec(glyphs, tmp_path / "c", seed=1))
    assert a.status == "complete" and len(a.history) == 4  # epochs 0..3
    assert history(a) == history(b)
    assert history(a) != history(c)
    assert a.best_epoch is not None and Path(a.checkpoint).is_file()


def test_finished_fold_is_not_trained_again(glyphs, tmp_path):
    first = train_fold(spec(glyphs, tmp_path))
    mtime = (tmp_path / "best.pt").stat().st_mtime_ns
    again = train_fold(spec(glyphs, tmp_path))
    assert history(again) == history(first) and again.best == first.best
    assert (tmp_path / "best.pt").stat().st_mtime_ns == mtime


def pml_hook_rules(history: list[tuple[int, float]], patience: int) -> tuple[int, int, float]:
    """The reference's rules, written from PML's ``HookContainer`` (independently of mlrc):
    best epoch = the first epoch with the highest val MAP@R among epochs not in
    ``ignore_epoch=(-1,)`` (so epoch 0 counts); training stops at the first validation where
    ``epoch − best_epoch > patience``; the search's value ignores the untrained epochs.
    Returns (best epoch, stop epoch, objective)."""
    seen: list[tuple[int, float]] = []
    for epoch, value in history:
        seen.append((epoch, value))
        top = max(v for _, v in seen)
        best = next(e for e, v in seen if v == top)
        if epoch - best > patience:
            break
    return best, epoch, max(v for e, v in seen if e >= 1)


def test_patience_in_epochs_and_epoch_zero_can_be_best(glyphs, tmp_path):
    # lr ~0 with frozen BatchNorm: the model never changes, every validation ties with epoch 0,
    # which (as in PML's hooks) is then the best epoch and starts the patience clock
    res = train_fold(
        spec(
            glyphs,
            tmp_path,
            optimizer={"lr": 1e-30, "weight_decay": 0.0},
            freeze_batchnorm=True,
            max_epochs=50,
            patience={"default": 2},
        )
    )
    curve = [(h.epoch, h.map_at_r) for h in res.history]
    best, stop, objective = pml_hook_rules(curve, patience=2)
    assert res.status == "complete" and (res.best_epoch, best) == (0, 0)
    assert [h.epoch for h in res.history] == [0, 1, 2, 3] and stop == 3  # 3 − 0 > 2
    assert len({h.map_at_r for h in res.history}) == 1
    assert res.objective == objective  # trained epochs only
    assert (tmp_path / "best.pt").is_file() and not list(tmp_path.glob("best.pending-*"))


class _Collapse(torch.nn.Module):
    """Pulls every embedding to the batch mean: training makes the model worse than epoch 0."""

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (embeddings - embeddings.mean(0, keepdim=True)).pow(2).sum(1).mean()


@pytest.fixture
def collapse_loss():
    losses.register("test_collapse", batch="pair")(
        lambda *, num_classes, embedding_size: _Collapse()
    )
    yield "test_collapse"
    losses.LOSSES.unregister("test_collapse")


def naive_map_at_r(x: np.ndarray, y: np.ndarray) -> float:
    """MAP@R by a plain loop over queries (float64, L2-normalised, self excluded, stable ties)."""
    x = x.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    total, count = 0.0, 0
    for q in range(len(x)):
        R = int((y == y[q]).sum()) - 1
        if R == 0:
            continue
        others = [i for i in range(len(x)) if i != q]
        sims = x[others] @ x[q]
        order = [others[i] for i in np.argsort(-sims, kind="stable")][:R]
        hits, ap = 0, 0.0
        for rank, i in enumerate(order, 1):
            if y[i] == y[q]:
                hits += 1
                ap += hits / rank
        total, count = total + ap / R, count + 1
    return total / count


def test_best_checkpoint_holds_the_best_epoch_not_the_last(glyphs, tmp_path, collapse_loss):
    """A fold whose best epoch is earlier than its last: best.pt, reloaded and evaluated with a
    naive loop, gives the stored best val MAP@R (and not the last epoch's)."""
    from mlrc.data.transforms import eval_transform
    from mlrc.train import View, embed, load_model

    s = spec(
        glyphs,
        tmp_path,
        loss=collapse_loss,
        optimizer={"lr": 1e-2, "weight_decay": 0.0},
        max_epochs=4,
        patience={"default": 100},
    )
    res = train_fold(s)
    last = res.history[-1]
    assert res.status == "complete" and res.best_epoch < last.epoch
    assert last.map_at_r < res.best["map_at_r"]  # the collapse really made it worse
    model = load_model(s.preset, tmp_path / "best.pt")
    im = s.preset.image
    view = View(
        s.dataset, s.val_classes, eval_transform(im.resize, im.crop, model.trunk.input_spec)
    )
    emb, lab = embed(model, view, 64, "cpu")
    assert naive_map_at_r(emb, lab) == pytest.approx(res.best["map_at_r"], abs=1e-9)
    assert naive_map_at_r(emb, lab) != pytest.approx(last.map_at_r, abs=1e-6)


def test_class_loss_uses_one_image_per_class_and_its_own_optimiser(glyphs, tmp_path):
    res = train_fold(spec(glyphs, tmp_path, loss="normalized_softmax", loss_lr=1e-2))
    assert res.status == "complete"
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    assert state["loss_opt"]["param_groups"][0]["lr"] == 1e-2
    assert state["loss"]["W"].shape == (128, len(glyphs[1].train_classes))


class _NaNAfter(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.calls, self.n = 0, n

    def forward(self, embeddings, labels):
        self.calls += 1
        return embeddings.pow(2).mean() * (float("nan") if self.calls >= self.n else 1.0)


def _nan_loss(*, num_classes: int, embedding_size: int):
    """A loss that turns NaN at its third call (for tests)."""
    return _NaNAfter(3)


@pytest.fixture
def nan_at_3():
    """Registered only while the test runs: other tests list every registered loss."""
    losses.register("test_nan_at_3", batch="pair")(_nan_loss)
    yield "test_nan_at_3"
    losses.LOSSES.unregister("test_nan_at_3")


def test_non_finite_loss_fails_the_fold_with_the_iteration(glyphs, tmp_path, nan_at_3):
    res = train_fold(spec(glyphs, tmp_path, loss=nan_at_3))
    assert res.status == "failed" and res.reason == "non-finite loss at iteration 3"
    assert res.nonfinite


def test_frozen_batchnorm_keeps_running_statistics(glyphs, tmp_path):
    # the last epoch's weights (last.pt): best.pt may hold the untrained epoch 0
    train_fold(spec(glyphs, tmp_path, freeze_batchnorm=True))
    weights = torch.load(tmp_path / "last.pt", weights_only=True)["model"]
    bn_means = [v for k, v in weights.items() if k.endswith("running_mean")]
    assert bn_means and all(torch.equal(m, torch.zeros_like(m)) for m in bn_means)
    train_fold(spec(glyphs, tmp_path / "unfrozen", freeze_batchnorm=False))
    w2 = torch.load(tmp_path / "unfrozen" / "last.pt", weights_only=True)["model"]
    assert any(
        not torch.equal(v, torch.zeros_like(v)) for k, v in w2.items() if k.endswith("running_mean")
    )


# --- batch sampler -----------------------------------------------------------------------------


def test_pair_batches_are_8_classes_by_4_images():
    labels = np.repeat(np.arange(20), 6)
    s = ClassBalancedBatchSampler(labels, 32, 4, iterations=50, seed=0)
    for batch in s:
        classes, counts = np.unique(labels[batch], return_counts=True)
        assert len(batch) == 32 and len(classes) == 8 and (counts == 4).all()


def test_class_batches_are_32_distinct_classes():
    labels = np.repeat(np.arange(40), 2)
    for batch in ClassBalancedBatchSampler(labels, 32, 1, iterations=20, seed=0):
        assert len(set(labels[batch].tolist())) == 32


def test_too_few_classes_uses_all_with_a_warning_and_one_class_is_an_error():
    labels = np.repeat(np.arange(5), 3)
    with pytest.warns(UserWarning, match="only 5 training classes.*using all 5 classes"):
        s = ClassBalancedBatchSampler(labels, 32, 4, iterations=3, seed=0)
    assert all(len(set(labels[b].tolist())) == 5 and len(b) == 20 for b in s)
    with pytest.raises(ValueError, match="at least 2 classes, got 1"):
        ClassBalancedBatchSampler(np.zeros(10, dtype=int), 32, 4, iterations=1, seed=0)


def test_sampler_state_round_trip():
    labels = np.repeat(np.arange(20), 5)
    a = ClassBalancedBatchSampler(labels, 32, 4, iterations=5, seed=3)
    list(a)
    state = a.state()
    rest = list(a)
    b = ClassBalancedBatchSampler(labels, 32, 4, iterations=5, seed=99)
    b.set_state(state)
    assert list(b) == rest


# --- SIGKILL and resume ------------------------------------------------------------------------

KILL_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from mlrc import data
    from mlrc.config import load_preset
    from mlrc.protocol import mlrc_split
    from mlrc.train import FoldSpec, train_fold
    torch.set_num_threads(1)  # as the test process: the thread count changes the numbers
    ds = data.build("glyphs")
    fold = mlrc_split(ds.labels, scheme="mlrc").folds[0]
    over = {"iterations_per_epoch": 15, "max_epochs": 8, "validate_every": {"default": 1},
            "patience": {"default": 100}}
    train_fold(FoldSpec(ds, "glyphs", fold.train_classes, fold.val_classes, "contrastive", {},
                        None, load_preset("cpu", over), 0, Path(sys.argv[1]), progress=False))
""")


def test_fold_killed_with_sigkill_resumes_to_the_same_result(glyphs, tmp_path):
    # one thread here and in the killed child: torch's sums over 1 and 2 threads differ
    torch.set_num_threads(1)  # (restored after the test by conftest)
    over = {"iterations_per_epoch": 15, "max_epochs": 8}
    reference = train_fold(spec(glyphs, tmp_path / "reference", **over))
    workdir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(workdir)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        last = workdir / "last.pt"
        if last.is_file():
            try:
                epoch = torch.load(last, weights_only=False)["epoch"]
            except Exception:  # being replaced right now
                epoch = 0
            if epoch >= 3:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the fold finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(workdir / "last.pt", weights_only=False)["epoch"]
    assert 3 <= killed_at < 8
    resumed = train_fold(spec(glyphs, workdir, **over))
    assert history(resumed) == history(reference)
    assert resumed.best_epoch == reference.best_epoch


def test_the_miner_s_pairs_reach_the_loss(glyphs, tmp_path, monkeypatch):
    from pytorch_metric_learning import losses as pml_losses

    from mlrc.methods import miners

    seen = []
    original = pml_losses.MultiSimilarityLoss.forward

    def spy(self, embeddings, labels, indices_tuple=None, *args, **kwargs):
        seen.append(indices_tuple)
        return original(self, embeddings, labels, indices_tuple, *args, **kwargs)

    monkeypatch.setattr(pml_losses.MultiSimilarityLoss, "forward", spy)
    ds, fold = glyphs
    s = spec(glyphs, tmp_path, loss="multi_similarity", max_epochs=1)
    s.miner, s.miner_params = "multi_similarity", {"epsilon": 0.3}
    assert train_fold(s).status == "complete"
    assert len(seen) == 4 and all(t is not None and len(t) == 4 for t in seen)  # (a1, p, a2, n)
    assert miners.build("multi_similarity", epsilon=0.3).epsilon == 0.3


def test_margin_beta_gets_no_weight_decay_as_in_mlrc(glyphs, tmp_path):
    res = train_fold(spec(glyphs, tmp_path, loss="margin", loss_lr=1e-3, max_epochs=1))
    assert res.status == "complete"
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    assert state["loss_opt"]["param_groups"][0]["weight_decay"] == 0.0
    assert state["opt"]["param_groups"][0]["weight_decay"] == 1e-4  # the model's stays


# --- non-finite losses read once per epoch (#22 point 2) ----------------------------------------


class _NaNAt(torch.nn.Module):
    """NaN at the calls in ``bad`` (1-based), finite otherwise."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__()
        self.calls, self.bad = 0, bad

    def forward(self, embeddings, labels):
        self.calls += 1
        return embeddings.pow(2).mean() * (float("nan") if self.calls in self.bad else 1.0)


@pytest.fixture
def nan_at():
    """Register a loss NaN at the given calls; unregistered after the test."""
    names = []

    def make(*bad: int) -> str:
        name = f"test_nan_at_{'_'.join(map(str, bad))}"
        losses.register(name, batch="pair")(lambda **_: _NaNAt(set(bad)))
        names.append(name)
        return name

    yield make
    for name in names:
        losses.LOSSES.unregister(name)


def test_a_non_finite_loss_that_turns_finite_again_still_fails_at_its_iteration(
    glyphs, tmp_path, nan_at
):
    res = train_fold(spec(glyphs, tmp_path, loss=nan_at(2)))
    assert res.status == "failed" and res.reason == "non-finite loss at iteration 2"


def test_a_non_finite_loss_in_a_later_epoch_names_its_fold_iteration_and_keeps_last_pt(
    glyphs, tmp_path, nan_at
):
    # 4 iterations per epoch: call 7 is iteration 3 of epoch 2; the later calls are NaN too
    res = train_fold(spec(glyphs, tmp_path, loss=nan_at(7, 8, 9)))
    assert res.status == "failed" and res.reason == "non-finite loss at iteration 7"
    assert [h.epoch for h in res.history] == [0, 1]
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["epoch"] == 1 and state["result"]["reason"] == res.reason  # ends at epoch − 1


# --- checkpoints from a background writer (#22 point 3) -----------------------------------------


def _spy_last_writes(monkeypatch, sleep: float = 0.0) -> list[tuple[int, bool, str]]:
    """Record (epoch, final, weights digest) of every last.pt the writer writes, as it writes
    it; ``sleep``: a slow disk (seconds per write), training goes on meanwhile."""
    import hashlib

    from mlrc.train import loop

    seen = []
    original = loop.atomic_save

    def save(obj, path):
        time.sleep(sleep)
        digest = hashlib.sha256()
        for k in sorted(obj["model"]):
            digest.update(obj["model"][k].numpy().tobytes())
        seen.append((obj["epoch"], obj["result"] is not None, digest.hexdigest()))
        original(obj, path)

    monkeypatch.setattr(loop, "atomic_save", save)
    return seen


@pytest.mark.parametrize(
    "minutes, epochs",
    [(1e9, [0, 2, 4, 5]), (1e-9, [0, 1, 2, 3, 4, 5])],
    ids=["validation-epochs", "every-epoch"],
)
def test_last_pt_is_written_at_validation_epochs_and_when_the_minutes_have_passed(
    glyphs, tmp_path, monkeypatch, minutes, epochs
):
    seen = _spy_last_writes(monkeypatch)
    over = {"iterations_per_epoch": 2, "max_epochs": 5, "validate_every": {"default": 2}}
    res = train_fold(spec(glyphs, tmp_path, checkpoint_minutes=minutes, **over))
    assert res.status == "complete" and [h.epoch for h in res.history] == [0, 2, 4, 5]
    assert [e for e, _, _ in seen] == epochs  # the last one once, with the result
    assert [final for _, final, _ in seen] == [False] * (len(epochs) - 1) + [True]


def test_a_slow_disk_writes_the_state_of_the_epoch_it_was_taken_at(glyphs, tmp_path, monkeypatch):
    """Training goes on while the writer sleeps: the snapshot, not the live weights, is written
    (the same weights per epoch as with an instant disk), and the numbers do not change."""
    fast = _spy_last_writes(monkeypatch)
    a = train_fold(spec(glyphs, tmp_path / "fast"))
    monkeypatch.undo()
    slow = _spy_last_writes(monkeypatch, sleep=0.4)
    b = train_fold(spec(glyphs, tmp_path / "slow"))
    assert [e for e, _, _ in fast] == [0, 1, 2, 3] and slow == fast
    assert history(a) == history(b)


def test_best_pt_is_committed_only_after_the_last_pt_that_records_it(
    glyphs, tmp_path, monkeypatch, collapse_loss
):
    """The writer's order per snapshot: pending best model → last.pt → commit; when best.pt is
    committed, the last.pt on disk already names its epoch as best."""
    from mlrc.train import checkpoint, loop

    events = []
    pending_save, last_save, commit = checkpoint.atomic_save, loop.atomic_save, loop.commit_best

    def on_pending(obj, path):
        events.append(("pending", path.name))
        pending_save(obj, path)

    def on_last(obj, path):
        events.append(("last", obj["epoch"]))
        last_save(obj, path)

    def on_commit(best_path, best_epoch):
        on_disk = torch.load(best_path.with_name("last.pt"), weights_only=True)["best_epoch"]
        events.append(("commit", best_epoch, on_disk))
        commit(best_path, best_epoch)

    monkeypatch.setattr(checkpoint, "atomic_save", on_pending)
    monkeypatch.setattr(loop, "atomic_save", on_last)
    monkeypatch.setattr(loop, "commit_best", on_commit)
    res = train_fold(spec(glyphs, tmp_path, optimizer={"lr": 3e-5}))
    assert res.status == "complete"
    bests = [e for e in events if e[0] == "pending"]
    assert bests and bests[0] == ("pending", "best.pending-e0.pt")
    for i, event in enumerate(events):
        if event[0] == "pending":  # the next two: last.pt of that epoch, then its commit
            epoch = int(event[1][len("best.pending-e") : -len(".pt")])
            assert events[i + 1] == ("last", epoch) and events[i + 2] == ("commit", epoch, epoch)
    assert all(e[1] == e[2] for e in events if e[0] == "commit")
    assert not list(tmp_path.glob("best.pending-*")) and (tmp_path / "best.pt").is_file()


def test_a_failed_background_write_is_raised_in_the_training_thread(glyphs, tmp_path, monkeypatch):
    from mlrc.train import CheckpointError, loop

    writes = []
    original = loop.atomic_save

    def full_disk(obj, path):
        writes.append(obj["epoch"])
        if len(writes) == 2:
            raise CheckpointError(f"disk full / file too large writing {path} (No space left)")
        original(obj, path)

    monkeypatch.setattr(loop, "atomic_save", full_disk)
    with pytest.raises(CheckpointError, match="disk full / file too large writing .*last.pt"):
        train_fold(spec(glyphs, tmp_path))
    # raised in the training thread at the next save (epoch 2's), which is then not written
    assert writes == [0, 1]
    assert torch.load(tmp_path / "last.pt", weights_only=True)["epoch"] == 0


def test_a_snapshot_is_a_copy_training_cannot_change():
    from mlrc.train.checkpoint import snapshot

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    live = {"model": model.state_dict(), "rng": torch.get_rng_state(), "n": 3, "a": np.ones(2)}
    copy, event = snapshot(live)
    assert event is None  # nothing came from CUDA
    with torch.no_grad():
        model[0].weight.add_(1.0)
    live["a"] += 1
    assert not torch.equal(copy["model"]["0.weight"], model[0].weight)
    assert copy["n"] == 3 and (copy["a"] == 1).all()
    assert type(copy["model"]) is type(live["model"])  # an OrderedDict with torch's _metadata
    assert copy["model"]._metadata == live["model"]._metadata


def test_a_checkpoint_folder_removed_under_a_fold_is_made_again(tmp_path):
    """A worker declared lost finishes the same fold as its retry and cleans the fold's folder:
    the retry's next checkpoint write makes it again instead of failing the trial."""
    import shutil

    from mlrc.train.checkpoint import atomic_save

    path = tmp_path / "fold3" / "last.pt"
    atomic_save({"x": torch.arange(3)}, path)
    shutil.rmtree(path.parent)
    atomic_save({"x": torch.arange(4)}, path)
    assert torch.load(path)["x"].tolist() == [0, 1, 2, 3]
