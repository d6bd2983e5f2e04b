"""A study's row: registering it, reading it, archiving it, its status (every study-level query
of :mod:`mlrc.search`, the CLI and the terminal, named for what it does). Reads hand out
:mod:`mlrc.store.records`, never ORM rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update

from mlrc.store.engine import advisory_lock, get_study, session, transact
from mlrc.store.optuna_tables import rename_optuna_study
from mlrc.store.records import StudyRecord, TrialRecord, from_row
from mlrc.store.schema import FoldRun, Study, TestResult, Trial

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "archive_study",
    "ensure_study",
    "record_setting",
    "stored_config",
    "studies",
    "study_named",
    "study_status",
]


def stored_config(engine: Engine, name: str) -> dict[str, Any] | None:
    """The configuration stored for study ``name``, None when there is no such study."""

    def read(s: Session) -> dict[str, Any] | None:
        row = get_study(s, name)
        return None if row is None else row.config

    return transact(engine, read, "reading the study")


def study_named(engine: Engine, name: str) -> StudyRecord | None:
    """Study ``name`` (None when the store has none)."""
    with session(engine) as s:
        row = get_study(s, name)
        return None if row is None else from_row(StudyRecord, row)


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


def record_setting(engine: Engine, study_id: int, key: str, value: Any) -> None:
    """Set ``key`` of the study's settings (the artifacts folder, what ``mlrc gc`` collected);
    a study from before schema 6 (settings None) is left as it is; no write when unchanged."""

    def write(s: Session) -> None:
        row = s.get(Study, study_id)
        if row is not None and row.settings is not None and row.settings.get(key) != value:
            row.settings = {**row.settings, key: value}

    transact(engine, write, f"recording the study's {key}")


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
        rename_optuna_study(s, name, new)
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


def studies(engine: Engine) -> list[StudyRecord]:
    """Every study of the store, by name (``mlrc gc`` walks them)."""
    with session(engine) as s:
        rows = s.execute(select(Study).order_by(Study.name)).scalars()
        return [from_row(StudyRecord, row) for row in rows]


def study_status(
    engine: Engine, name: str
) -> tuple[StudyRecord, list[TrialRecord], dict[str, int], int] | None:
    """For ``mlrc study status``: the study, its trials by number, the complete fold runs per
    kind (``search``, ``test``) and the number of reproductions tested; None when there is no
    study ``name``."""
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
        study = from_row(StudyRecord, st)
        return study, [from_row(TrialRecord, t) for t in trials], folds, tests
