"""One fold of a trial (kind ``search``) or of a test reproduction (kind ``test``), run
idempotently. A fold run whose checkpoint is stored is not trained again, and an interrupted one
resumes from its ``last.pt`` (the fold trainer's concern)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlrc import store
from mlrc.config import LOSS_LR
from mlrc.config.identity import artifact_key, code_version, derive_seed, params_hash
from mlrc.methods import miners, strategies
from mlrc.search.errors import StudyError
from mlrc.search.pruning import live_fold_stop
from mlrc.search.retention import release_fold
from mlrc.search.session import StudySession
from mlrc.store import trials
from mlrc.train import CheckpointError, EpochRecord, FoldResult, FoldSpec, train_fold
from mlrc.train.launch import train_fold_ranks
from mlrc.train.threads import apply_threads, fold_cores, fold_slot

log = logging.getLogger("mlrc")


@dataclass(frozen=True)
class FoldJob:
    """Which fold run: its natural key in the store, less the study."""

    kind: str
    params_hash: str
    reproduction: int
    fold: int

    def key(self, study_id: int) -> dict[str, Any]:
        """The fold run's natural key (see :func:`mlrc.store.trials.fold_run`)."""
        return {
            "study_id": study_id,
            "kind": self.kind,
            "params_hash": self.params_hash,
            "reproduction": self.reproduction,
            "fold": self.fold,
        }

    @property
    def what(self) -> str:
        """``search fold 2 of <hash>`` (`` (reproduction N)`` for a test fold), for messages."""
        rep = f" (reproduction {self.reproduction})" if self.reproduction else ""
        return f"{self.kind} fold {self.fold} of {self.params_hash}{rep}"


