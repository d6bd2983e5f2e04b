"""The store: mlrc's own tables beside Optuna's, in one SQL database (SQLite or PostgreSQL).

Tables (prefix ``mlrc_``): ``study``, ``trial``, ``fold_run``, ``epoch_metric``, ``test_result``,
``meta`` (schema version). Metric columns are fractions in [0, 1]. Every write is idempotent:
rows have natural unique keys and are upserted, so re-running finished work writes nothing new.

``fold_run`` rows are keyed by (study, kind, params_hash, reproduction, fold): ``kind`` is
``search`` (reproduction 0) or ``test`` (reproductions 1..N); ``params_hash`` identifies the
hyperparameters, so a retried trial with the same parameters finds its finished folds.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

SCHEMA_VERSION = 2  # 2: test_result.extra (analysis metrics)


class StoreError(RuntimeError):
    """The database cannot be used (wrong schema version, unreachable, not a database)."""


class Base(DeclarativeBase):
    pass


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Meta(Base):
    __tablename__ = "mlrc_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Study(Base):
    __tablename__ = "mlrc_study"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    dataset: Mapped[str] = mapped_column(String(64))
    loss: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str | None] = mapped_column(String(64))
    preset: Mapped[str] = mapped_column(String(256))
    config: Mapped[dict] = mapped_column(JSON)
    code_version: Mapped[str] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class Trial(Base):
    __tablename__ = "mlrc_trial"
    __table_args__ = (UniqueConstraint("study_id", "number"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    number: Mapped[int] = mapped_column(Integer)  # Optuna trial number
    params: Mapped[dict] = mapped_column(JSON)
    params_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # running | complete | failed | interrupted
    value: Mapped[float | None] = mapped_column(Float)  # mean val MAP@R over folds
    sem: Mapped[float | None] = mapped_column(Float)  # SEM of val MAP@R over folds
    reason: Mapped[str | None] = mapped_column(Text)
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=_now, onupdate=_now)


class FoldRun(Base):
    __tablename__ = "mlrc_fold_run"
    __table_args__ = (UniqueConstraint("study_id", "kind", "params_hash", "reproduction", "fold"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    kind: Mapped[str] = mapped_column(String(8))  # search | test
    params_hash: Mapped[str] = mapped_column(String(64))
    reproduction: Mapped[int] = mapped_column(Integer)  # 0 for search, 1..N for test
    fold: Mapped[int] = mapped_column(Integer)
    trial_number: Mapped[int | None] = mapped_column(Integer)  # trial that (last) ran it
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # running | complete | failed
    reason: Mapped[str | None] = mapped_column(Text)
    best_epoch: Mapped[int | None] = mapped_column(Integer)
    map_at_r: Mapped[float | None] = mapped_column(Float)  # best validation metrics
    precision_at_1: Mapped[float | None] = mapped_column(Float)
    r_precision: Mapped[float | None] = mapped_column(Float)
    checkpoint: Mapped[str | None] = mapped_column(Text)  # URI of the best checkpoint
    wall_time_s: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(32))
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=_now, onupdate=_now)


class EpochMetric(Base):
    __tablename__ = "mlrc_epoch_metric"
    __table_args__ = (UniqueConstraint("fold_run_id", "epoch"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    fold_run_id: Mapped[int] = mapped_column(ForeignKey("mlrc_fold_run.id"))
    epoch: Mapped[int] = mapped_column(Integer)
    train_loss: Mapped[float | None] = mapped_column(Float)  # mean over the epoch's iterations
    map_at_r: Mapped[float] = mapped_column(Float)
    precision_at_1: Mapped[float] = mapped_column(Float)
    r_precision: Mapped[float] = mapped_column(Float)


class TestResult(Base):
    __test__ = False  # not a pytest test class
    __tablename__ = "mlrc_test_result"
    __table_args__ = (UniqueConstraint("study_id", "reproduction", "mode", "fold"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    reproduction: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))  # separated | concatenated
    fold: Mapped[int] = mapped_column(Integer)  # −1: the aggregate (mean of folds / 512-D)
    map_at_r: Mapped[float] = mapped_column(Float)
    precision_at_1: Mapped[float] = mapped_column(Float)
    r_precision: Mapped[float] = mapped_column(Float)
    params: Mapped[dict] = mapped_column(JSON)
    # analysis metrics beside MAP@R: recall_at_1/2/4/8, nmi, map_at_1000 (fractions),
    # spectral_decay, pi_ratio, metrix_utilization (squared distance on unit vectors)
    extra: Mapped[dict | None] = mapped_column(JSON)


METRIC_COLUMNS = ("map_at_r", "precision_at_1", "r_precision")


# --- engine ------------------------------------------------------------------------------------


def default_url() -> str:
    return "sqlite:///mlrc.db"


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable database URL>"


def connect(url: str) -> Engine:
    """Engine for ``url``; creates mlrc's tables and checks the schema version."""
    from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

    try:
        engine = create_engine(url, pool_pre_ping=True, future=True)
    except (ArgumentError, ImportError) as e:
        raise StoreError(f"{redact(url)}: cannot use this database URL ({e})") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as s, s.begin():
            row = s.get(Meta, "schema_version")
            if row is None:
                s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(row.value) != SCHEMA_VERSION:
                raise StoreError(
                    f"{redact(url)}: written by mlrc schema version {row.value}, this mlrc reads "
                    f"version {SCHEMA_VERSION}"
                )
    except (OperationalError, DatabaseError) as e:
        raise StoreError(f"{redact(url)}: {str(e.orig).splitlines()[0]}") from None
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


@contextmanager
def session(engine: Engine) -> Iterator[Session]:
    """A transaction: committed on success, rolled back on any error."""
    maker = sessionmaker(engine, expire_on_commit=False)
    with maker() as s, s.begin():
        yield s


# --- repository functions ----------------------------------------------------------------------


def upsert(s: Session, model: type[Base], key: dict[str, Any], **values: Any) -> Base:
    """Insert or update the row with natural key ``key``; returns it (flushed)."""
    row = s.execute(select(model).filter_by(**key)).scalar_one_or_none()
    if row is None:
        row = model(**key, **values)
        s.add(row)
    else:
        for k, v in values.items():
            setattr(row, k, v)
    s.flush()
    return row


def get_study(s: Session, name: str) -> Study | None:
    return s.execute(select(Study).filter_by(name=name)).scalar_one_or_none()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
