"""Optuna's side of the store: its RDB storage on the same database, and the only SQL mlrc
writes against Optuna's own tables (``studies``, ``trials``, ``trial_heartbeats``), where
Optuna has no API for what mlrc needs. Every other module reaches them through here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect, text

from mlrc.store.reconnect import retry_connects

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = ["has_optuna_tables", "optuna_storage", "rename_optuna_study", "unbeaten_trials"]


def optuna_storage(url: str, **heartbeat: Any) -> Any:
    """Optuna's RDB storage on the same database, with pinged, retrying connections.
    ``heartbeat``: ``heartbeat_interval``, ``grace_period``, ``heartbeat_stale_trial_callback``."""
    import optuna

    kwargs = {"pool_pre_ping": True} if not url.startswith("sqlite") else {}
    storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, **heartbeat)
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


def rename_optuna_study(s: Session, old: str, new: str) -> None:
    """Within the session's transaction, rename Optuna's study ``old`` to ``new`` (nothing when
    the store has no Optuna tables yet)."""
    if "studies" in inspect(s.connection()).get_table_names():  # Optuna's tables
        s.execute(
            text("UPDATE studies SET study_name = :new WHERE study_name = :old"),
            {"new": new, "old": old},
        )
