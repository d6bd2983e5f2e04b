"""The store: mlrc's own tables beside Optuna's, in one SQL database (SQLite or PostgreSQL).

The public names live in private-ish modules behind this package:

- :mod:`mlrc.store.schema`: the tables (ORM classes), :data:`SCHEMA_VERSION`, metric columns;
- :mod:`mlrc.store.engine`: :func:`connect`, locks, :func:`session` / :func:`transact` /
  :func:`upsert`;
- :mod:`mlrc.store.reconnect`: :class:`StoreError`, URLs shown without passwords, database
  errors as one line, retry after a lost connection;
- :mod:`mlrc.store.migrate`: the Alembic migrations (``mlrc/store/migrations/``) that bring an
  older store to this mlrc's schema: :func:`upgrade`, :func:`current`.

Every query, named for what it does, in one module per caller:

- :mod:`mlrc.store.trials`: the search and test stage (start/finish a trial or a fold, epochs,
  reproductions, the untrained baseline, a study's status);
- :mod:`mlrc.store.history`: a study's budget and retention changes;
- :mod:`mlrc.store.campaigns`: which studies a campaign holds and their progress;
- :mod:`mlrc.store.reads`: what the report's tables read;
- :mod:`mlrc.store.snapshot`: what the dashboard reads;
- :mod:`mlrc.store.provenance` (no SQL): what computed a study's fold runs, in words, for
  ``study status`` and the report's notes.

SQL lives only in this package (an import-linter contract in pyproject.toml keeps it so).
"""

from mlrc.config.identity import canonical_json  # the store hashes what config compares
from mlrc.store import campaigns, history, reads, snapshot, trials
from mlrc.store.engine import (
    advisory_lock,
    connect,
    get_study,
    make_engine,
    optuna_storage,
    removed_lock_file,
    session,
    sqlite_file_lock,
    sqlite_path,
    transact,
    unbeaten_trials,
    upsert,
)
from mlrc.store.migrate import current, upgrade
from mlrc.store.reconnect import (
    URL_FORMS,
    StoreError,
    db_error_line,
    default_url,
    describe,
    reconnect_window_s,
    redact,
    retry,
    retry_connects,
    shown,
    sqlite_busy_s,
)
from mlrc.store.schema import (
    METRIC_COLUMNS,
    NONFINITE,
    SCHEMA_VERSION,
    Base,
    Baseline,
    CampaignStudy,
    EpochMetric,
    FoldRun,
    Meta,
    RetrievalView,
    Study,
    StudyBaseline,
    StudyHistory,
    TestResult,
    Trial,
)

__all__ = [
    "METRIC_COLUMNS",
    "NONFINITE",
    "SCHEMA_VERSION",
    "URL_FORMS",
    "Base",
    "Baseline",
    "CampaignStudy",
    "EpochMetric",
    "FoldRun",
    "Meta",
    "RetrievalView",
    "StoreError",
    "Study",
    "StudyBaseline",
    "StudyHistory",
    "TestResult",
    "Trial",
    "advisory_lock",
    "campaigns",
    "canonical_json",
    "connect",
    "current",
    "db_error_line",
    "default_url",
    "describe",
    "get_study",
    "history",
    "make_engine",
    "optuna_storage",
    "reads",
    "reconnect_window_s",
    "redact",
    "retry",
    "retry_connects",
    "session",
    "snapshot",
    "shown",
    "sqlite_busy_s",
    "removed_lock_file",
    "sqlite_file_lock",
    "sqlite_path",
    "transact",
    "trials",
    "unbeaten_trials",
    "upgrade",
    "upsert",
]
