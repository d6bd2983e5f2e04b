"""The store: mlrc's own tables beside Optuna's, in one SQL database (SQLite or PostgreSQL).

Tables (prefix ``mlrc_``): ``study``, ``trial``, ``fold_run``, ``epoch_metric``, ``test_result``,
``baseline`` + ``study_baseline`` (the untrained "Pretrained" row), ``campaign_study`` (which
studies a campaign holds), ``meta`` (schema version). Metric columns are fractions in [0, 1]. Every write is idempotent:
rows have natural unique keys and are upserted, so re-running finished work writes nothing new.

``fold_run`` rows are keyed by (study, kind, params_hash, reproduction, fold): ``kind`` is
``search`` (reproduction 0) or ``test`` (reproductions 1..N); ``params_hash`` identifies the
hyperparameters, so a retried trial with the same parameters finds its finished folds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

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
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
)

from mlrc.errors import first_line

SCHEMA_VERSION = 3  # 2: test_result.extra (analysis metrics); 3: fold_run.objective/code_version
# Columns added since a released schema version, added in place when an older store is opened
# (additive only: an older mlrc refuses the upgraded store by its version number).
ADDED_COLUMNS: dict[int, list[tuple[str, str, str]]] = {
    3: [
        ("mlrc_fold_run", "objective", "FLOAT"),
        ("mlrc_fold_run", "code_version", "VARCHAR(64)"),
    ],
}
log = logging.getLogger("mlrc")
T = TypeVar("T")


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
    # running | complete | failed | pruned | interrupted
    state: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)  # mean val MAP@R over folds
    sem: Mapped[float | None] = mapped_column(Float)  # SEM of val MAP@R over folds
    # why it failed / was pruned; on a *complete* trial: why it was scored 0 (its loss or
    # embeddings went non-finite; the reference harness gives such a trial (0, 0)), see
    # NONFINITE
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
    # validation metrics of best_epoch (the epoch best.pt holds; 0 = the untrained model)
    map_at_r: Mapped[float | None] = mapped_column(Float)
    precision_at_1: Mapped[float | None] = mapped_column(Float)
    r_precision: Mapped[float | None] = mapped_column(Float)
    # the value the search sees: best val MAP@R over trained epochs (NULL in rows written
    # before schema 3, when epoch 0 was never best: map_at_r is that value there)
    objective: Mapped[float | None] = mapped_column(Float)
    checkpoint: Mapped[str | None] = mapped_column(Text)  # URI of the best checkpoint
    wall_time_s: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(32))  # of the run that computed it
    code_version: Mapped[str | None] = mapped_column(String(64))  # likewise
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


class Baseline(Base):
    """An untrained model on a study's test classes: the tables' first row of a dataset block.

    ``kind`` ``pretrained`` (the ImageNet trunk alone, as the reference harness's
    "untrained_trunk", epoch −1) or ``random_init`` (a trunk trained from scratch by the preset,
    randomly initialised, seeded). Computed once per ``key`` (a hash of what defines its numbers:
    dataset, trunk, weights, eval transform, split) and shared by the studies that use it
    (:class:`StudyBaseline`). ``separated`` and ``concatenated`` hold the same trunk features, as
    the reference does for untrained status; a single value, no confidence interval."""

    __tablename__ = "mlrc_baseline"
    __table_args__ = (UniqueConstraint("key", "mode"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64))
    dataset: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # pretrained | random_init
    label: Mapped[str] = mapped_column(String(128))  # row label, e.g. "Pretrained (bninception)"
    trunk: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(16))  # separated | concatenated
    map_at_r: Mapped[float] = mapped_column(Float)
    precision_at_1: Mapped[float] = mapped_column(Float)
    r_precision: Mapped[float] = mapped_column(Float)
    extra: Mapped[dict | None] = mapped_column(JSON)  # analysis metrics, as test_result.extra
    config: Mapped[dict] = mapped_column(JSON)  # what the key hashes
    device: Mapped[str | None] = mapped_column(String(32))
    code_version: Mapped[str | None] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class StudyBaseline(Base):
    """Which baseline (``mlrc_baseline.key``) belongs to a study's dataset block."""

    __tablename__ = "mlrc_study_baseline"
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"), unique=True)
    key: Mapped[str] = mapped_column(String(64))


