"""What a study writes and reads while it runs: its row, its trials, fold runs, epochs, test
results and the untrained baseline (every query of :mod:`mlrc.search`, named for what it does).

Each write is one transaction, re-run after a lost connection (:func:`mlrc.store.transact`),
and idempotent: rows are upserted on their natural keys. ``what`` in an error message says
what was being done ("starting trial 3", ...)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, inspect, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from mlrc.store.engine import StoreError, advisory_lock, get_study, session, transact, upsert
from mlrc.store.schema import (
    METRIC_COLUMNS,
    Baseline,
    EpochMetric,
    FoldRun,
    RetrievalView,
    Study,
    StudyBaseline,
    TestResult,
    Trial,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "absolute_url",
    "archive_study",
    "best_trial",
    "best_trial_hash",
    "end_running_folds",
    "ensure_study",
    "finish_fold",
    "finish_trial",
    "fold_run",
    "fold_runs",
    "forget_checkpoint",
    "has_baseline",
    "interrupted_trial_numbers",
    "is_database_error",
    "link_baseline",
    "mark_trial",
    "record_baseline",
    "record_epoch",
    "record_reproduction",
    "reproduction_results",
    "retrieval_view",
    "running_trial_hashes",
    "start_fold",
    "start_trial",
    "stored_config",
    "studies",
    "study_status",
    "test_results",
    "tested_reproductions",
    "trial_state",
]


# --- studies -----------------------------------------------------------------------------------


def stored_config(engine: Engine, name: str) -> dict[str, Any] | None:
    """The configuration stored for study ``name``, None when there is no such study."""

    def read(s: Session) -> dict[str, Any] | None:
        row = get_study(s, name)
        return None if row is None else row.config

    return transact(engine, read, "reading the study")


def ensure_study(
    engine: Engine,
    name: str,
    *,
    dataset: str,
    loss: str,
    strategy: str | None,
    preset: str,
    config: dict[str, Any],
    code_version: str,
    settings: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """The row id and stored configuration of study ``name``, the row created (with these
    fields) when there is none. The caller compares the stored configuration with its own."""
    with advisory_lock(engine, "mlrc-register"), session(engine) as s:
        row = get_study(s, name)
        if row is None:
            row = Study(
                name=name,
                dataset=dataset,
                loss=loss,
                strategy=strategy,
                preset=preset,
                config=config,
                code_version=code_version,
                settings=settings,
            )
            s.add(row)
            s.flush()
        return row.id, row.config


def archive_study(
    engine: Engine, name: str, artifacts: Path, move: Callable[[Path, Path], None]
) -> str:
    """Rename a stored study and its Optuna study to ``NAME.old-K`` (the first free K) and point
    its checkpoint paths from ``artifacts/NAME`` to ``artifacts/NAME.old-K``; ``move(src, dst)``
    (the caller's: the files are not the store's) moves that folder last, inside the
    transaction, so a failure before it rolls the rows back. Returns the new name."""
    with advisory_lock(engine, "mlrc-register"), session(engine) as s:
        taken = set(s.scalars(select(Study.name).where(Study.name.like(f"{name}.old-%"))))
        new = next(f"{name}.old-{k}" for k in range(1, 10_000) if f"{name}.old-{k}" not in taken)
        row = get_study(s, name)
        row.name = new
        if "studies" in inspect(s.connection()).get_table_names():  # Optuna's tables
            s.execute(
                text("UPDATE studies SET study_name = :new WHERE study_name = :old"),
                {"new": new, "old": name},
            )
        src, dst = artifacts / name, artifacts / new
        if src.exists():
            s.execute(
                update(FoldRun)
                .where(FoldRun.study_id == row.id, FoldRun.checkpoint.like(f"{src}/%"))
                .values(checkpoint=func.replace(FoldRun.checkpoint, f"{src}/", f"{dst}/"))
            )
            s.flush()
            move(src, dst)  # last: a failure before it rolls the rows back
    return new


def studies(engine: Engine) -> list[Study]:
    """Every study of the store, by name (``mlrc gc`` walks them)."""
    with session(engine) as s:
        return list(s.execute(select(Study).order_by(Study.name)).scalars())


def study_status(
    engine: Engine, name: str
) -> tuple[Study, list[Trial], dict[str, int], int] | None:
    """For ``mlrc study status``: the study's row, its trials by number, the complete fold runs
    per kind (``search``, ``test``) and the number of reproductions tested; None when there is
    no study ``name``."""
    with session(engine) as s:
        st = get_study(s, name)
        if st is None:
            return None
        trials = (
            s.execute(select(Trial).filter_by(study_id=st.id).order_by(Trial.number))
            .scalars()
            .all()
        )
        folds = dict(
            s.execute(
                select(FoldRun.kind, func.count())
                .filter_by(study_id=st.id, status="complete")
                .group_by(FoldRun.kind)
            ).all()
        )
        tests = s.execute(
            select(func.count(func.distinct(TestResult.reproduction))).filter_by(study_id=st.id)
        ).scalar()
    return st, list(trials), folds, tests


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


def fold_run(engine: Engine, key: dict[str, Any], what: str) -> FoldRun | None:
    """The fold run with natural key ``key`` (study_id, kind, params_hash, reproduction, fold),
    None when it never started."""
    return transact(
        engine,
        lambda s: s.execute(select(FoldRun).filter_by(**key)).scalar_one_or_none(),
        f"reading {what}",
    )


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


def fold_runs(engine: Engine, study_id: int) -> list[FoldRun]:
    """Every fold run of the study (what checkpoint retention looks at)."""
    return transact(
        engine,
        lambda s: list(s.execute(select(FoldRun).filter_by(study_id=study_id)).scalars()),
        "reading the fold runs",
    )


def best_trial(engine: Engine, study_id: int) -> Trial | None:
    """The best complete trial (highest value, the first on a tie, as Optuna's
    ``best_trial``), None before any."""
    query = (
        select(Trial)
        .filter_by(study_id=study_id, state="complete")
        .where(Trial.value.is_not(None))
        .order_by(Trial.value.desc(), Trial.number)
        .limit(1)
    )
    return transact(engine, lambda s: s.execute(query).scalar_one_or_none(), "reading trials")


def best_trial_hash(engine: Engine, study_id: int) -> str | None:
    """The parameter hash of the best complete trial (:func:`best_trial`), None before any."""
    best = best_trial(engine, study_id)
    return None if best is None else best.params_hash


def running_trial_hashes(engine: Engine, study_id: int) -> set[str]:
    """The parameter hashes of the study's trials still running (not known yet to be worse)."""
    query = select(Trial.params_hash).filter_by(study_id=study_id, state="running")
    return transact(engine, lambda s: set(s.execute(query).scalars()), "reading trials")


