"""A study's settings and their history: what its file or command line may change without
changing its numbers (budgets: ``search.trials``, ``test.reproductions``; retention:
``artifacts.keep``; torch's intra-op ``threads`` per fold), as they stand now
(``mlrc_study.settings``, the budgets in ``mlrc_study.config``) and each change with its time,
old → new value and the code version that saw it (table ``mlrc_study_history``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from mlrc.store.engine import advisory_lock, transact
from mlrc.store.records import HistoryRecord, from_row
from mlrc.store.schema import Study, StudyHistory

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = ["last_values", "record_changes", "stored_settings", "study_history"]


Changes = list[tuple[str, Any, Any]]  # [(field, old, new)]
# diff(stored config, stored settings or None (a study from before schema 6), last recorded
# values) -> (changes, config to store or None, settings to store or None)
Diff = Callable[
    [dict[str, Any], dict[str, Any] | None, dict[str, str | None]],
    tuple[Changes, dict[str, Any] | None, dict[str, Any] | None],
]


def record_changes(engine: Engine, study_id: int, diff: Diff, code_version: str) -> Changes:
    """Under the registration lock, in one transaction: ``diff`` says what changed and the
    configuration and settings to store (None: keep the stored ones); the changes are recorded
    and returned (two workers starting with the same change record it once)."""

    def write(s: Session) -> Changes:
        row = s.get(Study, study_id)
        last = {h.field: h.new for h in _history(s, study_id)}
        changes, config, settings = diff(row.config, row.settings, last)
        for field, old, new in changes:
            s.add(
                StudyHistory(
                    study_id=study_id,
                    field=field,
                    old=None if old is None else str(old),
                    new=None if new is None else str(new),
                    code_version=code_version,
                )
            )
        if config is not None:
            row.config = config
        if settings is not None:
            row.settings = settings
        return changes

    with advisory_lock(engine, "mlrc-register"):
        return transact(engine, write, "recording the study's history")


def stored_settings(
    engine: Engine, study_id: int
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, str | None]]:
    """What :func:`record_changes` gives its ``diff``, read without the lock: the stored
    configuration, settings (None before schema 6) and last recorded values."""

    def read(s: Session) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, str | None]]:
        row = s.get(Study, study_id)
        return row.config, row.settings, {h.field: h.new for h in _history(s, study_id)}

    return transact(engine, read, "reading the study's settings")


def _history(s: Session, study_id: int) -> list[StudyHistory]:
    query = select(StudyHistory).filter_by(study_id=study_id)
    return list(s.execute(query.order_by(StudyHistory.time, StudyHistory.id)).scalars())


def study_history(engine: Engine, study_id: int) -> list[HistoryRecord]:
    """The study's history, oldest first."""

    def read(s: Session) -> list[HistoryRecord]:
        return [from_row(HistoryRecord, h) for h in _history(s, study_id)]

    return transact(engine, read, "reading the study's history")


def last_values(engine: Engine, study_id: int) -> dict[str, Any]:
    """The study's current value of each field that has one: its stored settings
    (``artifacts.keep``, ``threads``), else (a study from before schema 6) the latest recorded
    value in its history."""

    def read(s: Session) -> dict[str, Any]:
        out: dict[str, Any] = {h.field: h.new for h in _history(s, study_id)}
        settings = s.get(Study, study_id).settings or {}
        out.update({k: v for k, v in settings.items() if k != "file"})
        return out

    return transact(engine, read, "reading the study's settings")
