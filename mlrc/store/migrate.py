"""Schema migrations: bring a store to this mlrc's tables with Alembic (``mlrc/store/migrations``).

Three kinds of database meet :func:`prepare` (run by every :func:`mlrc.store.connect`, under the
schema lock, so workers opening one store at once do not race):

- a new one: ``create_all`` and a stamp at :data:`HEAD` (Alembic's cookbook; the revisions are
  checked to build the same tables by ``tests/store/test_migrations.py``);
- a legacy one (written before the migrations: ``mlrc_meta.schema_version`` 2 or 3, no version
  table): stamped at the revision of its schema version, then upgraded like the others;
- a migrated one: upgraded from its revision to :data:`HEAD` when it is behind.

Opening upgrades automatically when every pending revision is ``additive`` (what an older mlrc
still opens up to its version check); others wait for ``mlrc store upgrade``. A store of a newer
mlrc (schema version or revision unknown here) is refused with a one-line :class:`StoreError`.
``mlrc_meta.schema_version`` is kept current: older releases refuse newer stores by that number.
Alembic's version table is ``mlrc_alembic_version``; Optuna's ``alembic_version`` is left alone.
:func:`connect`, the store's door, lives here (not in :mod:`mlrc.store.engine`, which the
migrations build on) so that no two store modules import each other.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, select
from sqlalchemy.engine import Engine

from mlrc.store.engine import advisory_lock, make_engine, shared_engine, sqlite_file_lock
from mlrc.store.optuna_tables import optuna_storage
from mlrc.store.reconnect import StoreError, describe, redact
from mlrc.store.schema import SCHEMA_VERSION, Base, Meta

VERSION_TABLE = "mlrc_alembic_version"  # Optuna's own is alembic_version, in the same database
REVISIONS = {
    2: "schema_2",
    3: "schema_3",
    4: "schema_4",
    5: "schema_5",
    6: "schema_6",
    7: "schema_7",
    8: "schema_8",
}  # mlrc_meta.schema_version -> Alembic revision
HEAD = REVISIONS[SCHEMA_VERSION]
MIGRATIONS = Path(__file__).with_name("migrations")  # env.py and versions/, package data
log = logging.getLogger("mlrc")


def prepare(engine: Engine, url: str, all_revisions: bool = False) -> tuple[str | None, str]:
    """Bring the store behind ``engine`` (opened from ``url``) to :data:`HEAD`, with Optuna's
    tables; returns (old revision, new revision), old None for a new store. Revisions that are not
    ``additive`` run only when ``all_revisions`` (``mlrc store upgrade``)."""
    from sqlalchemy.exc import DBAPIError

    try:
        with advisory_lock(engine, "mlrc-schema"), sqlite_file_lock(engine, "schema"):
            with _quiet_alembic(), engine.begin() as conn:
                revisions = _migrate(conn, url, all_revisions)
            # Optuna's tables, created once under the lock: two processes creating them at once
            # race on Optuna's alembic_version row (an IntegrityError for the second).
            optuna_storage(url).engine.dispose()
    except DBAPIError as e:
        raise StoreError(f"{redact(url)}: {describe(e)}{_behind(engine, e)}") from None
    return revisions


def _behind(engine: Engine, e: BaseException) -> str:
    """What a write refused by a read-only store means when the store is behind :data:`HEAD`."""
    if "readonly" not in str(e).replace("read-only", "readonly").lower():
        return ""
    try:
        with engine.connect() as conn:
            version, revision = _state(conn)
    except Exception:  # noqa: BLE001 — only a better message at stake
        return ""
    old = revision or (REVISIONS.get(int(version)) if version and version.isdigit() else None)
    if old is None or old == HEAD:
        return ""
    return (
        f" (the store is at schema revision {old} and this mlrc needs {HEAD}: upgrade it once "
        "where it is writable, `mlrc store upgrade`)"
    )


def upgrade(url: str) -> tuple[str | None, str]:
    """Upgrade the store at ``url`` to this mlrc's schema, every pending revision included (what
    ``mlrc store upgrade`` runs); returns (old revision, new revision), old None for an empty
    database. Running it again changes nothing and returns (:data:`HEAD`, :data:`HEAD`). A SQLite
    file that does not exist is a :class:`StoreError` (a typo would create an empty store)."""
    engine = make_engine(url, read_only=True)
    try:
        return prepare(engine, url, all_revisions=True)
    finally:
        engine.dispose()


def current(url: str) -> str | None:
    """The revision of the store at ``url`` without changing it: its ``mlrc_alembic_version``, or
    for a legacy store the revision of its schema version; None for an empty database. A SQLite
    file that does not exist is a :class:`StoreError`, as is a legacy store of a newer mlrc."""
    from sqlalchemy.exc import DBAPIError

    engine = make_engine(url, read_only=True)
    try:
        with _quiet_alembic(), engine.connect() as conn:
            version, revision = _state(conn)
    except DBAPIError as e:
        raise StoreError(f"{redact(url)}: {describe(e)}") from None
    finally:
        engine.dispose()
    if revision is not None:
        return revision
    return None if version is None else REVISIONS[_readable_version(version, url)]


def known(revision: str) -> bool:
    """Does this mlrc have ``revision`` (is it not from a newer mlrc)?"""
    return revision in {script.revision for script in _scripts().walk_revisions()}


# --- steps -------------------------------------------------------------------------------------


def _migrate(conn: Connection, url: str, all_revisions: bool) -> tuple[str | None, str]:
    """:func:`prepare`'s work on one connection (one transaction)."""
    version, revision = _state(conn)
    if version is not None:
        _readable_version(version, url)  # refuses a newer or unknown schema version
    if revision is not None and not known(revision):
        raise StoreError(
            f"{redact(url)}: migrated by a newer mlrc (revision {revision}; this mlrc knows "
            f"revisions up to {HEAD})"
        )
    if version is None and revision is None:  # a new store
        Base.metadata.create_all(conn)
        _alembic(conn, "stamp")
        _write_version(conn)
        return None, HEAD
    old = _starting_revision(conn, version, revision)
    if old != HEAD:
        _check_additive(old, url, all_revisions)
        _alembic(conn, "upgrade")
        log.info("store upgraded from schema %d to %d", _schema_of(old), SCHEMA_VERSION)
    Base.metadata.create_all(conn)  # tables an older build of the same version made on first use
    _write_version(conn)
    return old, HEAD


