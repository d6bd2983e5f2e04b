"""What every database call stands on: the store's error, URLs shown without their password,
database errors as one line, and waiting out a lost connection. A URL may be made absolute for other
processes instead, a database error is told from the work's own, and the wait uses tenacity's
exponential backoff."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
)

from mlrc.errors import first_line, sleep_or_stop

log = logging.getLogger("mlrc")
T = TypeVar("T")


class StoreError(RuntimeError):
    """The database cannot be used (wrong schema version, unreachable, not a database)."""


URL_FORMS = "expected sqlite:///FILE or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"


def default_url() -> str:
    """The store used when neither ``--storage`` nor ``MLRC_STORAGE`` names one."""
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


def shown(engine: Engine) -> str:
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


def describe(e: BaseException) -> str:
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
    return _driver_error(e)


def _driver_error(e: BaseException) -> BaseException:
    """``e``, or the database error behind it: Optuna's storage turns every SQLAlchemy error, a
    lost connection included, into its own ``StorageInternalError`` (raised from it, or from
    the ``PendingRollbackError`` of a query it tried next on the broken session)."""
    from sqlalchemy.exc import DBAPIError

    cause: BaseException | None = e
    for _ in range(4):
        if cause is None or isinstance(cause, DBAPIError | StoreError):
            break
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return cause if isinstance(cause, DBAPIError) else e


def _warn(message: str, subject: str) -> Callable[[RetryCallState], None]:
    """A ``before_sleep`` that logs ``message % (subject, the error's first line, seconds)``."""

    def note(rs: RetryCallState) -> None:
        log.warning(message, subject, db_error_line(_failure(rs)), rs.upcoming_sleep)

    return note


# A server that answers so is restarting: a worker that starts meanwhile waits for it
_RESTARTING = (
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
)


class _Window:
    """How long a connection is retried: ``s`` seconds from now (lengthened once the server
    says it is restarting)."""

    def __init__(self, s: float) -> None:
        self.s, self.start = s, time.monotonic()

    def left(self) -> float:
        return self.start + self.s - time.monotonic()

    def over(self, rs: RetryCallState) -> bool:  # tenacity's stop_before_delay, with ``s`` now
        return self.left() - (rs.upcoming_sleep or 0.0) <= 0


def retry_connects(engine: Engine, first_s: float = 5.0, connected: bool = False) -> Engine:
    """Make every new connection of ``engine`` retry with exponential backoff (0.5 s → 30 s):
    for ``first_s`` seconds before the first success (a typo fails fast) unless the server says
    it is restarting, then for :func:`reconnect_window_s` (a restarted server is waited for). With ``pool_pre_ping`` this
    turns a database restart into a pause. Messages never contain the password.

    A refused login (wrong password or user, no such database) is not retried, and a failed
    first connection raises :class:`StoreError`, which :func:`retry` does not retry either. Each
    attempt gives up after ``connect_timeout`` (default: the window left, 2 to 10 s), so a server
    that accepts connections but never answers cannot hang the caller."""
    if engine.dialect.name == "sqlite":
        return engine
    state = {"connected": connected}
    where = shown(engine)
    timeout_preset = "connect_timeout" in engine.url.query

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> Any:
        window = _Window(reconnect_window_s() if state["connected"] else first_s)
        unreachable = dialect.loaded_dbapi.OperationalError

        def retried(e: BaseException) -> bool:
            if not isinstance(e, unreachable) or _refused(e):
                return False
            if any(marker in db_error_line(e) for marker in _RESTARTING):
                window.s = max(window.s, reconnect_window_s())  # not a typo: a restart
            return True

        def bound_attempt(_: RetryCallState) -> None:  # each attempt: the window left, 2 to 10 s
            if dialect.name == "postgresql" and not timeout_preset:
                cparams["connect_timeout"] = max(2, min(10, math.ceil(window.left())))

        def attempt() -> Any:
            conn = dialect.loaded_dbapi.connect(*cargs, **cparams)
            state["connected"] = True
            return conn

        try:
            return Retrying(
                retry=retry_if_exception(retried),
                wait=_BACKOFF,
                stop=window.over,
                before=bound_attempt,
                before_sleep=_warn("database %s unreachable (%s); retrying in %.1f s", where),
                sleep=sleep_or_stop,  # a stop signal ends the wait within 0.1 s
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
        e = _driver_error(e)
        return isinstance(e, DBAPIError) and (e.connection_invalidated or _is_disconnect(e, engine))

    def give_up(rs: RetryCallState) -> T:
        raise StoreError(
            f"{shown(engine)}: lost the connection while {what} "
            f"and it did not come back ({db_error_line(_failure(rs))})"
        ) from None

    return Retrying(
        retry=retry_if_exception(lost),
        wait=_BACKOFF,
        stop=stop_before_delay(reconnect_window_s()),
        before_sleep=_warn("%s: connection lost (%s); retrying in %.1f s", what),
        sleep=sleep_or_stop,  # a stop signal ends the wait within 0.1 s
        retry_error_callback=give_up,
    )(fn)


def absolute_url(url: str) -> str:
    """A relative SQLite path made absolute (for processes that run in other directories, such
    as Ray's trials); other URLs unchanged."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        return u.set(database=str(Path(u.database).resolve())).render_as_string(hide_password=False)
    return url


def is_database_error(e: BaseException) -> bool:
    """Whether ``e`` is the database failing (a :class:`StoreError` or a driver error), not the
    work being done."""
    return isinstance(e, StoreError | DBAPIError)


def _is_disconnect(e: Exception, engine: Engine) -> bool:
    from sqlalchemy.exc import InterfaceError, OperationalError

    if engine.dialect.name == "sqlite":
        return False
    return isinstance(e, OperationalError | InterfaceError)