def tested_reproductions(engine: Engine, study_id: int) -> set[int]:
    """The reproductions whose test results are stored."""
    query = select(TestResult.reproduction).filter_by(study_id=study_id).distinct()
    return transact(engine, lambda s: set(s.execute(query).scalars()), "reading test results")


def forget_checkpoint(engine: Engine, key: dict[str, Any], what: str) -> None:
    """The fold run with natural key ``key`` no longer has a best checkpoint on disk (committed
    before the file is deleted: a row never points at a file that retention removed)."""
    transact(
        engine,
        lambda s: s.execute(update(FoldRun).filter_by(**key).values(checkpoint=None)),
        f"forgetting the checkpoint of {what}",
    )


# --- test stage --------------------------------------------------------------------------------


def reproduction_results(engine: Engine, study_id: int, reproduction: int) -> list[TestResult]:
    """The stored test rows of one reproduction (every fold and mode)."""
    with session(engine) as s:
        return list(
            s.execute(select(TestResult).filter_by(study_id=study_id, reproduction=reproduction))
            .scalars()
            .all()
        )


def test_results(engine: Engine, study_id: int) -> list[TestResult]:
    """Every stored test row of the study (all reproductions, folds and modes)."""
    with session(engine) as s:
        return list(s.execute(select(TestResult).filter_by(study_id=study_id)).scalars())


