"""A study's history: the changes of what its file may change without changing its numbers
(budgets: ``search.trials``, ``test.reproductions``; retention: ``artifacts.keep``), each with
its time, old → new value and the code version that saw it (table ``mlrc_study_history``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from mlrc.store.engine import advisory_lock, transact
from mlrc.store.schema import Study, StudyHistory

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = ["last_values", "record_changes", "study_history"]


Changes = list[tuple[str, Any, Any]]  # [(field, old, new)]


def record_changes(
    engine: Engine,
    study_id: int,
    diff: Callable[[dict[str, Any], dict[str, str | None]], tuple[Changes, dict[str, Any] | None]],
    code_version: str,
) -> Changes:
    """Under the registration lock, in one transaction: ``diff(stored config, last recorded
    values)`` says what changed and the configuration to store (None: keep the stored one); the
    changes are recorded and returned (two workers starting with the same change record it
    once)."""

    def write(s: Session) -> Changes:
        row = s.get(Study, study_id)
        last = {h.field: h.new for h in _history(s, study_id)}
        changes, config = diff(row.config, last)
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
        return changes

    with advisory_lock(engine, "mlrc-register"):
        return transact(engine, write, "recording the study's history")


def _history(s: Session, study_id: int) -> list[StudyHistory]:
    query = select(StudyHistory).filter_by(study_id=study_id)
    return list(s.execute(query.order_by(StudyHistory.time, StudyHistory.id)).scalars())


def study_history(engine: Engine, study_id: int) -> list[StudyHistory]:
    """The study's history, oldest first."""
    return transact(engine, lambda s: _history(s, study_id), "reading the study's history")


def last_values(engine: Engine, study_id: int) -> dict[str, str | None]:
    """The latest recorded value of each field in the study's history."""
    return {row.field: row.new for row in study_history(engine, study_id)}
