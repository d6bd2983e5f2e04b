"""Connections to the store: engines, locks, transactions.

The door, :func:`mlrc.store.connect` (an engine whose tables are at this mlrc's schema), is
:mod:`mlrc.store.migrate`'s: it builds on :func:`make_engine` here. The rest is what the query
modules build on: :func:`session` / :func:`transact` (one transaction, re-run after a
lost PostgreSQL connection), :func:`upsert` (idempotent writes), :func:`advisory_lock` (a
cluster-wide mutex). URLs, errors and retry are in :mod:`mlrc.store.reconnect`; Optuna's storage
and tables in :mod:`mlrc.store.optuna_tables`. Sessions, :func:`upsert` and :func:`get_study`
hand out ORM rows: they are for the store's own modules (and tests), never for its callers.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from mlrc.errors import first_line, sleep_or_stop
from mlrc.store.reconnect import (
    URL_FORMS,
    StoreError,
    describe,
    redact,
    retry,
    retry_connects,
    shown,
    sqlite_busy_s,
)
from mlrc.store.schema import Base, Study

T = TypeVar("T")


class LockLost(RuntimeError):
    """A lock this process took is no longer its own (its connection, which held it, is gone:
    a database restart, a terminated backend; or its lock file was replaced). The work done
    under it must be redone under a new one."""


_HELD = (  # an advisory lock on a bigint key: classid its high 32 bits, objid its low 32 bits
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
    "AND granted AND objsubid = 1 AND classid::bigint = :c AND objid::bigint = :o"
)


class HeldLock:
    """The lock an :func:`advisory_lock` block holds; :meth:`check` says it still does."""

    def __init__(self, conn: Any = None, key: int = 0, name: str = "") -> None:
        self.conn, self.key, self.name = conn, key, name

    def check(self) -> None:
        """:class:`LockLost` unless this process still holds the lock: on PostgreSQL, its lock
        connection's own backend is granted it in ``pg_locks`` (a connection that fails to answer
        has lost it). A no-op on SQLite, where the study's lock file is the lock."""
        if self.conn is None:
            return
        from sqlalchemy import text
        from sqlalchemy.exc import DBAPIError

        unsigned = self.key & 0xFFFFFFFFFFFFFFFF
        try:
            held = self.conn.execute(
                text(_HELD), {"c": unsigned >> 32, "o": unsigned & 0xFFFFFFFF}
            ).scalar()
            self.conn.commit()
        except DBAPIError as e:
            raise LockLost(
                f"lock {self.name!r} lost with its connection ({first_line(e.orig or e)})"
            ) from None
        if not held:
            raise LockLost(f"lock {self.name!r} is no longer held by this process")


class HeldFile:
    """The lock file a :func:`removed_lock_file` block holds; :meth:`check` says it still
    does."""

    def __init__(self, path: str, held: os.stat_result) -> None:
        self.path, self.held = path, held

    def check(self) -> None:
        """:class:`LockLost` unless the file at ``path`` is still the one this process locked
        (same device and inode: not removed, not replaced) and it is still locked (a new
        ``flock`` of it, from another open file, fails)."""
        import fcntl

        try:
            if not os.path.samestat(os.stat(self.path), self.held):
                raise FileNotFoundError  # another file now: this one was removed
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            raise LockLost(f"{self.path}: the lock file was removed or replaced") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # locked: by this process, the file being the one it locked
        finally:
            os.close(fd)  # also releases the lock just taken, if it was taken
        raise LockLost(f"{self.path}: the lock file is no longer locked")


# How long recording a stop waits for a lock (Slurm's SIGKILL follows its SIGTERM after 30 s).
STOPPING_WAIT_S = 10.0


@contextmanager
def advisory_lock(engine: Engine, name: str, stopping: bool = False) -> Iterator[HeldLock]:
    """A cluster-wide mutex named ``name`` (PostgreSQL advisory lock, released on disconnect,
    so a killed holder never blocks the others), held on a connection of its own; the block
    gets a :class:`HeldLock` to check that it still holds it. Waiting for it polls
    (``pg_try_advisory_lock``, every 10 ms growing to 100 ms), looking for a stop signal each
    time — unless ``stopping``: the caller records a stop already received (a trial
    interrupted), so the wait goes on through it, for at most :data:`STOPPING_WAIT_S` seconds
    (then :class:`StoreError`). On SQLite a no-op: one process per study."""
    if engine.dialect.name != "postgresql":
        yield HeldLock()
        return
    from sqlalchemy import text

    key = _lock_key(name)
    conn = retry(engine.connect, engine, "taking a lock")
    try:
        wait_s, deadline = 0.01, time.monotonic() + STOPPING_WAIT_S
        while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            conn.commit()
            if not stopping:
                sleep_or_stop(wait_s)
            elif time.monotonic() < deadline:
                time.sleep(wait_s)
            else:
                raise StoreError(f"the lock {name!r} was not free within {STOPPING_WAIT_S} s")
            wait_s = min(0.1, 2 * wait_s)
        conn.commit()
        yield HeldLock(conn, key, name)
    finally:
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
        except Exception:  # connection gone: the server released the lock with it
            pass
        conn.close()


