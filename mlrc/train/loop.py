"""Train one fold until validation MAP@R stops improving (MLRC §1.5–1.7; the preset's
``selection_metric`` may name another validation metric, as the traditional preset's Recall@1).

Knows nothing of Optuna or the store: :func:`train_fold` takes a
:class:`~mlrc.train.spec.FoldSpec`, reports each validation through a callback, and returns a
:class:`~mlrc.train.spec.FoldResult`. Like pytorch-metric-learning's trainer, the loop is a few
named steps over one :class:`FoldRun`:

- :func:`resume_or_adopt` → :func:`~mlrc.train.setup.build_fold` → :func:`restore` (resumed) or
  :func:`validate_untrained` (epoch 0);
- per epoch, :func:`train_epoch` (:func:`start_of_epoch`: the learning-rate schedule and the
  frozen-trunk warm-up of :mod:`mlrc.train.schedule`; per batch :func:`calculate_loss`, :func:`step_optimizers`),
  then :func:`end_of_epoch` (:func:`validate`, :func:`consider_best`, :func:`should_stop`,
  :func:`record_epoch`);
- :func:`finish`: the result, also recorded in ``last.pt``.

The host never waits for the device within an epoch: the loss and its first non-finite
iteration accumulate on the device (:class:`LossTally`) and are read once per epoch (and, while
a progress bar is shown, at most every ``READ_SECONDS``); validation embeddings stay on the
device until the k-NN (:func:`~mlrc.train.embed.embed_tensors`).

Checkpoints (``last.pt``, ``best.pt`` in ``spec.workdir``) are described in
:mod:`mlrc.train.checkpoint`. ``last.pt`` is written after epoch 0, every validation epoch and
the last one, and after any other epoch once the preset's ``checkpoint_minutes`` have passed
since the previous write; a background thread writes it from a copy taken off the device, so
training goes on meanwhile. Re-running a fold whose ``last.pt`` exists resumes after the epoch
it records: a process killed with SIGKILL loses at most the epochs since the last write — one
validation interval or ``checkpoint_minutes`` (plus the epoch under way), whichever is shorter
— and recomputes them to the same numbers; a finished fold returns its result without
training. ``last.pt`` records the fold's ``identity`` (what defines its
numbers: protocol, parameters, fold, reproduction, seed) and the device and code version that
computed it: a checkpoint whose recorded identity differs from the spec's is never adopted (the
fold is trained again, said once in the log), and an adopted result keeps the provenance of the
run that computed it.

Best epoch, as the reference harness (powerful-benchmarker + PML's ``HookContainer``):

- epoch 0 is the untrained model (trunk + random embedder, the reference's
  "untrained_trunk_and_embedder"). Like PML's ``get_best_epoch_and_accuracy(ignore_epoch=(-1,))``
  it *is* a candidate for the best epoch: it starts the patience clock and, if no trained epoch
  beats it, ``best.pt`` keeps it. Ties keep the earlier epoch.
- the value handed to the search (:attr:`FoldResult.objective`) is the best validation MAP@R over
  *trained* epochs (≥ 1), as the reference's aggregator ignores the untrained epochs.
- stop when ``epoch − best_epoch > patience`` (checked at validation epochs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Subset
from tqdm.auto import tqdm

from mlrc.data.transforms import batch_to_trunk_input
from mlrc.errors import raise_if_stopped
from mlrc.models.freezing import freeze_batchnorm
from mlrc.protocol import retrieval_metrics
from mlrc.train.checkpoint import (
    CheckpointWriter,
    atomic_save,
    commit_best,
    plain,
    save_pending_best,
)
from mlrc.train.distributed import (
    GatheredModel,
    all_gather_cat,
    average_gradients,
    broadcast_object,
    gather_rows,
    is_distributed,
    rank_and_world,
    rank_stream,
    shard,
)
from mlrc.train.embed import View, embed_tensors
from mlrc.train.numerics import provenance
from mlrc.train.resume import restore, resume_or_adopt
from mlrc.train.schedule import lr_factor, set_learning_rates, warm_up
from mlrc.train.setup import FoldParts, build_fold
from mlrc.train.spec import NONFINITE, EpochRecord, FoldResult, FoldSpec, trained_best
from mlrc.train.tally import LossTally, first_nonfinite

METRICS = ("map_at_r", "precision_at_1", "r_precision")  # of an EpochRecord, kept for the best
READ_SECONDS = 2.0  # a shown progress bar reads the running loss at most this often (seconds)


@dataclass
class FoldRun:
    """One fold being trained: its parts and what the loop has seen so far."""

    spec: FoldSpec
    parts: FoldParts
    on_validation: Callable[[EpochRecord], None] | None
    t0: float  # time.monotonic() at the start, minus the wall time of the runs it resumes
    validate_every: int  # epochs
    patience: int  # epochs
    history: list[EpochRecord] = field(default_factory=list)
    best_epoch: int | None = None
    best: dict[str, float] | None = None  # METRICS of best_epoch (fractions)
    start_epoch: int = 1  # the first epoch this run trains
    trunk_params: list[torch.nn.Parameter] = field(default_factory=list)  # trainable at start
    writer: CheckpointWriter = field(default_factory=CheckpointWriter)
    saved_at: float = -math.inf  # time.monotonic() of the last last.pt snapshot
    new_best: int | None = None  # a best epoch whose model is not written yet (pending file)
    gathered: GatheredModel | None = None  # K ranks: the model as the strategy sees it

    @property
    def last(self) -> Path:
        return self.spec.workdir / "last.pt"

    @property
    def best_path(self) -> Path:
        return self.spec.workdir / "best.pt"


def train_fold(
    spec: FoldSpec, on_validation: Callable[[EpochRecord], None] | None = None
) -> FoldResult:
    """Train (or resume) one fold; see the module docstring. ``on_validation`` gets each new
    validation (epoch 0 included) as soon as it is computed, before ``last.pt`` records it."""
    t0 = time.monotonic()
    state = resume_or_adopt(spec)
    if isinstance(state, FoldResult):
        return state
    p = spec.preset
    run = FoldRun(
        spec,
        build_fold(spec),
        on_validation,
        t0,
        validate_every=p.per_dataset("validate_every", spec.dataset_name),
        patience=p.per_dataset("patience", spec.dataset_name),
    )
    run.trunk_params = [q for q in run.parts.model.trunk.parameters() if q.requires_grad]
    try:
        return train_epochs(run, state)
    except BaseException:
        run.writer.close(raise_error=False)  # the error under way is the one to report
        raise
    finally:
        run.writer.close()


def train_epochs(run: FoldRun, state: dict[str, Any] | None) -> FoldResult:
    """Epoch 0 (or the resumed state), then the epochs up to the fold's end."""
    if state is not None:
        restore(run, state)
    elif (failed := validate_untrained(run)) is not None:
        return failed
    bar = progress_bar(run)
    try:
        for epoch in range(run.start_epoch, run.spec.preset.max_epochs + 1):
            raise_if_stopped()  # a Ctrl-C or SIGTERM received (also checked at each step)
            train_loss = train_epoch(run, epoch, bar)
            if isinstance(train_loss, FoldResult):
                return train_loss
            if (done := end_of_epoch(run, epoch, train_loss)) is not None:
                return done
        # reached only when no epoch is left (a last.pt at max_epochs from an older mlrc)
        return finish(run, "complete", None, run.spec.preset.max_epochs)
    finally:
        bar.close()


