"""Schema migrations (issue #14): stores written by earlier releases open with this mlrc.

The fixtures are stores written by released code and kept as files:

- ``fixtures/store-schema3.db``: ``mlrc demo --trials 1 --reproductions 2 --max-epochs 1`` run by
  the last code before the Alembic migrations (commit da019b6: schema version 3, no
  ``mlrc_alembic_version``), then ``VACUUM INTO`` (200 KB) and back to WAL mode, as mlrc keeps it;
- ``fixtures/store-schema2.db``: the tables created by the last schema-2 release (commit 7993f0a,
  ``store.connect``; Optuna's too), filled with the schema-3 fixture's rows (without the schema-3
  columns and tables, so ``mlrc_baseline`` is absent).

What they hold is read with ``sqlite3`` from the fixture file itself (the reference, independent
of mlrc's ORM) and compared with what mlrc reads after the upgrade.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.store import migrate
from mlrc.store.engine import session
from mlrc.store.schema import (
    SCHEMA_VERSION,
    Baseline,
    CampaignStudy,
    EpochMetric,
    FoldRun,
    Study,
    StudyBaseline,
    TestResult,
    Trial,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
LEGACY = {2: FIXTURES / "store-schema2.db", 3: FIXTURES / "store-schema3.db"}
MODELS = (
    Study,
    Trial,
    FoldRun,
    EpochMetric,
    TestResult,
    Baseline,
    StudyBaseline,
    CampaignStudy,
)
runner = CliRunner()


def legacy_copy(tmp_path: Path, version: int) -> tuple[Path, str]:
    """A copy of the schema-``version`` fixture in ``tmp_path``, and its URL."""
    path = tmp_path / f"legacy{version}.db"
    shutil.copyfile(LEGACY[version], path)
    return path, f"sqlite:///{path}"


def opened(path: Path) -> sqlite3.Connection:
    """``sqlite3`` on ``path``; a fixture is opened immutable (nothing beside it is written)."""
    if path.parent == FIXTURES:
        return sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    return sqlite3.connect(path)


def raw(path: Path, sql: str) -> list[tuple]:
    with opened(path) as c:
        return c.execute(sql).fetchall()


def tables(path: Path) -> set[str]:
    return {name for (name,) in raw(path, "SELECT name FROM sqlite_master WHERE type='table'")}


def reference(path: Path) -> dict[str, list[dict]]:
    """Every mlrc row of the file at ``path``, as ``sqlite3`` reads it (JSON parsed)."""
    out = {}
    with opened(path) as c:
        c.row_factory = sqlite3.Row
        for model in MODELS:
            name = model.__tablename__
            if name in tables(path):
                rows = c.execute(f"SELECT * FROM {name} ORDER BY id").fetchall()
                out[name] = [_parse(model, dict(row)) for row in rows]
    return out


def _parse(model: type, row: dict) -> dict:
    json_columns = {c.name for c in model.__table__.columns if c.type.__class__.__name__ == "JSON"}
    return {k: json.loads(v) if k in json_columns and v is not None else v for k, v in row.items()}


def through_mlrc(url: str, model: type, columns: list[str]) -> list[dict]:
    """``model``'s rows read by mlrc's ORM (``columns`` only), as ``sqlite3`` would show them."""
    engine = store.connect(url)
    with session(engine) as s:
        rows = s.execute(select(model).order_by(model.id)).scalars().all()
        out = [{c: _as_stored(getattr(row, c)) for c in columns} for row in rows]
    engine.dispose()
    return out


def _as_stored(value: object) -> object:
    if isinstance(value, dt.datetime):  # SQLAlchemy's SQLite DateTime format
        return value.isoformat(sep=" ", timespec="microseconds")
    return value


def schema(path: Path) -> dict:
    """mlrc's tables at ``path``: columns, unique constraints, indexes, foreign keys."""
    engine = create_engine(f"sqlite:///{path}")
    i = inspect(engine)
    out = {}
    for t in i.get_table_names():
        if t.startswith("mlrc_") and t != migrate.VERSION_TABLE:
            out[t] = (
                sorted(
                    (c["name"], str(c["type"]), c["nullable"], c["primary_key"])
                    for c in i.get_columns(t)
                ),
                sorted(tuple(u["column_names"]) for u in i.get_unique_constraints(t)),
                sorted(
                    (x["name"], tuple(x["column_names"]), x["unique"]) for x in i.get_indexes(t)
                ),
                sorted(
                    (tuple(f["constrained_columns"]), f["referred_table"])
                    for f in i.get_foreign_keys(t)
                ),
            )
    engine.dispose()
    return out