@contextmanager
def try_advisory_lock(engine: Engine, name: str) -> Iterator[HeldLock | None]:
    """:func:`advisory_lock` without waiting: the block gets the :class:`HeldLock`, or None when
    another process holds ``name`` now. On SQLite always held (one process per study)."""
    if engine.dialect.name != "postgresql":
        yield HeldLock()
        return
    from sqlalchemy import text

    key, got = _lock_key(name), False
    conn = retry(engine.connect, engine, "taking a lock")
    try:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
        conn.commit()
        yield HeldLock(conn, key, name) if got else None
    finally:
        if got:
            with suppress(Exception):  # connection gone: the lock went with it
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
        conn.close()


def _lock_key(name: str) -> int:
    """The 64-bit advisory lock key of the lock named ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


# A process that keeps many studies open (a campaign worker) must not hold a pool of connections
# per study: N workers × S studies × (mlrc's engine + Optuna's) exhaust the server's
# max_connections. Set by many_studies(): mlrc's engine is one per URL in the process, Optuna's
# storages hold no idle connection.
_MANY_STUDIES = [False]
_SHARED: dict[str, Engine] = {}


def many_studies() -> None:
    """From now on this process shares one mlrc engine per database URL between all its studies
    (:func:`mlrc.store.connect`), and its Optuna storages on PostgreSQL close a connection when
    it is given back (SQLAlchemy's ``NullPool``): the connections it holds do not grow with the
    number of studies it has open."""
    _MANY_STUDIES[0] = True


def shared_engine(url: str, make: Callable[[], Engine]) -> Engine:
    """``make()``, or in a process of :func:`many_studies` the engine it made for ``url`` the
    first time."""
    if not _MANY_STUDIES[0]:
        return make()
    if url not in _SHARED:
        _SHARED[url] = make()
    return _SHARED[url]


def pool_options(url: str) -> dict[str, Any]:
    """``create_engine`` keywords of an Optuna storage's pool for ``url`` (``NullPool`` in a
    process of :func:`many_studies`, on PostgreSQL)."""
    if _MANY_STUDIES[0] and not url.startswith("sqlite"):
        from sqlalchemy.pool import NullPool

        return {"poolclass": NullPool}
    return {}


def make_engine(url: str, read_only: bool = False) -> Engine:
    """An engine for ``url`` as it is: no table is created or checked (see :func:`mlrc.store.migrate.connect`).

    A URL that cannot be used is a :class:`StoreError`; so is, when ``read_only``, a SQLite file
    that does not exist (it is not created: a typo in the URL would show an empty store)."""
    from sqlalchemy.exc import ArgumentError

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
    return retry_connects(engine)


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
def removed_lock_file(
    path: str, blocking: bool = True, on_acquired: Callable[[int], None] | None = None
) -> Iterator[HeldFile]:
    """An exclusive ``flock`` on the file ``path`` (created if missing; the kernel releases it
    when the process dies), the file removed on release. filelock leaves it (unlinking a lock
    file is unsafe in general), so it is removed here while still held, and only while ``path``
    still names the file this process locked; a process that opened the same file before that
    and wins its ``flock`` afterwards finds it unlinked and takes the new one (filelock checks
    ``st_nlink``), so two processes never hold ``path`` at once. ``blocking=False``: one try,
    :class:`filelock.Timeout` if another process holds it (a try that lost to a release that
    removed the file is retried). ``on_acquired(fd)``: called once the lock is held. An
    :class:`OSError` when the file cannot be created. The block gets a :class:`HeldFile`."""
    from filelock import FileLock, Timeout

    held: list[os.stat_result] = []

    def acquired(fd: int) -> None:
        held.append(os.fstat(fd))
        if on_acquired is not None:
            on_acquired(fd)

    lock = FileLock(
        path,
        blocking=blocking,
        thread_local=False,
        preserve_lock_file=True,  # filelock's own release never unlinks; this function does
        fallback_to_soft=False,  # a kernel lock, released when the process dies, or none
        on_acquired=acquired,
    )
    for attempt in range(5):
        try:
            lock.acquire()
            break
        except Timeout:
            if blocking or attempt == 4 or os.path.lexists(path):
                raise  # held by another process
    try:
        yield HeldFile(path, held[-1])
    finally:
        try:
            if held and os.path.samestat(os.lstat(path), held[-1]):
                os.unlink(path)  # still held: no other process holds this file
        except OSError:
            pass  # gone already, or a read-only folder: the lock is released all the same
        lock.release()


@contextmanager
def sqlite_file_lock(engine: Engine, name: str) -> Iterator[None]:
    """On a SQLite file, an exclusive ``flock`` on ``<database>.<name>.lock`` (released when the
    process dies, the file removed when it ends: :func:`removed_lock_file`); a no-op for
    PostgreSQL and in-memory databases."""
    database = sqlite_path(engine)
    # filelock would create a missing folder: SQLite is to name it ("unable to open database file")
    if database is None or not os.path.isdir(os.path.dirname(os.path.abspath(database))):
        yield
        return
    with ExitStack() as held:
        # a read-only folder: nothing can be created there, so nothing races
        with suppress(OSError):
            held.enter_context(removed_lock_file(f"{database}.{name}.lock"))
        yield


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
        raise StoreError(f"{shown(engine)}: {describe(e)}") from None


# --- rows ----------------------------------------------------------------------


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
    """The study named ``name``, None when the store has none."""
    return s.execute(select(Study).filter_by(name=name)).scalar_one_or_none()
