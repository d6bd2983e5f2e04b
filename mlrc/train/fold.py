"""Train one fold until validation MAP@R stops improving (MLRC §1.5–1.7).

Knows nothing of Optuna or the store: it takes a ``FoldSpec``, reports each validation through
a callback, and returns a ``FoldResult``. Checkpoints in ``spec.workdir``:

- ``last.pt``: everything needed to resume (models, optimisers, sampler and torch RNG states,
  epoch, best so far, history), written atomically after every epoch;
- ``best.pt``: trunk + embedder weights at the best validation MAP@R.

Re-running a fold whose ``last.pt`` exists resumes after the last finished epoch (a process killed
with SIGKILL loses at most one epoch); a finished fold returns its result without training.
``last.pt`` records the fold's ``identity`` (what defines its numbers: protocol, parameters,
fold, reproduction, seed) and the device and code version that computed it: a checkpoint whose
recorded identity differs from the spec's is never adopted (the fold is trained again, said once
in the log), and an adopted result keeps the provenance of the run that computed it.

Best epoch, as the reference harness (powerful-benchmarker + PML's ``HookContainer``):

- epoch 0 is the untrained model (trunk + random embedder, the reference's
  "untrained_trunk_and_embedder"). Like PML's ``get_best_epoch_and_accuracy(ignore_epoch=(-1,))``
  it *is* a candidate for the best epoch: it starts the patience clock and, if no trained epoch
  beats it, ``best.pt`` keeps it. Ties keep the earlier epoch.
- the value handed to the search (:attr:`FoldResult.objective`) is the best validation MAP@R over
  *trained* epochs (≥ 1), as the reference's aggregator ignores the untrained epochs.
- stop when ``epoch − best_epoch > patience`` (checked at validation epochs).

Crash consistency: every file is written to a temp file, fsynced and renamed (a kill leaves the
previous version; a full disk raises a one-line :class:`CheckpointError` and removes the temp
file). A new best model is first written as ``best.pending-e<epoch>.pt`` and becomes ``best.pt``
only after ``last.pt`` has recorded that epoch as best, so ``best.pt`` always holds the model of
the best epoch that ``last.pt`` (and hence the store) knows. ``last.pt`` holds only tensors and
plain Python values and is loaded with ``weights_only=True``.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from mlrc.config import Preset
from mlrc.data.base import ImageDataset
from mlrc.data.transforms import eval_transform, to_trunk_input, train_transform
from mlrc.errors import alive, first_line
from mlrc.methods import losses, miners, samplers, strategies
from mlrc.models.trunks import TRUNKS, Embedder, freeze_batchnorm
from mlrc.protocol import retrieval_metrics

log = logging.getLogger("mlrc")


@dataclass
class FoldSpec:
    """One fold's training job. Classes are dataset label ids; metrics are fractions."""

    dataset: ImageDataset
    dataset_name: str
    train_classes: Sequence[int]
    val_classes: Sequence[int]
    loss: str
    loss_params: dict[str, Any]
    loss_lr: float | None
    preset: Preset
    seed: int
    workdir: Path
    device: str = "cpu"
    miner: str | None = None
    miner_params: dict[str, Any] = field(default_factory=dict)
    strategy: str | None = None
    strategy_params: dict[str, Any] = field(default_factory=dict)
    sampler: str = "m_per_class"
    sampler_params: dict[str, Any] = field(default_factory=dict)
    desc: str = "fold"
    progress: bool = True
    identity: dict[str, Any] = field(default_factory=dict)  # what defines its numbers
    code_version: str | None = None


@dataclass
class EpochRecord:
    epoch: int  # 0 = before training (a candidate for best, not for the objective)
    train_loss: float | None
    map_at_r: float
    precision_at_1: float
    r_precision: float


NONFINITE = "non-finite"  # failure reasons of a loss or embeddings gone NaN/inf start with it