def validate_untrained(run: FoldRun) -> FoldResult | None:
    """Epoch 0: the untrained model, a candidate for best (as PML's hooks; not under the
    traditional preset, whose papers evaluate after each trained epoch only); the failed result
    if its embeddings are non-finite."""
    rec = validate(run, 0, None)
    if isinstance(rec, str):
        return finish(run, "failed", rec, 0)
    if run.spec.preset.split_scheme != "traditional":  # the papers pick trained epochs only
        consider_best(run, rec)
    save_last(run, 0)
    return None


def progress_bar(run: FoldRun) -> tqdm:
    """A bar over all iterations of the fold, starting after the epochs already trained."""
    p = run.spec.preset
    return tqdm(
        total=p.max_epochs * p.iterations_per_epoch,
        initial=(run.start_epoch - 1) * p.iterations_per_epoch,
        desc=run.spec.desc,
        unit="it",
        disable=None if run.spec.progress else True,  # None: off when stderr is not a terminal
        leave=False,
        dynamic_ncols=True,
    )


def train_mode(run: FoldRun) -> None:
    """The model in training mode, its trunk's batch norms frozen if the preset says so."""
    run.parts.model.train()
    if run.spec.preset.freeze_batchnorm:
        freeze_batchnorm(run.parts.model.trunk)