class CampaignStudy(Base):
    """Membership of a study in a campaign (a grid of studies: dataset × loss [× strategy])."""

    __tablename__ = "mlrc_campaign_study"
    __table_args__ = (UniqueConstraint("campaign", "study_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    campaign: Mapped[str] = mapped_column(String(256), index=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    position: Mapped[int] = mapped_column(Integer)  # order in the campaign file (table rows)
    campaign_config: Mapped[dict] = mapped_column(JSON)  # the campaign file, resolved


METRIC_COLUMNS = ("map_at_r", "precision_at_1", "r_precision")
NONFINITE = "non-finite"  # reasons of trials scored 0 start with it (state complete, value 0)


# --- engine ------------------------------------------------------------------------------------


URL_FORMS = "expected sqlite:///FILE or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"


def default_url() -> str:
    return "sqlite:///mlrc.db"


_SECRET_QUERY_KEYS = ("password", "sslpassword")  # libpq takes a password in the query too
_REFUSED = (  # the server answered and refused: retrying cannot help
    "password authentication failed",
    "authentication failed for user",
    "no pg_hba.conf entry",
    "does not exist",
)


def redact(url: str) -> str:
    """The URL without its password (user part or query), for messages; as written otherwise."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:
        return "<unparsable database URL>"
    if "@" in (u.host or ""):  # an unescaped '@' in the password: part of it parsed as host
        return f"{u.drivername}://<credentials hidden: percent-encode '@' in a password as %40>"
    secret = [k for k in u.query if k.lower() in _SECRET_QUERY_KEYS]
    if u.password is None and not secret:
        return url
    u = u.update_query_dict({k: "***" for k in secret})
    return u.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def _shown(engine: Engine) -> str:
    """``engine``'s URL for messages: without its password; a SQLite path as written."""
    from urllib.parse import unquote

    rendered = engine.url.render_as_string(hide_password=False)
    return unquote(rendered) if engine.dialect.name == "sqlite" else redact(rendered)


def reconnect_window_s() -> float:
    """How long a worker waits for a lost database to come back (``MLRC_DB_RETRY_S``, 600 s)."""
    raw = os.environ.get("MLRC_DB_RETRY_S", "600")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # also NaN, which would make every deadline unreachable
        raise StoreError(f"MLRC_DB_RETRY_S={raw!r} is not a number of seconds ≥ 0")
    return value


def sqlite_busy_s() -> float:
    """How long a SQLite statement waits for another process's write lock: 30 s, or less when
    ``MLRC_DB_RETRY_S`` is less."""
    return min(30.0, reconnect_window_s())


def db_error_line(e: BaseException) -> str:
    """The first line of a database error: the driver's message (``e.orig``) when it has one."""
    return first_line(getattr(e, "orig", None) or e)


def _describe(e: BaseException) -> str:
    """The first line of a database error, with the cause spelled out where SQLite is terse."""
    line = db_error_line(e)
    if line == "database is locked":
        return (
            f"database is locked (another process holds a write transaction; waited "
            f"{sqlite_busy_s():g} s, MLRC_DB_RETRY_S caps the wait)"
        )
    return line


def _refused(e: BaseException) -> bool:
    """Did the server refuse the login (wrong password or user, no such database)?"""
    return any(marker in db_error_line(e) for marker in _REFUSED)


_BACKOFF = wait_exponential(multiplier=0.5, max=30)  # 0.5, 1, 2, ... 30 s between attempts


def _failure(rs: RetryCallState) -> BaseException:
    """The error of the attempt that just failed (only failed attempts are retried)."""
    e = rs.outcome.exception() if rs.outcome is not None else None
    assert isinstance(e, BaseException)
    return e


def _warn(message: str, subject: str) -> Callable[[RetryCallState], None]:
    """A ``before_sleep`` that logs ``message % (subject, the error's first line, seconds)``."""

    def note(rs: RetryCallState) -> None:
        log.warning(message, subject, db_error_line(_failure(rs)), rs.upcoming_sleep)

    return note


def retry_connects(engine: Engine, first_s: float = 5.0, connected: bool = False) -> Engine:
    """Make every new connection of ``engine`` retry with exponential backoff (0.5 s → 30 s):
    for ``first_s`` seconds before the first success (a typo fails fast), then for
    :func:`reconnect_window_s` (a restarted server is waited for). With ``pool_pre_ping`` this
    turns a database restart into a pause. Messages never contain the password.

    A refused login (wrong password or user, no such database) is not retried, and a failed
    first connection raises :class:`StoreError`, which :func:`retry` does not retry either. Each
    attempt gives up after ``connect_timeout`` (default: the window left, 2 to 10 s), so a server
    that accepts connections but never answers cannot hang the caller."""
    if engine.dialect.name == "sqlite":
        return engine
    state = {"connected": connected}
    where = _shown(engine)
    timeout_preset = "connect_timeout" in engine.url.query

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> Any:
        window = reconnect_window_s() if state["connected"] else first_s
        deadline = time.monotonic() + window
        unreachable = dialect.loaded_dbapi.OperationalError

        def bound_attempt(_: RetryCallState) -> None:  # each attempt: the window left, 2 to 10 s
            if dialect.name == "postgresql" and not timeout_preset:
                left = math.ceil(deadline - time.monotonic())
                cparams["connect_timeout"] = max(2, min(10, left))

        def attempt() -> Any:
            conn = dialect.loaded_dbapi.connect(*cargs, **cparams)
            state["connected"] = True
            return conn

        try:
            return Retrying(
                retry=retry_if_exception(lambda e: isinstance(e, unreachable) and not _refused(e)),
                wait=_BACKOFF,
                stop=stop_before_delay(window),
                before=bound_attempt,
                before_sleep=_warn("database %s unreachable (%s); retrying in %.1f s", where),
                reraise=True,
            )(attempt)
        except unreachable as e:  # refused, or still unreachable at the end of the window
            if state["connected"]:
                raise
            raise StoreError(f"{where}: cannot connect ({db_error_line(e)})") from None

    return engine


def retry(fn: Callable[[], T], engine: Engine, what: str) -> T:
    """Run ``fn`` (a whole transaction), again after a lost connection, for up to
    :func:`reconnect_window_s` seconds; other errors propagate at once."""
    from sqlalchemy.exc import DBAPIError

    def lost(e: BaseException) -> bool:
        return isinstance(e, DBAPIError) and (e.connection_invalidated or _is_disconnect(e, engine))

    def give_up(rs: RetryCallState) -> T:
        raise StoreError(
            f"{_shown(engine)}: lost the connection while {what} "
            f"and it did not come back ({db_error_line(_failure(rs))})"
        ) from None

    return Retrying(
        retry=retry_if_exception(lost),
        wait=_BACKOFF,
        stop=stop_before_delay(reconnect_window_s()),
        before_sleep=_warn("%s: connection lost (%s); retrying in %.1f s", what),
        retry_error_callback=give_up,
    )(fn)


def _is_disconnect(e: Exception, engine: Engine) -> bool:
    from sqlalchemy.exc import InterfaceError, OperationalError

    if engine.dialect.name == "sqlite":
        return False
    return isinstance(e, OperationalError | InterfaceError)


@contextmanager
def advisory_lock(engine: Engine, name: str) -> Iterator[None]:
    """A cluster-wide mutex named ``name`` (PostgreSQL advisory lock, released on disconnect,
    so a killed holder never blocks the others). On SQLite a no-op: one process per study."""
    if engine.dialect.name != "postgresql":
        yield
        return
    from sqlalchemy import text

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    conn = retry(engine.connect, engine, "taking a lock")
    try:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        conn.commit()
        yield
    finally:
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
        except Exception:  # connection gone: the server released the lock with it
            pass
        conn.close()


def connect(url: str, read_only: bool = False) -> Engine:
    """Engine for ``url``; creates mlrc's tables and checks the schema version.

    PostgreSQL engines ping pooled connections and retry lost ones (:func:`retry_connects`);
    table creation is serialised by an advisory lock, so many workers may start at once.
    ``read_only`` (commands that only read): a SQLite file that does not exist is a
    :class:`StoreError` and is not created (a typo in the URL would show an empty store)."""
    from sqlalchemy.exc import ArgumentError, DBAPIError

    try:
        engine = create_engine(url, pool_pre_ping=True, future=True)
    except (ArgumentError, ImportError, ValueError) as e:
        raise StoreError(
            f"{redact(url)}: cannot use this database URL ({e}; {URL_FORMS})"
        ) from None
    if "@" in (engine.url.host or ""):  # the host's name would show the rest of the password
        raise StoreError(f"{redact(url)}: cannot use this database URL")
    if engine.dialect.name == "sqlite":
        database = sqlite_path(engine)
        if read_only and database is not None and not os.path.exists(database):
            raise StoreError(
                f"{redact(url)}: no such database file ({database}); check --storage or "
                "MLRC_STORAGE"
            )
        event.listen(engine, "connect", _sqlite_pragmas)
    retry_connects(engine)
    try:
        with advisory_lock(engine, "mlrc-schema"), _sqlite_file_lock(engine, "schema"):
            Base.metadata.create_all(engine)
            with Session(engine) as s, s.begin():
                row = s.get(Meta, "schema_version")
                if row is None:
                    s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
                elif row.value.isdigit() and 2 <= int(row.value) < SCHEMA_VERSION:
                    _add_columns(s, int(row.value))
                    row.value = str(SCHEMA_VERSION)
                elif row.value != str(SCHEMA_VERSION):
                    raise StoreError(
                        f"{redact(url)}: written by mlrc schema version {row.value}, this mlrc "
                        f"reads version {SCHEMA_VERSION}"
                    )
            # Optuna's tables, created once under the lock: two processes creating them at once
            # race on Optuna's alembic_version row (an IntegrityError for the second).
            optuna_storage(url).engine.dispose()
    except DBAPIError as e:
        raise StoreError(f"{redact(url)}: {_describe(e)}") from None
    return engine


def _add_columns(s: Session, version: int) -> None:
    """Upgrade a store of schema ``version`` in place: add the columns of later versions."""
    from sqlalchemy import inspect, text

    for v in range(version + 1, SCHEMA_VERSION + 1):
        for table, column, sql_type in ADDED_COLUMNS.get(v, []):
            have = {c["name"] for c in inspect(s.connection()).get_columns(table)}
            if column not in have:
                s.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))
    log.info("store upgraded from schema %d to %d", version, SCHEMA_VERSION)