def _state(conn: Connection) -> tuple[str | None, str | None]:
    """(``mlrc_meta.schema_version``, ``mlrc_alembic_version`` revision), None where absent."""
    version = None
    if inspect(conn).has_table(Meta.__tablename__):
        query = select(Meta.value).where(Meta.key == "schema_version")
        version = conn.execute(query).scalar_one_or_none()
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return version, context.get_current_revision()


def _readable_version(version: str, url: str) -> int:
    """``version`` as a number this mlrc upgrades from or reads; else the one-line refusal."""
    if version == str(SCHEMA_VERSION) or (version.isdigit() and 2 <= int(version) < SCHEMA_VERSION):
        return int(version)
    raise StoreError(
        f"{redact(url)}: written by mlrc schema version {version}, this mlrc reads version "
        f"{SCHEMA_VERSION}"
    )


def _starting_revision(conn: Connection, version: str | None, revision: str | None) -> str:
    """The revision to upgrade from: the version table's; for a legacy store (none, or one older
    than ``mlrc_meta`` says: an older mlrc wrote that), the revision of its schema version."""
    if revision is not None and (version is None or _schema_of(revision) <= int(version)):
        return revision
    legacy = REVISIONS[int(version or SCHEMA_VERSION)]  # version is set: not a new store
    _stamp_legacy(conn, legacy)
    return legacy


def _stamp_legacy(conn: Connection, revision: str) -> None:
    """Stamp a legacy store at ``revision``. At :data:`HEAD` nothing else is written, so a store
    on read-only media still opens: a failed stamp is rolled back and tried on the next open."""
    from sqlalchemy.exc import OperationalError

    if revision != HEAD:
        _alembic(conn, "stamp", revision)
        return
    try:
        with conn.begin_nested():
            _alembic(conn, "stamp", revision)
    except OperationalError as e:
        log.debug("legacy store not stamped (%s)", describe(e))


def _check_additive(old: str, url: str, all_revisions: bool) -> None:
    """Refuse to upgrade on open when a revision after ``old`` is not ``additive``."""
    if all_revisions:
        return
    for script in _scripts().iterate_revisions(HEAD, old):
        if script.revision != old and not getattr(script.module, "additive", False):
            raise StoreError(
                f"{redact(url)}: schema revision {script.revision} changes existing tables; "
                "back up the database and run `mlrc store upgrade`"
            )


def _write_version(conn: Connection) -> None:
    """``mlrc_meta.schema_version`` = :data:`SCHEMA_VERSION` (written only when it differs)."""
    row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar_one_or_none()
    if row is None:
        conn.execute(
            Meta.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION))
        )
    elif row != str(SCHEMA_VERSION):
        table = Meta.__table__
        update = table.update().where(table.c.key == "schema_version")
        conn.execute(update.values(value=str(SCHEMA_VERSION)))


def _schema_of(revision: str) -> int:
    """The schema version whose revision is ``revision``."""
    return {rev: version for version, rev in REVISIONS.items()}.get(revision, SCHEMA_VERSION)


# --- Alembic -----------------------------------------------------------------------------------


def _config(conn: Connection | None = None) -> Config:
    """Alembic's configuration, built here (no alembic.ini): the scripts shipped in the package,
    the connection to run on."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def _alembic(conn: Connection, action: str, revision: str = HEAD) -> None:
    """Alembic's ``upgrade`` or ``stamp`` to ``revision`` on ``conn``, in its transaction."""
    getattr(command, action)(_config(conn), revision)


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """No "Context impl SQLiteImpl." / "Running upgrade" lines in a worker's INFO log."""
    logger = logging.getLogger("alembic")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def connect(url: str, read_only: bool = False) -> Engine:
    """Engine for ``url``; creates mlrc's tables and Optuna's, or upgrades them to this mlrc's
    schema (:func:`prepare`), and refuses a store of a newer mlrc.

    PostgreSQL engines ping pooled connections and retry lost ones (:func:`retry_connects`);
    table creation is serialised by an advisory lock, so many workers may start at once.
    ``read_only`` (commands that only read): a SQLite file that does not exist is a
    :class:`StoreError` and is not created (a typo in the URL would show an empty store)."""

    def make() -> Engine:
        engine = make_engine(url, read_only)
        prepare(engine, url)
        return engine

    return shared_engine(url, make)
