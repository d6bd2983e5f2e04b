"""What a study's search writes and reads of its trials and fold runs: start and finish a trial or a
fold, its epochs, the best trial, retention's view of the fold runs. Every such query of
:mod:`mlrc.search` is here, named for what it does. The study's own row is in
:mod:`mlrc.store.studies`, test results and the untrained baseline in :mod:`mlrc.store.results`.

Each write is one transaction, re-run after a lost connection (:func:`mlrc.store.engine.transact`),
and idempotent: rows are upserted on their natural keys. ``what`` in an error message says
what was being done ("starting trial 3", ...). Reads hand out :mod:`mlrc.store.records`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from mlrc.store.engine import transact, upsert
from mlrc.store.records import FoldRunRecord, TrialRecord, from_row
from mlrc.store.schema import EpochMetric, FoldRun, Trial

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "beat_fold",
    "best_trial",
    "best_trial_hash",
    "end_running_folds",
    "finish_fold",
    "finish_trial",
    "fold_run",
    "fold_runs",
    "forget_checkpoint",
    "interrupted_trial_numbers",
    "mark_trial",
    "record_epoch",
    "running_trial_hashes",
    "start_fold",
    "start_trial",
    "study_trials",
    "top_trials",
    "trial_state",
]


# --- trials ------------------------------------------------------------------------------------


def _set_trial(engine: Engine, study_id: int, number: int, what: str, **values: Any) -> None:
    transact(
        engine,
        lambda s: upsert(s, Trial, {"study_id": study_id, "number": number}, **values),
        what,
    )


def start_trial(
    engine: Engine, study_id: int, number: int, params: dict[str, Any], params_hash: str
) -> None:
    """Trial ``number`` is running with ``params`` (a retried trial's old outcome is cleared)."""
    _set_trial(
        engine,
        study_id,
        number,
        f"starting trial {number}",
        params=params,
        params_hash=params_hash,
        state="running",
        value=None,
        sem=None,
        reason=None,
    )


def finish_trial(
    engine: Engine,
    study_id: int,
    number: int,
    state: str,
    value: float | None,
    sem: float | None,
    reason: str | None,
) -> None:
    """Record how trial ``number`` ended: its state, value (mean val MAP@R), SEM and reason."""
    _set_trial(
        engine,
        study_id,
        number,
        f"recording trial {number}",
        state=state,
        value=value,
        sem=sem,
        reason=reason,
    )


def mark_trial(
    engine: Engine,
    study_id: int,
    number: int,
    params: dict[str, Any],
    params_hash: str,
    state: str,
    reason: str,
    what: str | None = None,
) -> None:
    """Record trial ``number`` (with its parameters) as ended without a value: ``state`` is
    ``interrupted``, ``pruned`` or ``failed``, ``reason`` says why. ``what``: for the error
    message (default "recording trial N")."""
    _set_trial(
        engine,
        study_id,
        number,
        what or f"recording trial {number}",
        params=params,
        params_hash=params_hash,
        state=state,
        value=None,
        sem=None,
        reason=reason,
    )


def interrupted_trial_numbers(engine: Engine, study_id: int) -> set[int]:
    """The numbers of the study's trials recorded ``interrupted``."""
    query = select(Trial.number).filter_by(study_id=study_id, state="interrupted")
    return transact(engine, lambda s: set(s.execute(query).scalars()), "reading trials")


def trial_state(engine: Engine, study_id: int, number: int) -> str | None:
    """The state recorded for trial ``number`` (``running``, ``complete``, ...), None if none."""
    query = select(Trial.state).filter_by(study_id=study_id, number=number)
    return transact(engine, lambda s: s.execute(query).scalar_one_or_none(), "reading trials")


# --- fold runs ---------------------------------------------------------------------------------


def fold_run(engine: Engine, key: dict[str, Any], what: str) -> FoldRunRecord | None:
    """The fold run with natural key ``key`` (study_id, kind, params_hash, reproduction, fold),
    None when it never started."""

    def read(s: Session) -> FoldRunRecord | None:
        row = s.execute(select(FoldRun).filter_by(**key)).scalar_one_or_none()
        return None if row is None else from_row(FoldRunRecord, row)

    return transact(engine, read, f"reading {what}")


def start_fold(engine: Engine, key: dict[str, Any], what: str, **values: Any) -> int:
    """The fold run with natural key ``key`` is running (``values``: its trial number, seed,
    device, code version); returns its row id (for :func:`record_epoch`)."""
    return transact(
        engine,
        lambda s: upsert(s, FoldRun, key, status="running", reason=None, **values).id,
        f"starting {what}",
    )


def record_epoch(
    engine: Engine,
    fold_run_id: int,
    epoch: int,
    what: str,
    *,
    train_loss: float | None,
    map_at_r: float | None,
    precision_at_1: float | None,
    r_precision: float | None,
) -> None:
    """One validated epoch of a fold run: its training loss and validation metrics."""
    transact(
        engine,
        lambda s: upsert(
            s,
            EpochMetric,
            {"fold_run_id": fold_run_id, "epoch": epoch},
            train_loss=train_loss,
            map_at_r=map_at_r,
            precision_at_1=precision_at_1,
            r_precision=r_precision,
        ),
        f"recording epoch {epoch} of {what}",
    )


def finish_fold(engine: Engine, key: dict[str, Any], what: str, **values: Any) -> None:
    """Record the outcome of the fold run with natural key ``key`` (status, reason, best epoch,
    objective, checkpoint, wall time, provenance, best metrics)."""
    transact(engine, lambda s: upsert(s, FoldRun, key, **values), f"recording {what}")


def beat_fold(engine: Engine, key: dict[str, Any], what: str) -> None:
    """The heartbeat of the running fold run with natural key ``key``: its ``updated`` time set
    to now (UTC, this host's clock), so that a pool sees it held (a campaign worker's test
    fold); a run no longer ``running`` is left as it is."""
    transact(
        engine,
        lambda s: s.execute(
            update(FoldRun).filter_by(**key, status="running").values(status="running")
        ),  # the column's onupdate sets ``updated``
        f"recording the heartbeat of {what}",
    )


def end_running_folds(
    engine: Engine,
    study_id: int,
    kind: str,
    params_hash: str,
    status: str,
    reason: str,
    reproduction: int | None = None,
) -> None:
    """The study's fold runs of ``kind`` with parameters ``params_hash`` (and ``reproduction``)
    still ``running`` end as ``status`` (``interrupted`` or ``failed``) with ``reason``; a
    later run of the same fold starts it again (:func:`start_fold`)."""
    where = {"study_id": study_id, "kind": kind, "params_hash": params_hash, "status": "running"}
    if reproduction is not None:
        where["reproduction"] = reproduction
    transact(
        engine,
        lambda s: s.execute(
            update(FoldRun).filter_by(**where).values(status=status, reason=reason)
        ),
        f"recording the {kind} folds of {params_hash} as {status}",
    )


def fold_runs(engine: Engine, study_id: int) -> list[FoldRunRecord]:
    """Every fold run of the study (what checkpoint retention looks at)."""

    def read(s: Session) -> list[FoldRunRecord]:
        rows = s.execute(select(FoldRun).filter_by(study_id=study_id)).scalars()
        return [from_row(FoldRunRecord, row) for row in rows]

    return transact(engine, read, "reading the fold runs")


def best_trial(engine: Engine, study_id: int) -> TrialRecord | None:
    """The best complete trial (highest value, the first on a tie, as Optuna's
    ``best_trial``), None before any."""
    query = (
        select(Trial)
        .filter_by(study_id=study_id, state="complete")
        .where(Trial.value.is_not(None))
        .order_by(Trial.value.desc(), Trial.number)
        .limit(1)
    )

    def read(s: Session) -> TrialRecord | None:
        row = s.execute(query).scalar_one_or_none()
        return None if row is None else from_row(TrialRecord, row)

    return transact(engine, read, "reading trials")


def study_trials(engine: Engine, study_id: int) -> list[TrialRecord]:
    """Every trial of the study (value, fold SEM, state), by number."""
    query = select(Trial).filter_by(study_id=study_id).order_by(Trial.number)

    def read(s: Session) -> list[TrialRecord]:
        return [from_row(TrialRecord, row) for row in s.execute(query).scalars()]

    return transact(engine, read, "reading trials")


def top_trials(engine: Engine, study_id: int, k: int) -> list[TrialRecord]:
    """The ``k`` best complete trials (highest value first, the lower number first on a tie, as
    :func:`best_trial`), leaving out those scored 0 for a non-finite loss (their ``reason``
    says so): a warm start's source (:mod:`mlrc.search.warm_start`)."""
    query = (
        select(Trial)
        .filter_by(study_id=study_id, state="complete")
        .where(Trial.value.is_not(None), Trial.reason.is_(None))
        .order_by(Trial.value.desc(), Trial.number)
        .limit(k)
    )

    def read(s: Session) -> list[TrialRecord]:
        return [from_row(TrialRecord, row) for row in s.execute(query).scalars()]

    return transact(engine, read, "reading trials")


def best_trial_hash(engine: Engine, study_id: int) -> str | None:
    """The parameter hash of the best complete trial (:func:`best_trial`), None before any."""
    best = best_trial(engine, study_id)
    return None if best is None else best.params_hash


def running_trial_hashes(engine: Engine, study_id: int) -> set[str]:
    """The parameter hashes of the study's trials still running (not known yet to be worse)."""
    query = select(Trial.params_hash).filter_by(study_id=study_id, state="running")
    return transact(engine, lambda s: set(s.execute(query).scalars()), "reading trials")


def forget_checkpoint(engine: Engine, key: dict[str, Any], what: str) -> None:
    """The fold run with natural key ``key`` no longer has a best checkpoint on disk (committed
    before the file is deleted: a row never points at a file that retention removed)."""
    transact(
        engine,
        lambda s: s.execute(update(FoldRun).filter_by(**key).values(checkpoint=None)),
        f"forgetting the checkpoint of {what}",
    )