def train_epoch(run: FoldRun, epoch: int, bar: tqdm) -> float | FoldResult:
    """One epoch of ``iterations_per_epoch`` batches: the mean training loss, or the failed
    result naming the first iteration whose loss was non-finite (``last.pt`` then ends at
    epoch − 1). The losses are read at the end (or at a shown bar's refresh, which may stop the
    epoch early), so the steps after a non-finite loss still run until then; one of them failing
    on the NaNs is reported as the non-finite loss."""
    train_mode(run)
    start_of_epoch(run, epoch)
    tally = LossTally()
    if run.parts.sampler.needs_bank and epoch == run.start_epoch:
        fill_bank(run)
    try:
        run_steps(run, epoch, tally, bar)
    except Exception:
        if first_nonfinite(tally) is None:
            raise
    mean, bad = tally.read()  # the epoch's one read of the device
    if bad is not None:
        return finish(run, "failed", f"{NONFINITE} loss at iteration {bad}", epoch - 1)
    show(run, bar, epoch, mean)
    return mean


def run_steps(run: FoldRun, epoch: int, tally: LossTally, bar: tqdm) -> None:
    """The epoch's steps, each loss added to ``tally`` unread. While the bar is shown, every
    ``READ_SECONDS`` the running mean goes to it, and a non-finite loss seen then ends the
    epoch early (one process only: K ranks, whose bar is rank 0's, end it together). Under K
    ranks the batches are loaded with a random stream of the rank's own
    (:func:`~mlrc.train.distributed.rank_stream`), so that ranks augment differently."""
    p = run.spec.preset
    next_read = math.inf if bar.disable else time.monotonic() + READ_SECONDS
    for x, y, idx in rank_stream(run.parts.train_loader, run.spec.seed, epoch):
        raise_if_stopped()  # the safe point of a stop signal: once per training step
        it = (epoch - 1) * p.iterations_per_epoch + tally.n + 1  # 1-based over the fold
        loss = calculate_loss(run, x, y, idx)
        tally.add(loss, it)
        step_optimizers(run.parts, loss)
        bar.update(1)
        if time.monotonic() >= next_read:
            mean, bad = tally.read()
            if bad is not None and not is_distributed():  # K ranks end the epoch together
                return
            show(run, bar, epoch, mean)
            next_read = time.monotonic() + READ_SECONDS


def show(run: FoldRun, bar: tqdm, epoch: int, mean: float) -> None:
    """The bar's postfix: epoch, running mean loss, best validation MAP@R so far."""
    best = f"{run.best['map_at_r']:.4f}" if run.best else "-"
    bar.set_postfix(epoch=epoch, loss=f"{mean:.4f}", best_map_r=best)


def start_of_epoch(run: FoldRun, epoch: int) -> None:
    """The epoch's learning rates (``lr_schedule``) and frozen trunk (``warmup_epochs``)."""
    p = run.spec.preset
    set_learning_rates((run.parts.opt, run.parts.loss_opt), lr_factor(p.lr_schedule, epoch))
    warm_up(run.trunk_params, p, epoch)


def fill_bank(run: FoldRun) -> None:
    """A memory-bank sampler's bank at the start of a run: the embeddings of every training
    image under the current model (validation transform), then back to training mode."""
    parts, spec, p = run.parts, run.spec, run.spec.preset
    view = View(parts.dataset, spec.train_classes, parts.val_set.transform)
    part = Subset(view, shard(len(view))) if is_distributed() else view  # K ranks: a share each
    bank, _ = embed_tensors(parts.model, part, p.eval_batch_size, spec.device, p.num_workers)
    parts.sampler.set_bank(gather_rows(bank).cpu())
    train_mode(run)


