"""The tracking interface: what a tracker is told of a study (:class:`Tracker`, :class:`StudyRun`),
the tracker that logs nothing, and several trackers at once (:class:`Composite`). Also what the
MLflow and W&B trackers share (:class:`BestEffort`, the run keys, the metric names)."""

from __future__ import annotations

import hashlib
import logging
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlrc.config.identity import canonical_json, code_version, identity
from mlrc.errors import first_line

if TYPE_CHECKING:
    from mlrc.config import ResolvedStudy
    from mlrc.search.folds import FoldJob
    from mlrc.train import EpochRecord, FoldResult

__all__ = [
    "BestEffort",
    "Composite",
    "NullTracker",
    "RunKey",
    "StudyRun",
    "Tracker",
    "epoch_metrics",
    "fold_metrics",
    "redact",
    "run_key",
    "safe_key",
    "study_run",
    "reproduction_metrics",
]

log = logging.getLogger("mlrc")


# --- the interface ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyRun:
    """What a tracker logs of the study itself, as plain values (:func:`study_run`): its
    ``name``, ``tags`` (``mlrc.study``, ``mlrc.key``, dataset, loss, miner, strategy, preset,
    code version), ``params`` (sampler, pruner, seed, folds, trunk, fixed parameters) and
    ``budgets`` (``mlrc.trials``, ``mlrc.reproductions``)."""

    name: str
    tags: dict[str, str]
    params: dict[str, Any]
    budgets: dict[str, str]


def study_run(r: ResolvedStudy, folds: int) -> StudyRun:
    """The :class:`StudyRun` of study ``r`` with ``folds`` folds (a split file may set another
    number than the preset's). ``mlrc.key`` hashes the name and the budget-free fingerprint: a
    study archived by ``--force-new`` and started afresh gets a new study run."""
    fingerprint = canonical_json(identity(r.fingerprint()))  # budgets may change
    key = hashlib.sha256(f"{r.study.name}\0{fingerprint}".encode()).hexdigest()[:16]
    tags = {
        "mlrc.study": r.study.name,
        "mlrc.key": key,
        "mlrc.dataset": r.study.dataset.name,
        "mlrc.loss": r.study.loss.name,
        "mlrc.preset": r.study.preset,
        "mlrc.code_version": code_version(),
    }
    if r.study.miner is not None:
        tags["mlrc.miner"] = r.study.miner.name
    if r.study.strategy is not None:
        tags["mlrc.strategy"] = r.study.strategy.name
    params = {
        "sampler": r.sampler,
        "pruner": r.pruner,
        "seed": r.study.search.seed,
        "folds": folds,
        "trunk": r.preset.trunk,
        **{f"fixed.{k}": v for k, v in r.fixed.items()},
    }
    budgets = {"mlrc.trials": str(r.trials), "mlrc.reproductions": str(r.reproductions)}
    return StudyRun(r.study.name, tags, params, budgets)


class Tracker:
    """Where a study's progress is also logged. The base class logs nothing (no tracking);
    every hook is best-effort and never raises."""

    def start_study(self, study: StudyRun) -> None:
        """The study was opened by this process."""

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        """Trial ``number`` starts with ``params`` (fixed and suggested)."""

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        """One validated epoch of a fold (``job.kind`` search: of trial ``trial_number``; test:
        of reproduction ``job.reproduction``)."""

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        """A fold of trial ``number`` finished (or was reused): ``fold{k}/objective``,
        ``fold{k}/best_epoch`` and the best epoch's validation metrics ``fold{k}/best_*``."""

    def trial_finished(
        self,
        number: int,
        state: str,
        value: float | None,
        sem: float | None,
        reason: str | None,
    ) -> None:
        """Trial ``number`` ended: complete (``value``, ``sem``), failed, pruned or interrupted."""

    def reproduction_finished(
        self, rep: int, params: Mapping[str, Any], rows: list[tuple[str, int, dict[str, float]]]
    ) -> None:
        """Test reproduction ``rep`` stored its rows (mode, fold or −1, metrics)."""

    def close(self) -> None:
        """The study is closed by this process: runs it left open end as interrupted."""