@dataclass
class FoldResult:
    """``best``: validation metrics (fractions) of ``best_epoch``, the epoch ``best.pt`` holds
    (may be 0); ``objective``: the best validation MAP@R over trained epochs (≥ 1), the value
    the search sees. ``device``/``code_version``: of the run that computed the result."""

    status: str  # complete | failed
    reason: str | None
    best_epoch: int | None
    best: dict[str, float] | None
    history: list[EpochRecord] = field(default_factory=list)
    checkpoint: str | None = None
    wall_time_s: float = 0.0
    objective: float | None = None
    device: str | None = None
    code_version: str | None = None

    @property
    def nonfinite(self) -> bool:
        """Failed because the loss or the embeddings went NaN/inf (the reference scores 0)."""
        return self.status == "failed" and (self.reason or "").startswith(NONFINITE)


def trained_best(history: Sequence[EpochRecord]) -> float | None:
    """Best validation MAP@R over trained epochs (≥ 1): the reference aggregator's value."""
    trained = [h.map_at_r for h in history if h.epoch >= 1]
    return max(trained) if trained else None


class View(Dataset):
    """Samples of some classes, with a transform and labels remapped to 0..n−1 (for the loss)."""

    def __init__(self, ds: ImageDataset, classes: Sequence[int], transform: Callable) -> None:
        classes = np.asarray(sorted(classes))
        self.ds, self.transform = ds, transform
        self.indices = np.flatnonzero(np.isin(ds.labels, classes))
        self.labels = np.searchsorted(classes, ds.labels[self.indices])

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.ds.load_image(int(self.indices[i]))), int(self.labels[i])


class _Indexed(Dataset):
    """(image, label, position in the view): lets memory-bank samplers update their rows."""

    def __init__(self, view: View) -> None:
        self.view = view

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return (*self.view[i], i)


class Model(torch.nn.Module):
    """Trunk → Embedder (one Linear, no ReLU). Outputs are *not* normalised, always float32.

    ``fast_paths`` sets the preset's mixed precision (autocast of the forward pass only: losses
    and metrics stay in float32) and channels_last memory format; neither changes the weights'
    names, so checkpoints are the same either way."""

    def __init__(self, trunk: torch.nn.Module, embedder: torch.nn.Module) -> None:
        super().__init__()
        self.trunk, self.embedder = trunk, embedder
        self.amp_dtype: torch.dtype | None = None
        self.channels_last = False

    def fast_paths(self, amp: str, channels_last: bool) -> Model:
        self.amp_dtype = AMP_DTYPES[amp]
        self.channels_last = channels_last
        if channels_last:
            self.to(memory_format=torch.channels_last)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.amp_dtype is None:
            return self.embedder(self.trunk(x))
        with torch.autocast(x.device.type, dtype=self.amp_dtype):
            return self.embedder(self.trunk(x)).float()