def record_reproduction(
    engine: Engine,
    study_id: int,
    reproduction: int,
    params: dict[str, Any],
    rows: list[tuple[str, int, dict[str, float]]],
    view: dict[str, Any] | None = None,
) -> None:
    """All rows ``(mode, fold, metrics)`` of one reproduction, in one transaction; metrics other
    than the metric columns go to ``extra``. ``view``: its retrieval view
    (:class:`~mlrc.store.schema.RetrievalView`), written in the same transaction; None: none.
    Re-run whole after a lost connection (every write is an upsert)."""

    def write(s: Session) -> None:
        for mode, fold, m in rows:
            upsert(
                s,
                TestResult,
                {"study_id": study_id, "reproduction": reproduction, "mode": mode, "fold": fold},
                params=params,
                extra={k: v for k, v in m.items() if k not in METRIC_COLUMNS},
                **{k: m[k] for k in METRIC_COLUMNS},
            )
        if view is not None:
            key = {"study_id": study_id, "reproduction": reproduction}
            upsert(s, RetrievalView, key, data=view)

    transact(engine, write, f"recording reproduction {reproduction}")


def retrieval_view(engine: Engine, study_id: int, reproduction: int) -> dict[str, Any] | None:
    """The stored retrieval view of one reproduction (None: none stored)."""
    with session(engine) as s:
        query = select(RetrievalView.data).filter_by(study_id=study_id, reproduction=reproduction)
        return s.execute(query).scalar_one_or_none()


# --- the untrained baseline --------------------------------------------------------------------


def has_baseline(engine: Engine, key: str) -> bool:
    """Whether the untrained baseline with key ``key`` is computed."""

    def have(s: Session) -> bool:
        return s.execute(select(Baseline.id).filter_by(key=key)).first() is not None

    return transact(engine, have, "reading the untrained baseline")


def record_baseline(engine: Engine, key: str, metrics: dict[str, float], **fields: Any) -> None:
    """The untrained baseline's rows (separated = concatenated: the trunk's own features);
    ``fields``: dataset, kind, label, trunk, config, device, code_version."""

    def write(s: Session) -> None:
        for mode in ("separated", "concatenated"):
            upsert(
                s,
                Baseline,
                {"key": key, "mode": mode},
                **fields,
                extra={k: v for k, v in metrics.items() if k not in METRIC_COLUMNS},
                **{k: metrics[k] for k in METRIC_COLUMNS},
            )

    transact(engine, write, "recording the untrained baseline")


def link_baseline(engine: Engine, study_id: int, key: str) -> None:
    """Link the study to the untrained baseline with key ``key`` (its tables' first row)."""

    def link(s: Session) -> None:  # (not upsert: its own argument is called ``key``)
        row = s.execute(select(StudyBaseline).filter_by(study_id=study_id)).scalar_one_or_none()
        if row is None:
            s.add(StudyBaseline(study_id=study_id, key=key))
        else:
            row.key = key

    transact(engine, link, "linking the untrained baseline")


# --- URLs and errors ---------------------------------------------------------------------------


def absolute_url(url: str) -> str:
    """A relative SQLite path made absolute (for processes that run in other directories, such
    as Ray's trials); other URLs unchanged."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        return u.set(database=str(Path(u.database).resolve())).render_as_string(hide_password=False)
    return url


def is_database_error(e: BaseException) -> bool:
    """Whether ``e`` is the database failing (a :class:`StoreError` or a driver error), not the
    work being done."""
    return isinstance(e, StoreError | DBAPIError)
