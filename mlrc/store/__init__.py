"""The store: mlrc's own tables beside Optuna's, in one SQL database (SQLite or PostgreSQL).

Callers (search, report, the CLI) get named operations and frozen records, never a session or
an ORM row. This face exports what they use; the rooms behind it:

- :mod:`mlrc.store.records`: what queries hand out: :class:`StudyRecord`,
  :class:`TrialRecord`, :class:`FoldRunRecord`, :class:`TestResultRecord`,
  :class:`BaselineRecord`, :class:`HistoryRecord`, :class:`StudyProgress` (frozen dataclasses
  with the tables' column names, as Optuna's ``FrozenTrial``);
- the queries, one module per job, each function named for what it does:
  :mod:`~mlrc.store.studies` (register, read, archive a study; its status),
  :mod:`~mlrc.store.trials` (trials and fold runs of the search),
  :mod:`~mlrc.store.curves` (a search's trials and validation curves, for replay and stopping),
  :mod:`~mlrc.store.results` (test results, retrieval views, the untrained baseline),
  :mod:`~mlrc.store.embeddings` (stored test embeddings' files and metrics re-scored from them),
  :mod:`~mlrc.store.history` (a study's settings and their changes),
  :mod:`~mlrc.store.campaigns` (which studies a campaign holds, their progress),
  :mod:`~mlrc.store.costs` (what fold runs cost: epochs, wall time, device; test MAP@R),
  :mod:`~mlrc.store.reads` (what the report's tables read),
  :mod:`~mlrc.store.snapshot` (what the dashboard reads),
  :mod:`~mlrc.store.transfer` (one study's rows as plain data, and back);
- :mod:`mlrc.store.provenance` (no SQL): what computed a study's fold runs, in words;
- :mod:`mlrc.store.engine`: engines and locks;
  its sessions, ``transact``, ``upsert`` and ``get_study`` are the query modules' own;
- :mod:`mlrc.store.reconnect`: :class:`StoreError`, URLs shown without passwords, database
  errors as one line, retry after a lost connection;
- :mod:`mlrc.store.optuna_tables`: Optuna's storage on the same database and the only SQL
  against Optuna's own tables (heartbeats, renaming its study);
- :mod:`mlrc.store.schema`: the tables (ORM classes, for the store, its migrations and tests),
  :data:`~mlrc.store.schema.SCHEMA_VERSION`, the metric columns;
- :mod:`mlrc.store.migrate`: the Alembic migrations (``mlrc/store/migrations/``) that bring an
  older store to this mlrc's schema: :func:`connect` (the door: an engine at this mlrc's schema),
  :func:`upgrade`, :func:`current`;
- :mod:`mlrc.store.throwaway`: a throwaway PostgreSQL server for tests and benchmarks.

SQL lives only in this package, and ORM classes and sessions stay inside it (import-linter
contracts in pyproject.toml keep it so).
"""

from mlrc.store import (
    campaigns,
    costs,
    curves,
    embeddings,
    history,
    provenance,
    reads,
    results,
    snapshot,
    studies,
    transfer,
    trials,
)
from mlrc.store.engine import (
    HeldFile,
    HeldLock,
    LockLost,
    advisory_lock,
    many_studies,
    removed_lock_file,
    sqlite_path,
    try_advisory_lock,
)
from mlrc.store.migrate import connect, current, upgrade
from mlrc.store.optuna_tables import optuna_storage, unbeaten_trials
from mlrc.store.reconnect import (
    StoreError,
    absolute_url,
    db_error_line,
    is_database_error,
    redact,
    retry,
)
from mlrc.store.records import (
    BaselineRecord,
    EmbeddingFileRecord,
    FoldCurve,
    FoldRunRecord,
    HistoryRecord,
    StudyProgress,
    StudyRecord,
    TestResultRecord,
    TrialRecord,
)
from mlrc.store.schema import METRIC_COLUMNS, NONFINITE

__all__ = [
    "METRIC_COLUMNS",
    "NONFINITE",
    "BaselineRecord",
    "EmbeddingFileRecord",
    "FoldCurve",
    "FoldRunRecord",
    "HeldFile",
    "HeldLock",
    "HistoryRecord",
    "LockLost",
    "StoreError",
    "StudyProgress",
    "StudyRecord",
    "TestResultRecord",
    "TrialRecord",
    "absolute_url",
    "advisory_lock",
    "campaigns",
    "costs",
    "curves",
    "connect",
    "current",
    "db_error_line",
    "embeddings",
    "history",
    "is_database_error",
    "many_studies",
    "optuna_storage",
    "provenance",
    "reads",
    "redact",
    "removed_lock_file",
    "results",
    "retry",
    "snapshot",
    "sqlite_path",
    "studies",
    "transfer",
    "trials",
    "try_advisory_lock",
    "unbeaten_trials",
    "upgrade",
]