AMP_DTYPES: dict[str, torch.dtype | None] = {
    "off": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def loader_options(preset: Preset, device: str) -> dict[str, Any]:
    """DataLoader fast paths of the preset: pinned memory only when copying to a CUDA device,
    persistent workers only with worker processes (both are no-ops otherwise)."""
    cuda = torch.device(device).type == "cuda"
    return {
        "num_workers": preset.num_workers,
        "pin_memory": preset.pin_memory and cuda,
        "persistent_workers": preset.persistent_workers and preset.num_workers > 0,
    }


def build_model(preset: Preset, *, pretrained: bool | str | None = None) -> Model:
    trunk = TRUNKS.get(preset.trunk)(
        pretrained=preset.pretrained if pretrained is None else pretrained
    )
    return Model(trunk, Embedder(trunk.output_size, preset.embedding_size))


UNTRAINED_SEED = 0  # the random draw of an untrained trunk trained from scratch (baseline row)


def untrained_trunk(preset: Preset) -> Model:
    """The preset's trunk before any training, alone (no embedder; outputs its pooled features,
    not normalised): the reference's "untrained_trunk" (epoch −1). ImageNet weights when the
    preset has ``pretrained``; else randomly initialised from :data:`UNTRAINED_SEED`."""
    torch.manual_seed(UNTRAINED_SEED)
    trunk = TRUNKS.get(preset.trunk)(pretrained=preset.pretrained)
    return Model(trunk, torch.nn.Identity()).eval()


def load_model(preset: Preset, checkpoint: str | Path, device: str = "cpu") -> Model:
    """A fold's best model from its ``best.pt`` (no pretrained download: weights come from it)."""
    model = build_model(preset, pretrained=False)
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return model.to(device).eval()


@torch.no_grad()
def embed(
    model: Model,
    dataset: Dataset | DataLoader,
    batch_size: int,
    device: str,
    num_workers: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings (n × d float32, not normalised) and labels of ``dataset``, in order.
    A ready ``DataLoader`` (e.g. with pinned memory and persistent workers) is used as given."""
    model.eval()
    out, labels = [], []
    loader = (
        dataset
        if isinstance(dataset, DataLoader)
        else DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    )
    for x, y in loader:
        x = to_trunk_input(x.to(device, non_blocking=loader.pin_memory), model.trunk.input_spec)
        out.append(model(x).float().cpu())
        labels.append(y)
    return torch.cat(out).numpy(), torch.cat(labels).numpy()


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written (disk full, file too large) or read back; one line."""


class _RecordingWriter:
    """The file object handed to ``torch.save``: keeps the first ``OSError`` of a write, which
    torch reports only as an opaque RuntimeError ("unexpected pos ...")."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, b: bytes) -> int:
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _temp_path(path: Path) -> Path:
    """The temp file of one writer: host and pid, so stale ones can be told from live ones."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def _atomic_save(obj: Any, path: Path) -> None:
    """Write ``obj`` to ``path`` all or nothing: temp file, fsync, rename, fsync of the folder.
    On a failed write the temp file is removed and ``path`` keeps its previous content."""
    tmp, writer = _temp_path(path), None
    try:
        with open(tmp, "wb") as f:
            writer = _RecordingWriter(f)
            torch.save(obj, writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # also Ctrl-C mid-write: never leave a temp file behind
        tmp.unlink(missing_ok=True)
        err = writer.error if writer is not None and writer.error is not None else e
        if isinstance(err, OSError):
            what = "disk full / file too large writing" if err.errno in FULL else "cannot write"
            raise CheckpointError(f"{what} {path} ({err.strerror or err})") from None
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (a no-op where directories cannot be fsynced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(folder: Path) -> None:
    """Temp files of this host's dead processes (killed mid-write) in ``folder``; also this
    process's own, which are from before: it is not writing them now."""
    host = socket.gethostname()
    for tmp in folder.glob(".*.tmp-*"):
        rest, _, pid = tmp.name.rpartition("-")
        if not (rest.endswith(f".tmp-{host}") and pid.isdigit()):
            continue
        if int(pid) == os.getpid() or not alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _plain(obj: Any) -> Any:
    """``obj`` with numpy scalars and arrays as Python numbers and tensors (``weights_only``)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj] if isinstance(obj, list) else tuple(map(_plain, obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


def _pending_best(best_path: Path, epoch: int) -> Path:
    return best_path.with_name(f"{best_path.stem}.pending-e{epoch}{best_path.suffix}")


def _commit_best(best_path: Path, best_epoch: int | None) -> None:
    """``best.pending-e<best_epoch>.pt`` → ``best.pt``, once ``last.pt`` records that epoch."""
    pending = _pending_best(best_path, best_epoch) if best_epoch is not None else None
    if pending is not None and pending.is_file():
        os.replace(pending, best_path)
        _fsync_dir(best_path.parent)


def _resume_state(last: Path, best_path: Path) -> dict[str, Any] | None:
    """The state saved in ``last.pt`` (``None``: train from scratch), with ``best.pt`` made to
    agree with it: a pending best model that ``last.pt`` records is committed, one it does not
    (killed before ``last.pt`` was written) is dropped; a state whose ``best.pt`` is gone is
    discarded (the fold is trained again, with the same seed)."""
    _remove_stale_temps(last.parent)
    state = _load_checkpoint(last) if last.is_file() else None
    best_epoch = state["best_epoch"] if state is not None else None
    _commit_best(best_path, best_epoch)
    for pending in last.parent.glob(f"{best_path.stem}.pending-e*{best_path.suffix}"):
        pending.unlink(missing_ok=True)
    if state is not None and state["best"] is not None and not best_path.is_file():
        log.warning("%s is missing: training %s again from the start", best_path, last.parent)
        return None
    return state


def _load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — any unreadable file: one line naming it
        first = first_line(e)[:160]
        raise CheckpointError(
            f"cannot resume from {path} ({first}); delete it to train this fold again"
        ) from None


def _adopted(state: dict[str, Any]) -> FoldResult:
    """The finished result recorded in ``last.pt`` (older files lack objective and provenance:
    the objective is recomputed from the history, the provenance stays unknown)."""
    history = [EpochRecord(**h) for h in state["history"]]
    res = FoldResult(**{**state["result"], "history": history})
    if res.objective is None:
        res.objective = trained_best(history)
    return res


def _set_aside(workdir: Path, recorded: dict[str, Any], wanted: dict[str, Any]) -> None:
    """A fold folder whose checkpoint was computed under another configuration is moved to
    ``<folder>.other-K`` (never adopted, never deleted) and the fold is trained again."""
    diff = next(
        (k for k in sorted(set(recorded) | set(wanted)) if recorded.get(k) != wanted.get(k)), "?"
    )
    aside = next(
        workdir.with_name(f"{workdir.name}.other-{k}")
        for k in range(1, 10_000)
        if not workdir.with_name(f"{workdir.name}.other-{k}").exists()
    )
    os.replace(workdir, aside)
    log.warning(
        "%s was computed under another configuration (%s: %r there, %r now): moved to %s, "
        "training this fold again",
        workdir,
        diff,
        recorded.get(diff),
        wanted.get(diff),
        aside.name,
    )


def train_fold(
    spec: FoldSpec, on_validation: Callable[[EpochRecord], None] | None = None
) -> FoldResult:
    """Train (or resume) one fold; see the module docstring."""
    p, t0 = spec.preset, time.monotonic()
    spec.workdir.mkdir(parents=True, exist_ok=True)
    last, best_path = spec.workdir / "last.pt", spec.workdir / "best.pt"
    state = _resume_state(last, best_path)
    if state is not None and state.get("identity", {}) != _plain(spec.identity):
        _set_aside(spec.workdir, state.get("identity", {}), _plain(spec.identity))
        spec.workdir.mkdir(parents=True, exist_ok=True)
        state = None
    if state is not None and state.get("result") is not None:
        return _adopted(state)

    torch.manual_seed(spec.seed)
    model = build_model(p).to(spec.device).fast_paths(p.amp, p.channels_last)
    if torch.device(spec.device).type == "cuda":
        torch.backends.cudnn.benchmark = p.cudnn_benchmark
    scaler = torch.amp.GradScaler(torch.device(spec.device).type, enabled=p.amp == "fp16")
    data_opts = loader_options(p, spec.device)
    info = losses.info(spec.loss)
    loss_fn = losses.build(
        spec.loss,
        num_classes=len(spec.train_classes),
        embedding_size=p.embedding_size,
        **spec.loss_params,
    ).to(spec.device)
    opt = torch.optim.RMSprop(
        model.parameters(),
        lr=p.optimizer.lr,
        weight_decay=p.optimizer.weight_decay,
        momentum=p.optimizer.momentum,
    )
    miner = miners.build(spec.miner, **spec.miner_params) if spec.miner else None
    strategy = strategies.build(spec.strategy, **spec.strategy_params).to(spec.device)
    loss_params = list(loss_fn.parameters())
    loss_opt = None
    if loss_params:
        if spec.loss_lr is None:
            raise ValueError(f"loss {spec.loss!r} has parameters but no loss_lr was given")
        loss_opt = torch.optim.RMSprop(
            loss_params,
            lr=spec.loss_lr,
            weight_decay=p.loss_optimizer.weight_decay
            if info.loss_weight_decay is None
            else info.loss_weight_decay,
            momentum=p.loss_optimizer.momentum,
        )
    spec_in = model.trunk.input_spec
    im = p.image
    dataset = spec.dataset
    if p.decoded_cache:  # decoded once, resized to im.resize: the same tensors, no JPEG decoding
        from mlrc.data.cache import decoded_cache, default_cache_dir

        dataset = decoded_cache(dataset, im.resize, default_cache_dir(), progress=spec.progress)
    train_set = View(
        dataset,
        spec.train_classes,
        train_transform(im.resize, im.crop, im.scale, im.ratio, im.flip, spec_in, uint8=True),
    )
    # uint8 batches (4× smaller copies); normalised on the device by embed/_on_device
    val_set = View(
        dataset, spec.val_classes, eval_transform(im.resize, im.crop, spec_in, uint8=True)
    )
    sampler = samplers.build(
        spec.sampler,
        labels=train_set.labels,
        batch_size=p.batch.size,
        m=p.batch.images_per_class[info.batch],
        iterations=p.iterations_per_epoch,
        seed=spec.seed,
        **spec.sampler_params,
    )
    indexed_train_set = _Indexed(train_set)
    train_loader = DataLoader(indexed_train_set, batch_sampler=sampler, **data_opts)
    val_loader = DataLoader(val_set, batch_size=p.eval_batch_size, **data_opts)
    validate_every = p.per_dataset("validate_every", spec.dataset_name)
    patience = p.per_dataset("patience", spec.dataset_name)

    history: list[EpochRecord] = []
    best_epoch, best, start_epoch = None, None, 1
    if state is not None:  # resume after the last finished epoch
        model.load_state_dict(state["model"])
        loss_fn.load_state_dict(state["loss"])
        opt.load_state_dict(state["opt"])
        if loss_opt is not None:
            loss_opt.load_state_dict(state["loss_opt"])
        sampler.set_state(state["sampler"])
        if state.get("strategy") is not None:
            strategy.load_state_dict(state["strategy"])
        if state.get("scaler"):  # fp16 only; empty when the scaler is disabled
            scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["torch_rng"])
        history = [EpochRecord(**h) for h in state["history"]]
        best_epoch, best, start_epoch = state["best_epoch"], state["best"], state["epoch"] + 1
        t0 -= state["wall_time_s"]

    def validate(epoch: int, train_loss: float | None) -> EpochRecord | str:
        emb, lab = embed(model, val_loader, p.eval_batch_size, spec.device)
        if not np.isfinite(emb).all():
            return f"{NONFINITE} embeddings at validation, epoch {epoch}"
        m = retrieval_metrics(emb, lab, device=spec.device)
        rec = EpochRecord(epoch, train_loss, m["map_at_r"], m["precision_at_1"], m["r_precision"])
        history.append(rec)
        if on_validation is not None:
            on_validation(rec)
        return rec

    def result(status: str, reason: str | None) -> FoldResult:
        return FoldResult(
            status,
            reason,
            best_epoch,
            best,
            history,
            str(best_path) if best is not None else None,
            time.monotonic() - t0,
            objective=trained_best(history),
            device=spec.device,
            code_version=spec.code_version,
        )

    def consider_best(rec: EpochRecord) -> None:
        """A new best epoch (strictly higher val MAP@R; ties keep the earlier epoch, as PML's
        hooks): its model goes to ``best.pending-e<epoch>.pt`` until ``last.pt`` records it."""
        nonlocal best_epoch, best
        if best is None or rec.map_at_r > best["map_at_r"]:
            best_epoch = rec.epoch
            best = {k: getattr(rec, k) for k in ("map_at_r", "precision_at_1", "r_precision")}
            _atomic_save(model.state_dict(), _pending_best(best_path, rec.epoch))

    def checkpoint(epoch: int, res: FoldResult | None = None) -> None:
        _atomic_save(
            {
                "model": model.state_dict(),
                "loss": loss_fn.state_dict(),
                "opt": opt.state_dict(),
                "loss_opt": loss_opt.state_dict() if loss_opt is not None else None,
                "sampler": _plain(sampler.state()),
                "strategy": strategy.state_dict(),
                "scaler": scaler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "epoch": epoch,
                "best_epoch": best_epoch,
                "best": _plain(best),
                "history": _plain([asdict(h) for h in history]),
                "wall_time_s": time.monotonic() - t0,
                "identity": _plain(spec.identity),
                "result": _plain({k: v for k, v in asdict(res).items() if k != "history"})
                if res
                else None,
            },
            last,
        )

    def finish(status: str, reason: str | None, epoch: int) -> FoldResult:
        res = result(status, reason)
        checkpoint(epoch, res)
        return res

    if state is None:  # epoch 0: the untrained model, a candidate for best (as PML's hooks)
        rec = validate(0, None)
        if isinstance(rec, str):
            return finish("failed", rec, 0)
        consider_best(rec)
        checkpoint(0)
        _commit_best(best_path, best_epoch)

    total = p.max_epochs * p.iterations_per_epoch
    bar = tqdm(
        total=total,
        initial=(start_epoch - 1) * p.iterations_per_epoch,
        desc=spec.desc,
        unit="it",
        disable=None if spec.progress else True,  # None: off when stderr is not a terminal
        leave=False,
        dynamic_ncols=True,
    )
    try:
        for epoch in range(start_epoch, p.max_epochs + 1):
            model.train()
            if p.freeze_batchnorm:
                freeze_batchnorm(model.trunk)
            loss_sum, n = 0.0, 0
            if sampler.needs_bank and epoch == start_epoch:  # bank from the current model
                bank_view = View(dataset, spec.train_classes, val_set.transform)
                bank, _ = embed(model, bank_view, p.eval_batch_size, spec.device, p.num_workers)
                sampler.set_bank(torch.from_numpy(bank))
                model.train()
                if p.freeze_batchnorm:
                    freeze_batchnorm(model.trunk)
            for x, y, idx in train_loader:
                it = (epoch - 1) * p.iterations_per_epoch + n + 1
                captured: list[torch.Tensor] = []  # the batch's clean embeddings, for the bank
                hook = (
                    model.register_forward_hook(
                        lambda _m, _i, out, c=captured: None if c else c.append(out.detach())
                    )
                    if sampler.needs_bank
                    else None
                )
                try:
                    loss = strategy.batch_loss(
                        model,
                        loss_fn,
                        miner,
                        to_trunk_input(
                            x.to(spec.device, non_blocking=train_loader.pin_memory), spec_in
                        ),
                        y.to(spec.device, non_blocking=train_loader.pin_memory),
                    )
                finally:
                    if hook is not None:
                        hook.remove()
                if captured:
                    sampler.update(idx, captured[0].float().cpu())
                if not torch.isfinite(loss):
                    return finish("failed", f"{NONFINITE} loss at iteration {it}", epoch - 1)
                opt.zero_grad(set_to_none=True)
                if loss_opt is not None:
                    loss_opt.zero_grad(set_to_none=True)
                if scaler.is_enabled():  # fp16: scaled gradients, steps skipped on inf/NaN
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    if loss_opt is not None:
                        scaler.step(loss_opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
                    if loss_opt is not None:
                        loss_opt.step()
                loss_sum, n = loss_sum + loss.item(), n + 1
                bar.update(1)
                bar.set_postfix(
                    epoch=epoch,
                    loss=f"{loss_sum / n:.4f}",
                    best_map_r=f"{best['map_at_r']:.4f}" if best else "-",
                )
            train_loss = loss_sum / max(n, 1)
            if epoch % validate_every == 0 or epoch == p.max_epochs:
                rec = validate(epoch, train_loss)
                if isinstance(rec, str):
                    return finish("failed", rec, epoch)
                consider_best(rec)
                if epoch - best_epoch > patience:
                    return finish("complete", None, epoch)
            checkpoint(epoch)
            _commit_best(best_path, best_epoch)  # best.pt only once last.pt knows that epoch
        return finish("complete", None, p.max_epochs)
    finally:
        bar.close()