def cli(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def error_line(*args: str) -> str:
    """``mlrc ARGS``: exit code 2, nothing on stdout, one line on stderr (returned)."""
    r = runner.invoke(app, list(args))
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and r.stdout == "", r.output
    return lines[0]


# --- stores of earlier releases -----------------------------------------------------------------


@pytest.mark.parametrize("version", sorted(LEGACY))
def test_a_release_store_is_upgraded_on_open_and_reads_as_written(tmp_path, version):
    path, url = legacy_copy(tmp_path, version)
    want = reference(LEGACY[version])
    optuna_version = raw(LEGACY[version], "SELECT * FROM alembic_version")
    assert want["mlrc_study"] and want["mlrc_test_result"] and want["mlrc_epoch_metric"]
    assert migrate.VERSION_TABLE not in tables(path)
    assert raw(path, "SELECT value FROM mlrc_meta") == [(str(version),)]

    store.connect(url).dispose()

    assert raw(path, f"SELECT * FROM {migrate.VERSION_TABLE}") == [(migrate.HEAD,)]
    assert raw(path, "SELECT * FROM alembic_version") == optuna_version  # Optuna's: untouched
    assert raw(path, "SELECT value FROM mlrc_meta") == [(str(SCHEMA_VERSION),)]
    for model in MODELS:
        rows = want.get(model.__tablename__, [])
        columns = list(rows[0]) if rows else ["id"]
        assert through_mlrc(url, model, columns) == rows, model.__tablename__
    engine = store.connect(url)  # columns added by the upgrade: there, empty
    with session(engine) as s:
        runs = s.execute(select(FoldRun)).scalars().all()
        assert runs and all(hasattr(r, "objective") and hasattr(r, "code_version") for r in runs)
    engine.dispose()


def test_an_upgraded_store_has_the_tables_of_a_new_one(tmp_path):
    path, url = legacy_copy(tmp_path, 2)
    store.connect(url).dispose()
    store.connect(f"sqlite:///{tmp_path / 'new.db'}").dispose()
    assert schema(path) == schema(tmp_path / "new.db")


def test_the_migrations_build_the_tables_create_all_builds(tmp_path):
    """A new store is ``create_all`` + a stamp at head; the revisions must build the same."""
    engine = create_engine(f"sqlite:///{tmp_path / 'migrated.db'}")
    with engine.begin() as conn:
        migrate._alembic(conn, "upgrade")
    engine.dispose()
    store.connect(f"sqlite:///{tmp_path / 'new.db'}").dispose()
    assert schema(tmp_path / "migrated.db") == schema(tmp_path / "new.db")
    assert raw(tmp_path / "migrated.db", f"SELECT * FROM {migrate.VERSION_TABLE}") == [
        (migrate.HEAD,)
    ]


def test_head_is_the_newest_revision_and_the_schema_version():
    assert migrate._scripts().get_current_head() == migrate.HEAD
    assert migrate.REVISIONS[SCHEMA_VERSION] == migrate.HEAD
    assert all(migrate.known(revision) for revision in migrate.REVISIONS.values())


def test_a_new_store_is_at_head(tmp_path):
    path = tmp_path / "new.db"
    url = f"sqlite:///{path}"
    store.connect(url).dispose()
    assert raw(path, f"SELECT * FROM {migrate.VERSION_TABLE}") == [(migrate.HEAD,)]
    assert raw(path, "SELECT value FROM mlrc_meta") == [(str(SCHEMA_VERSION),)]
    assert len(raw(path, "SELECT * FROM alembic_version")) == 1  # Optuna's own, beside it
    assert store.current(url) == migrate.HEAD
    assert store.upgrade(url) == (migrate.HEAD, migrate.HEAD)


def test_a_store_at_head_opens_read_only(tmp_path):
    """A store at this mlrc's revision on read-only media opens and reads (nothing to write)."""
    path, url = legacy_copy(tmp_path, 3)
    store.connect(url).dispose()  # upgraded to head once, writable
    want = reference(LEGACY[3])["mlrc_trial"]
    ro = f"sqlite:///file:{path}?mode=ro&uri=true"
    assert through_mlrc(ro, Trial, list(want[0])) == want


def test_a_legacy_store_behind_head_on_read_only_media_says_to_upgrade_it(tmp_path):
    path, _ = legacy_copy(tmp_path, 3)
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with pytest.raises(store.StoreError) as e:
        store.connect(url)
    assert str(e.value) == (
        f"{url}: attempt to write a readonly database (the store is at schema revision "
        f"schema_3 and this mlrc needs {migrate.HEAD}: upgrade it once where it is writable, "
        "`mlrc store upgrade`)"
    )
    assert migrate.VERSION_TABLE not in tables(path)


def test_two_processes_opening_a_legacy_store_at_once_both_succeed(tmp_path):
    path, url = legacy_copy(tmp_path, 2)
    code = f"from mlrc import store; store.connect({url!r}).dispose()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert raw(path, f"SELECT * FROM {migrate.VERSION_TABLE}") == [(migrate.HEAD,)]
    assert {"objective", "code_version"} <= {
        r[1] for r in raw(path, "PRAGMA table_info(mlrc_fold_run)")
    }


def test_a_revision_that_is_not_additive_waits_for_the_upgrade_command(tmp_path, monkeypatch):
    path, url = legacy_copy(tmp_path, 2)
    monkeypatch.setattr(migrate._scripts().get_revision("schema_3").module, "additive", False)
    with pytest.raises(store.StoreError) as e:
        store.connect(url)
    assert str(e.value) == (
        f"{url}: schema revision schema_3 changes existing tables; back up the database and run "
        "`mlrc store upgrade`"
    )
    assert store.upgrade(url) == ("schema_2", migrate.HEAD)
    store.connect(url).dispose()


# --- mlrc store upgrade | current ---------------------------------------------------------------


def test_store_upgrade_prints_old_to_new_and_is_idempotent(tmp_path):
    path, url = legacy_copy(tmp_path, 2)
    assert cli("store", "current", "--storage", url) == (
        f"schema_2 (behind {migrate.HEAD}: run mlrc store upgrade)\n"
    )
    assert migrate.VERSION_TABLE not in tables(path)  # current changes nothing
    assert cli("store", "upgrade", "--storage", url) == f"schema_2 → {migrate.HEAD}\n"
    assert cli("store", "upgrade", "--storage", url) == (
        f"{migrate.HEAD} → {migrate.HEAD} (up to date)\n"
    )
    assert cli("store", "current", "--storage", url) == f"{migrate.HEAD} (head)\n"


def test_store_commands_on_a_missing_file_are_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    for command in ("upgrade", "current"):
        assert error_line("store", command, "--storage", url) == (
            f"error: {url}: no such database file ({tmp_path / 'typo.db'}); check --storage or "
            "MLRC_STORAGE"
        )
    assert not (tmp_path / "typo.db").exists()


def test_a_store_of_a_newer_revision_is_refused_in_one_line(tmp_path):
    path = tmp_path / "newer.db"
    url = f"sqlite:///{path}"
    store.connect(url).dispose()
    with sqlite3.connect(path) as c:
        c.execute(f"UPDATE {migrate.VERSION_TABLE} SET version_num = 'schema_99'")
    expected = (
        f"error: {url}: migrated by a newer mlrc (revision schema_99; this mlrc knows revisions "
        f"up to {migrate.HEAD})"
    )
    assert error_line("store", "upgrade", "--storage", url) == expected
    assert error_line("report", "--storage", url) == expected
    assert cli("store", "current", "--storage", url) == (
        f"schema_99 (newer than this mlrc, which knows revisions up to {migrate.HEAD})\n"
    )
    assert raw(path, f"SELECT * FROM {migrate.VERSION_TABLE}") == [("schema_99",)]


def test_a_store_of_a_newer_schema_version_is_refused_in_one_line(tmp_path):
    path, url = legacy_copy(tmp_path, 3)
    newer = SCHEMA_VERSION + 1
    with sqlite3.connect(path) as c:
        c.execute(f"UPDATE mlrc_meta SET value = '{newer}' WHERE key = 'schema_version'")
    expected = (
        f"error: {url}: written by mlrc schema version {newer}, this mlrc reads version "
        f"{SCHEMA_VERSION}"
    )
    for command in ("upgrade", "current"):
        assert error_line("store", command, "--storage", url) == expected
    assert migrate.VERSION_TABLE not in tables(path)


# --- PostgreSQL ---------------------------------------------------------------------------------


def test_workers_opening_a_legacy_postgresql_store_at_once_upgrade_it_once(fresh_database):
    """The schema-2 layout on PostgreSQL (no version table), opened by three processes at once:
    the advisory lock lets one upgrade it, the others find it at head."""
    from sqlalchemy import text

    url = fresh_database
    store.connect(url).dispose()
    engine = create_engine(url)
    with engine.begin() as c:  # back to what the last schema-2 release left
        c.execute(text(f"DROP TABLE {migrate.VERSION_TABLE}"))
        c.execute(text("DROP TABLE mlrc_study_baseline"))
        c.execute(text("DROP TABLE mlrc_baseline"))
        c.execute(text("ALTER TABLE mlrc_fold_run DROP COLUMN objective, DROP COLUMN code_version"))
        c.execute(text("UPDATE mlrc_meta SET value = '2'"))
        optuna_version = c.execute(text("SELECT * FROM alembic_version")).all()
    code = f"from mlrc import store; store.connect({url!r}).dispose()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    with engine.begin() as c:
        assert c.execute(text(f"SELECT * FROM {migrate.VERSION_TABLE}")).all() == [(migrate.HEAD,)]
        assert c.execute(text("SELECT value FROM mlrc_meta")).all() == [(str(SCHEMA_VERSION),)]
        assert c.execute(text("SELECT * FROM alembic_version")).all() == optuna_version
        columns = {col["name"] for col in inspect(c).get_columns("mlrc_fold_run")}
        assert {"objective", "code_version", "threads"} <= columns
        assert inspect(c).has_table("mlrc_baseline") and inspect(c).has_table("mlrc_study_history")
    engine.dispose()
    assert store.current(url) == migrate.HEAD