def sqlite_path(engine: Engine) -> str | None:
    """The file of a SQLite engine (a ``file:`` URI's path part), None for PostgreSQL or an
    in-memory database."""
    import urllib.parse

    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        return None
    if database.startswith("file:"):  # a URI filename (uri=true): its path part
        return urllib.parse.urlsplit(database).path
    return database


@contextmanager
def _sqlite_file_lock(engine: Engine, name: str) -> Iterator[None]:
    """On a SQLite file, an exclusive ``flock`` on ``<database>.<name>.lock`` (released when the
    process dies); a no-op for PostgreSQL and in-memory databases."""
    from filelock import FileLock

    database = sqlite_path(engine)
    # filelock would create a missing folder: SQLite is to name it ("unable to open database file")
    if database is None or not os.path.isdir(os.path.dirname(os.path.abspath(database))):
        yield
        return
    lock = FileLock(
        f"{database}.{name}.lock",
        thread_local=False,
        preserve_lock_file=True,
        fallback_to_soft=False,
    )
    try:
        lock.acquire()
    except OSError:  # a read-only folder: nothing can be created there, so nothing races
        yield
        return
    try:
        yield
    finally:
        lock.release()


def optuna_storage(url: str, **heartbeat: Any) -> Any:
    """Optuna's RDB storage on the same database, with pinged, retrying connections.
    ``heartbeat``: ``heartbeat_interval``, ``grace_period``, ``heartbeat_stale_trial_callback``."""
    import optuna

    kwargs = {"pool_pre_ping": True} if not url.startswith("sqlite") else {}
    storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, **heartbeat)
    retry_connects(storage.engine, connected=True)
    return storage