NullTracker = Tracker  # no tracking: every hook does nothing


class Composite(Tracker):
    """Several trackers (MLflow and W&B at once), each called in turn."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def start_study(self, study: StudyRun) -> None:
        for t in self.trackers:
            t.start_study(study)

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.trial_started(number, params)

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        for t in self.trackers:
            t.epoch(job, trial_number, rec)

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        for t in self.trackers:
            t.fold_finished(number, fold, res)

    def trial_finished(self, number: int, state: str, *args: Any) -> None:
        for t in self.trackers:
            t.trial_finished(number, state, *args)

    def reproduction_finished(self, rep: int, params: Mapping[str, Any], rows: list) -> None:
        for t in self.trackers:
            t.reproduction_finished(rep, params, rows)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


# --- shared helpers -----------------------------------------------------------------------------


def redact(uri: str) -> str:
    """``scheme://user:secret@host`` → ``scheme://***@host`` (for messages)."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


RunKey = tuple[str, int, str]  # a tracked run: ("trial", number, "") | ("reproduction", n, hash)


def run_key(job: FoldJob, trial_number: int | None) -> RunKey | None:
    """The tracked run a fold's epochs belong to: its trial's, or its test reproduction's."""
    if job.kind == "search":
        return None if trial_number is None else ("trial", trial_number, "")
    return ("reproduction", job.reproduction, job.params_hash)


def epoch_metrics(prefix: str, rec: EpochRecord) -> dict[str, float]:
    """``fold{k}/val_map_at_r``, ``…/val_precision_at_1``, ``…/val_r_precision`` and
    ``…/train_loss`` (none at epoch 0) of one validated epoch."""
    out = {
        f"{prefix}/val_map_at_r": rec.map_at_r,
        f"{prefix}/val_precision_at_1": rec.precision_at_1,
        f"{prefix}/val_r_precision": rec.r_precision,
    }
    if rec.train_loss is not None:
        out[f"{prefix}/train_loss"] = rec.train_loss
    return out


def fold_metrics(fold: int, res: FoldResult) -> dict[str, float]:
    """How a fold ended: its objective, best epoch and the best epoch's validation metrics."""
    out = {f"fold{fold}/objective": res.objective, f"fold{fold}/best_epoch": res.best_epoch}
    out.update({f"fold{fold}/best_{k}": v for k, v in (res.best or {}).items()})
    return {k: float(v) for k, v in out.items() if v is not None}


def reproduction_metrics(rows: list[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
    """``test/{mode}/fold{k}/{metric}`` per fold model, ``test/{mode}/{metric}`` for the
    aggregate (fold −1: the separated mean, the concatenated 512-D model)."""
    out = {}
    for mode, fold, metrics in rows:
        where = f"test/{mode}" + (f"/fold{fold}" if fold >= 0 else "")
        for k, v in metrics.items():
            if v is not None:
                out[f"{where}/{safe_key(k)}"] = float(v)
    return out


def safe_key(key: str) -> str:
    """A metric name MLflow accepts (alphanumerics, ``_-. /``)."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)


class BestEffort(Tracker):
    """A tracker whose hooks never raise: the first failure is logged (one warning, naming the
    target) and turns the tracker off for this process."""

    name = "tracking"

    def __init__(self, target: str) -> None:
        self.target = target
        self.off = False

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.off:
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the client libraries' deprecation notices
                return fn()
        except Exception as e:  # noqa: BLE001 — tracking never fails a trial
            self.off = True
            log.warning(
                "%s tracking at %s failed while %s (%s); tracking is off for this process, "
                "the study goes on",
                self.name,
                redact(self.target),
                what,
                first_line(e, default=type(e).__name__),
            )
            return None