def run_fold(
    ctx: StudySession,
    kind: str,
    params: dict[str, Any],
    reproduction: int,
    fold: int,
    trial_number: int | None,
) -> FoldResult:
    """One fold of a trial (kind "search") or of a reproduction (kind "test"), idempotently."""
    job = FoldJob(kind, params_hash(params), reproduction, fold)
    stored = stored_result(ctx, job)
    if stored is not None:
        return stored
    threads = apply_threads(ctx.threads or torch.get_num_threads())  # the study's, every fold
    seed = derive_seed(ctx.resolved.study.search.seed, kind, job.params_hash, reproduction, fold)
    fold_run_id = trials.start_fold(
        ctx.engine,
        job.key(ctx.study_id),
        job.what,
        trial_number=trial_number,
        seed=seed,
        device=ctx.device,  # this run's, until the result says who computed it
        code_version=code_version(),
        threads=threads,  # torch's sums depend on it: the process that ran the fold last
        provenance={"worker": worker_name()},  # who holds it while it runs (the result's after)
    )

    def record(rec: EpochRecord) -> None:
        record_epoch(ctx, fold_run_id, rec, job.what)
        ctx.tracker.epoch(job, trial_number, rec)  # MLflow/W&B, when tracked (never raises)

    spec = fold_spec(ctx, job, params, seed, trial_number)
    if kind == "search" and ctx.resolved.stop is not None:  # search.stop: the rule as it stands
        spec = dataclasses.replace(spec, stop=live_fold_stop(ctx, job.params_hash, fold))
    # folds take turns for the host's cores (torch threads and loader processes, of every
    # rank); a GPU fold does not wait, but holds its loader processes' cores so that CPU folds
    # beside it wait. K ranks share the study's threads (one each at least).
    k = max(1, len(ctx.devices))
    per_rank = max(1, threads // k)
    cores = k * fold_cores(per_rank, ctx.resolved.preset.num_workers, ctx.device)
    try:
        with fold_slot(cores, wait=ctx.device == "cpu"):
            if k > 1:
                launch = ctx.launcher or train_fold_ranks
                res = launch(spec, ctx.devices, per_rank, on_validation=record)
            else:
                res = train_fold(spec, on_validation=record)
    except CheckpointError as e:  # disk full, unreadable last.pt: the run stops, one line
        raise StudyError(str(e)) from None
    for rec in res.history:  # a resumed fold re-reports nothing: make sure every epoch is stored
        record(rec)
    record_result(ctx, job, res)
    if res.status == "complete":  # committed: the checkpoints the policy drops can go
        release_fold(ctx, kind, job.key(ctx.study_id), spec.workdir, job.what)
        if kind == "search" and ctx.resolved.keep == "resume":
            res = dataclasses.replace(res, checkpoint=None)
    return res


def claim_fold(ctx: StudySession, job: FoldJob) -> None:
    """Mark fold run ``job`` running for this worker (its provenance ``worker``: ``host:pid``)
    before it trains: a campaign worker's claim of a test fold, made under the study's lock;
    :func:`run_fold` then starts it as usual."""
    seed = derive_seed(ctx.resolved.study.search.seed, job.kind, job.params_hash,
                       job.reproduction, job.fold)  # fmt: skip
    trials.start_fold(
        ctx.engine,
        job.key(ctx.study_id),
        job.what,
        seed=seed,
        device=ctx.device,
        code_version=code_version(),
        provenance={"worker": worker_name()},
    )


def worker_name() -> str:
    """``host:pid`` of this process, as a running trial's Optuna user attribute ``worker``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def stored_result(ctx: StudySession, job: FoldJob) -> FoldResult | None:
    """The stored result of a complete fold run, else None. A test fold's result counts only
    with its checkpoint (the test stage embeds the test set with it): a missing one is logged
    and the fold is trained again; a search fold's stored row is its result (the search never
    reads its checkpoint, which retention may have removed)."""
    row = trials.fold_run(ctx.engine, job.key(ctx.study_id), job.what)
    if row is None or row.status != "complete":
        return None
    if job.kind == "test" and not (row.checkpoint and Path(row.checkpoint).is_file()):
        if row.checkpoint:
            log.warning("%s: checkpoint %s is missing; training it again", job.what, row.checkpoint)
        return None
    return FoldResult(
        "complete",
        None,
        row.best_epoch,
        {k: getattr(row, k) for k in store.METRIC_COLUMNS},
        checkpoint=row.checkpoint,
        wall_time_s=row.wall_time_s or 0.0,
        # rows before schema 3: epoch 0 was never best, so map_at_r is the objective
        objective=row.map_at_r if row.objective is None else row.objective,
        device=row.device,
        code_version=row.code_version,
        provenance=row.provenance,
    )


def fold_spec(
    ctx: StudySession, job: FoldJob, params: dict[str, Any], seed: int, trial_number: int | None
) -> FoldSpec:
    """What the fold trainer needs: data, the methods and their parameters, preset, seed, and
    the fold's working directory and identity (which its checkpoints record)."""
    r = ctx.resolved
    f = ctx.split.folds[job.fold]
    label = f"trial {trial_number}" if job.kind == "search" else f"reproduction {job.reproduction}"
    return FoldSpec(
        dataset=ctx.dataset,
        dataset_name=r.study.dataset.name,
        train_classes=f.train_classes,
        val_classes=f.val_classes,
        loss=r.study.loss.name,
        loss_params={
            k: v
            for k, v in params.items()
            if k != LOSS_LR and not k.startswith((miners.PREFIX, strategies.PREFIX))
        },
        miner=r.study.miner.name if r.study.miner else None,
        miner_params=_prefixed(params, miners.PREFIX),
        strategy=r.study.strategy.name if r.study.strategy else None,
        strategy_params=_prefixed(params, strategies.PREFIX),
        sampler=r.study.sampler.name,
        sampler_params=dict(r.study.sampler.params),
        loss_lr=params.get(LOSS_LR),
        preset=r.preset,
        seed=seed,
        workdir=ctx.fold_dir(job.kind, job.params_hash, job.reproduction, job.fold),
        device=ctx.device,
        desc=f"{label} · fold {job.fold}",
        progress=ctx.progress,
        identity={
            "protocol": artifact_key(r.fingerprint()),
            "params": job.params_hash,
            "kind": job.kind,
            "reproduction": job.reproduction,
            "fold": job.fold,
            "seed": seed,
        },
        code_version=code_version(),
    )


def _prefixed(params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``{"miner.epsilon": 0.1, ...}`` → ``{"epsilon": 0.1}`` for one prefix."""
    return {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}


def record_epoch(ctx: StudySession, fold_run_id: int, rec: EpochRecord, what: str) -> None:
    """Store one validated epoch of the fold run ``fold_run_id``."""
    trials.record_epoch(
        ctx.engine,
        fold_run_id,
        rec.epoch,
        what,
        train_loss=rec.train_loss,
        map_at_r=rec.map_at_r,
        precision_at_1=rec.precision_at_1,
        r_precision=rec.r_precision,
    )


def record_result(ctx: StudySession, job: FoldJob, res: FoldResult) -> None:
    """Store how the fold run ended, with its best metrics and provenance."""
    best = res.best or {}
    trials.finish_fold(
        ctx.engine,
        job.key(ctx.study_id),
        job.what,
        status=res.status,
        reason=res.reason,
        best_epoch=res.best_epoch,
        objective=res.objective,
        checkpoint=res.checkpoint,
        wall_time_s=res.wall_time_s,
        device=res.device,  # provenance: the run that computed it (adopted or not)
        code_version=res.code_version,
        provenance=res.provenance,  # its device's name, CUDA/cuDNN, TF32, deterministic
        **{k: best.get(k) for k in store.METRIC_COLUMNS},
    )