def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(1000 * sqlite_busy_s())}")  # first: WAL may wait
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


@contextmanager
def session(engine: Engine) -> Iterator[Session]:
    """A transaction: committed on success, rolled back on any error. On SQLite an operational
    error (locked past the busy timeout, a read-only file, a full disk) is a :class:`StoreError`."""
    from sqlalchemy.exc import OperationalError

    maker = sessionmaker(engine, expire_on_commit=False)
    try:
        with maker() as s, s.begin():
            yield s
    except OperationalError as e:
        if engine.dialect.name != "sqlite":
            raise  # PostgreSQL: a lost connection, which retry() waits out
        raise StoreError(f"{_shown(engine)}: {_describe(e)}") from None


# --- repository functions ----------------------------------------------------------------------


def upsert(s: Session, model: type[Base], key: dict[str, Any], **values: Any) -> Base:
    """Insert or update the row with natural key ``key``; returns it (flushed). Two processes
    inserting the same key at once both succeed: the loser updates the winner's row."""
    from sqlalchemy.exc import IntegrityError

    row = s.execute(select(model).filter_by(**key)).scalar_one_or_none()
    if row is None:
        try:
            with s.begin_nested():
                row = model(**key, **values)
                s.add(row)
            return row
        except IntegrityError:
            row = s.execute(select(model).filter_by(**key)).scalar_one()
    for k, v in values.items():
        setattr(row, k, v)
    s.flush()
    return row


def transact(engine: Engine, fn: Callable[[Session], T], what: str) -> T:
    """``fn(session)`` in one transaction, re-run after a lost connection (see :func:`retry`)."""

    def once() -> T:
        with session(engine) as s:
            return fn(s)

    return retry(once, engine, what)


def get_study(s: Session, name: str) -> Study | None:
    return s.execute(select(Study).filter_by(name=name)).scalar_one_or_none()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