def calculate_loss(
    run: FoldRun, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """The strategy's loss of one batch (images ``x``, labels ``y``, positions ``idx`` in the
    training view); a memory-bank sampler gets the batch's clean embeddings (the output of the
    first forward pass) for its rows ``idx``. Under K ranks the strategy sees the global
    batch: the labels gathered and the model's output gathered
    (:class:`~mlrc.train.distributed.GatheredModel`), each rank's images its own."""
    parts, device = run.parts, run.spec.device
    pin = parts.train_loader.pin_memory
    captured: list[torch.Tensor] = []
    hook = (
        parts.model.register_forward_hook(
            lambda _m, _i, out, c=captured: None if c else c.append(out.detach())
        )
        if parts.sampler.needs_bank
        else None
    )
    model, y = parts.model, y.to(device, non_blocking=pin)
    if is_distributed():
        model, y = run.gathered or GatheredModel(model), all_gather_cat(y)
        run.gathered = model
    try:
        loss = parts.strategy.batch_loss(
            model,
            parts.loss_fn,
            parts.miner,
            batch_to_trunk_input(x, parts.model.trunk.input_spec, device, pin),
            y,
        )
    finally:
        if hook is not None:
            hook.remove()
    if captured:
        parts.sampler.update(idx, captured[0].float().cpu())
    return loss


def step_optimizers(parts: FoldParts, loss: torch.Tensor) -> None:
    """Backward pass and one step of the model's and the loss's optimisers; with fp16 through
    the AMP scaler (scaled gradients, steps skipped on inf/NaN). Under K ranks the gradients
    are averaged over the ranks before the step (one all-reduce,
    :func:`~mlrc.train.distributed.average_gradients`): the same on every rank, so every rank
    steps alike."""
    optimizers = [o for o in (parts.opt, parts.loss_opt) if o is not None]
    for o in optimizers:
        o.zero_grad(set_to_none=True)
    (parts.scaler.scale(loss) if parts.scaler.is_enabled() else loss).backward()
    if is_distributed():
        average_gradients(
            [*parts.model.parameters(), *parts.loss_fn.parameters(), *parts.strategy.parameters()]
        )
    if parts.scaler.is_enabled():
        for o in optimizers:
            parts.scaler.step(o)
        parts.scaler.update()
    else:
        for o in optimizers:
            o.step()


def end_of_epoch(run: FoldRun, epoch: int, train_loss: float) -> FoldResult | None:
    """Validate (every ``validate_every`` epochs and at the last), keep a new best, stop on
    patience or at the last epoch, else record the epoch in ``last.pt`` (every validation
    epoch; another one once ``checkpoint_minutes`` have passed); the fold's result when it ends
    here."""
    p = run.spec.preset
    validated = epoch % run.validate_every == 0 or epoch == p.max_epochs
    if validated:
        rec = validate(run, epoch, train_loss)
        if isinstance(rec, str):
            return finish(run, "failed", rec, epoch)
        consider_best(run, rec)
        if should_stop(run, epoch) or epoch == p.max_epochs:
            return finish(run, "complete", None, epoch)
        if (why := stop_reason(run, epoch)) is not None:
            return finish(run, "stopped", why, epoch)
    if validated or time.monotonic() - run.saved_at >= 60 * p.checkpoint_minutes:
        save_last(run, epoch)
    return None


def validate(run: FoldRun, epoch: int, train_loss: float | None) -> EpochRecord | str:
    """Validation metrics of the current model, added to the history and handed to
    ``on_validation``; the failure reason (a string) when the embeddings are non-finite. Under
    K ranks each rank embeds its share of the validation set, rank 0 scores the whole set and
    every rank gets its record."""
    parts, spec = run.parts, run.spec
    emb, lab = embed_tensors(
        parts.model, parts.val_loader, spec.preset.eval_batch_size, spec.device
    )
    emb, lab = gather_rows(emb), gather_rows(lab)
    rec = score(emb, lab, epoch, train_loss, spec.device) if rank_and_world()[0] == 0 else None
    rec = broadcast_object(rec)
    if isinstance(rec, str):
        return rec
    run.history.append(rec)
    if run.on_validation is not None:
        run.on_validation(rec)
    return rec


def score(
    emb: torch.Tensor, lab: torch.Tensor, epoch: int, train_loss: float | None, device: str
) -> EpochRecord | str:
    """The validation record of embeddings ``emb`` (n × d, not normalised) with labels ``lab``
    (exact k-NN, :func:`~mlrc.protocol.retrieval_metrics`), or the failure reason when an
    embedding is non-finite."""
    if not bool(torch.isfinite(emb).all()):  # the validation's one read of the device
        return f"{NONFINITE} embeddings at validation, epoch {epoch}"
    m = retrieval_metrics(emb, lab, device=device)
    return EpochRecord(epoch, train_loss, m["map_at_r"], m["precision_at_1"], m["r_precision"])


def consider_best(run: FoldRun, rec: EpochRecord) -> None:
    """A new best epoch (strictly higher validation value of the preset's ``selection_metric``,
    MAP@R unless said otherwise; ties keep the earlier epoch, as PML's hooks): its model goes to
    ``best.pending-e<epoch>.pt`` with the ``last.pt`` written next (same epoch), before it."""
    metric = run.spec.preset.selection_metric
    if run.best is None or getattr(rec, metric) > run.best[metric]:
        run.best_epoch = rec.epoch
        run.best = {k: getattr(rec, k) for k in METRICS}
        run.new_best = rec.epoch


def should_stop(run: FoldRun, epoch: int) -> bool:
    """Early stopping: more than ``patience`` epochs since the best (epoch 0 counts)."""
    return epoch - run.best_epoch > run.patience


def stop_reason(run: FoldRun, epoch: int) -> str | None:
    """Why the search's in-fold rule (``spec.stop``, :mod:`mlrc.protocol.stopping`) ends the
    fold at ``epoch`` with its best trained value so far, or None (no rule, or go on)."""
    if run.spec.stop is None:
        return None
    best = trained_best(run.history, run.spec.preset.selection_metric)
    return None if best is None else run.spec.stop.reason(epoch, best)


def save_last(run: FoldRun, epoch: int, res: FoldResult | None = None) -> None:
    """Queue ``last.pt`` (everything needed to resume after ``epoch``, and ``res`` if final) on
    the background writer: a snapshot now, then in the writer thread a new best's pending model,
    ``last.pt``, and ``best.pt`` committed once ``last.pt`` records it (:func:`write_epoch`)."""
    parts = run.parts
    if rank_and_world()[0] != 0:  # K ranks: rank 0 writes (all ranks hold the same state)
        run.saved_at, run.new_best = time.monotonic(), None
        return
    state = {
        "model": parts.model.state_dict(),
        "loss": parts.loss_fn.state_dict(),
        "opt": parts.opt.state_dict(),
        "loss_opt": parts.loss_opt.state_dict() if parts.loss_opt is not None else None,
        "sampler": plain(parts.sampler.state()),
        "strategy": parts.strategy.state_dict(),
        "scaler": parts.scaler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "epoch": epoch,
        "best_epoch": run.best_epoch,
        "best": plain(run.best),
        "history": plain([asdict(h) for h in run.history]),
        "wall_time_s": time.monotonic() - run.t0,
        "identity": plain(run.spec.identity),
        "result": plain({k: v for k, v in asdict(res).items() if k != "history"}) if res else None,
    }
    paths, best_epoch, new_best = (run.last, run.best_path), run.best_epoch, run.new_best
    run.writer.save(state, lambda copy: write_epoch(copy, paths, best_epoch, new_best))
    run.saved_at, run.new_best = time.monotonic(), None


def write_epoch(
    state: dict[str, Any], paths: tuple[Path, Path], best_epoch: int | None, new_best: int | None
) -> None:
    """The writer thread's job for one snapshot (``paths``: ``last.pt``, ``best.pt``): the model
    of a ``new_best`` epoch to its pending file, ``last.pt``, then ``best.pt`` committed (the
    order :mod:`mlrc.train.checkpoint` requires)."""
    last, best_path = paths
    if new_best is not None:
        save_pending_best(state["model"], best_path, new_best)
    atomic_save(state, last)
    commit_best(best_path, best_epoch)


def rank_provenance() -> dict[str, int]:
    """``{"processes": K}`` for a fold trained as K > 1 ranks (its provenance), else nothing."""
    return {"processes": rank_and_world()[1]} if is_distributed() else {}


def finish(run: FoldRun, status: str, reason: str | None, epoch: int) -> FoldResult:
    """The fold's result (``status`` complete | failed), recorded in ``last.pt`` at ``epoch``
    (on disk when this returns)."""
    res = FoldResult(
        status,
        reason,
        run.best_epoch,
        run.best,
        run.history,
        str(run.best_path) if run.best is not None else None,
        time.monotonic() - run.t0,
        objective=trained_best(run.history, run.spec.preset.selection_metric),
        device=run.spec.device,
        code_version=run.spec.code_version,
        provenance=provenance(run.spec.device, run.spec.preset) | rank_provenance(),
    )
    save_last(run, epoch, res)
    run.writer.wait()
    return res
