"""Optuna's side of the store: its RDB storage on the same database, and the only SQL mlrc
writes against Optuna's own tables (``studies``, ``trials``, ``trial_heartbeats``), where
Optuna has no API for what mlrc needs. Every other module reaches them through here."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, inspect, text

from mlrc.store.engine import pool_options
from mlrc.store.reconnect import retry, retry_connects

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "has_optuna_tables",
    "optuna_storage",
    "rename_optuna_study",
    "running_trial_workers",
    "unbeaten_trials",
]


def optuna_storage(url: str, **heartbeat: Any) -> Any:
    """Optuna's RDB storage on the same database, with pinged, retrying connections.
    ``heartbeat``: ``heartbeat_interval``, ``grace_period``, ``heartbeat_stale_trial_callback``."""
    import optuna

    if url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url, **heartbeat)

    def make() -> Any:  # it connects at once (its tables, its schema's version)
        kwargs = {"pool_pre_ping": True, **pool_options(url)}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, **heartbeat)

    # mlrc's own engine connected first: a failure now is a restart (a worker started during
    # one exited 2), retried for the long window like any lost connection
    dialect_only = create_engine(url)  # never connects: store.retry reads its dialect
    storage = retry(make, dialect_only, "opening Optuna's storage")
    retry_connects(storage.engine, connected=True)
    return storage


def has_optuna_tables(engine: Engine) -> bool:
    """Whether the store holds Optuna's tables (its ``studies`` table)."""
    with engine.connect() as conn:
        return inspect(conn).has_table("studies")


def unbeaten_trials(engine: Engine, optuna_study_id: int) -> list[tuple[int, int]]:
    """(trial id, number) of the RUNNING trials of Optuna's study ``optuna_study_id`` that have
    never recorded a heartbeat (read from Optuna's tables, which have no API for it)."""
    q = text(
        "SELECT t.trial_id, t.number FROM trials t"
        " LEFT JOIN trial_heartbeats h ON h.trial_id = t.trial_id"
        " WHERE t.study_id = :sid AND t.state = 'RUNNING' AND h.trial_id IS NULL"
        " ORDER BY t.number"
    )
    with engine.connect() as c:
        return [(r[0], r[1]) for r in c.execute(q, {"sid": optuna_study_id})]


def running_trial_workers(engine: Engine, study_name: str) -> dict[int, tuple[str | None, Any]]:
    """Trial number → (its ``worker`` user attribute, decoded; its last heartbeat, a UTC time
    as the database returns it) of the RUNNING trials of Optuna's study ``study_name``; None
    where a trial has none. Empty when the store has no Optuna tables."""
    if not has_optuna_tables(engine):
        return {}
    q = text(
        "SELECT t.number, a.value_json, MAX(h.heartbeat) FROM trials t"
        " JOIN studies s ON s.study_id = t.study_id"
        " LEFT JOIN trial_user_attributes a ON a.trial_id = t.trial_id AND a.key = 'worker'"
        " LEFT JOIN trial_heartbeats h ON h.trial_id = t.trial_id"
        " WHERE s.study_name = :name AND t.state = 'RUNNING'"
        " GROUP BY t.number, a.value_json"
    )
    with engine.connect() as c:
        rows = c.execute(q, {"name": study_name}).all()
    return {r[0]: (None if r[1] is None else str(json.loads(r[1])), r[2]) for r in rows}


def rename_optuna_study(s: Session, old: str, new: str) -> None:
    """Within the session's transaction, rename Optuna's study ``old`` to ``new`` (nothing when
    the store has no Optuna tables yet)."""
    if "studies" in inspect(s.connection()).get_table_names():  # Optuna's tables
        s.execute(
            text("UPDATE studies SET study_name = :new WHERE study_name = :old"),
            {"new": new, "old": old},
        )
