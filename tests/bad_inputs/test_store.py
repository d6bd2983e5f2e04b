"""Bad stores, as a user meets them: through the real ``mlrc`` command (in-process CliRunner; one
real subprocess) or :func:`mlrc.store.connect`. Each case checks the exact outcome: exit code 2
and one line on stderr naming the database (never its password), within a bounded time; or
success where waiting is right (a lock released in time, readers beside a writer).

SQLite: a write lock held by another process, a read-only file, files that are not databases,
paths that cannot be opened, a newer schema version. PostgreSQL (the throwaway server, with a
role that must give its password over TCP): a wrong password, a closed port, a server that
accepts connections and never answers. URLs: malformed, unknown dialect, bad port, an
unescaped '@' in the password, bad ``MLRC_DB_RETRY_S``."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import require
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.store.engine import session, transact
from mlrc.store.reconnect import URL_FORMS
from mlrc.store.schema import SCHEMA_VERSION, Meta, Study

PASSWORD = "Pw-s3cret-9x"  # the role's real password: must never be shown
WRONG = "Wr0ng-pw-7q"  # a mistyped one: must never be shown either
ROLE = "badinput_pw"
LOCKED = (
    "database is locked (another process holds a write transaction; waited {s} s, "
    "MLRC_DB_RETRY_S caps the wait)"
)
runner = CliRunner()

# Another process: holds a write transaction on the SQLite file argv[1] until its stdin closes,
# or for argv[2] seconds when that is > 0, then commits.
HOLDER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("CREATE TABLE IF NOT EXISTS holder (x)")
c.execute("BEGIN EXCLUSIVE")
c.execute("INSERT INTO holder VALUES (1)")
print("locked", flush=True)
time.sleep(float(sys.argv[2])) if float(sys.argv[2]) > 0 else sys.stdin.readline()
c.execute("COMMIT")
"""


def error_line(*args: str) -> str:
    """``mlrc ARGS`` in-process: exit code 2, nothing on stdout, one line on stderr (returned)."""
    r = runner.invoke(app, list(args))
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and r.stdout == "", r.output
    return lines[0]


def ok(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def new_store(path: Path, *studies: str) -> str:
    """An mlrc store (WAL mode) at ``path`` holding empty studies ``studies``; its URL."""
    url = f"sqlite:///{path}"
    engine = store.connect(url)
    with session(engine) as s:
        for name in studies:
            s.add(
                Study(
                    name=name,
                    dataset="glyphs",
                    loss="contrastive",
                    strategy=None,
                    preset="cpu",
                    config={},
                    code_version="test",
                )
            )
    engine.dispose()
    return url


def study_yaml(tmp_path: Path, name: str = "t") -> Path:
    """A valid study file (never trained here: the store refuses before that)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ndataset: {{name: glyphs}}\npreset: cpu\nloss: {{name: contrastive}}\n"
        "search: {trials: 1}\n"
    )
    return path


def run_args(tmp_path: Path, url: str) -> list[str]:
    """``mlrc study run`` of a fresh study file against ``url``."""
    study = study_yaml(tmp_path)
    return ["study", "run", str(study), "--storage", url, "--artifacts", str(tmp_path / "art")]


@contextmanager
def lock_held(path: Path, seconds: float = 0.0) -> Iterator[subprocess.Popen]:
    """A second process holding a write transaction on ``path``: for the block, or ``seconds``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(30)


# --- SQLite: locks -------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def warm_cli() -> None:
    """One command before the timed ones: the seconds of its first (lazy) imports are not
    counted as waiting."""
    error_line("report", "--storage", "mlrc.db")


def test_a_held_write_lock_is_waited_for_then_named(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRC_DB_RETRY_S", "1")  # caps SQLite's busy wait (30 s by default)
    path = tmp_path / "busy.db"
    with lock_held(path):
        t0 = time.monotonic()
        line = error_line("report", "--storage", f"sqlite:///{path}")
        elapsed = time.monotonic() - t0
    assert line == f"error: sqlite:///{path}: {LOCKED.format(s=1)}"
    assert 0.9 <= elapsed < 10  # 1 s of waiting, far from the default 30 s


def test_a_lock_released_within_the_wait_is_no_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MLRC_DB_RETRY_S", raising=False)  # the default: wait up to 30 s
    path = tmp_path / "soon.db"
    with lock_held(path, seconds=1.0):
        t0 = time.monotonic()
        engine = store.connect(f"sqlite:///{path}")
        elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 15
    with session(engine) as s:
        assert s.get(Meta, "schema_version").value == str(SCHEMA_VERSION)
    engine.dispose()


def test_readers_pass_a_writer_and_a_second_writer_gets_one_line(tmp_path, monkeypatch):
    url = new_store(tmp_path / "wal.db", "s")
    monkeypatch.delenv("MLRC_DB_RETRY_S", raising=False)
    with lock_held(tmp_path / "wal.db"):
        t0 = time.monotonic()
        assert "study s " in ok("study", "status", "s", "--storage", url)
        assert time.monotonic() - t0 < 10  # not the 30 s busy wait: WAL readers do not queue
        monkeypatch.setenv("MLRC_DB_RETRY_S", "1")
        assert error_line(*run_args(tmp_path, url)) == f"error: {url}: {LOCKED.format(s=1)}"


# --- SQLite: files that cannot be used ----------------------------------------------------------


def read_only(path: Path) -> str:
    """A URL opening ``path`` read-only. chmod 0444 does not stop root, so root uses SQLite's
    ``mode=ro`` URI instead (what a read-only mount or a foreign file gives a normal user)."""
    path.chmod(0o444)
    if os.geteuid() != 0:
        return f"sqlite:///{path}"
    return f"sqlite:///file:{path}?mode=ro&uri=true"


def test_a_read_only_store_can_be_read_and_refuses_writes_in_one_line(tmp_path):
    url = read_only(Path(new_store(tmp_path / "ro.db", "s").removeprefix("sqlite:///")))
    assert "study s " in ok("study", "status", "s", "--storage", url)
    engine = store.connect(url)

    def write(s):
        s.add(Meta(key="x", value="y"))

    with pytest.raises(store.StoreError) as e:
        transact(engine, write, "writing")
    assert str(e.value) == f"{url}: attempt to write a readonly database"
    engine.dispose()


def test_a_study_run_on_a_read_only_store_is_one_line(tmp_path):
    """Needs mlrc/search/study.py's SQLite lock file beside the database file, also for a
    ``sqlite:///file:PATH?mode=ro&uri=true`` URL (it was ``file:PATH.NAME.lock``, relative)."""
    url = read_only(Path(new_store(tmp_path / "ro.db").removeprefix("sqlite:///")))
    assert error_line(*run_args(tmp_path, url)) == (
        f"error: {url}: attempt to write a readonly database"
    )


@pytest.mark.parametrize(
    "content",
    [b"this is a text file, not a database\n" * 50, bytes(range(256)) * 16],
    ids=["text", "random-bytes"],
)
@pytest.mark.parametrize("command", ["report", "status", "run"])
def test_a_file_that_is_not_a_database_is_named_and_left_alone(tmp_path, content, command):
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    url = f"sqlite:///{path}"
    args = {
        "report": ["report", "--storage", url],
        "status": ["study", "status", "s", "--storage", url],
        "run": run_args(tmp_path, url),
    }[command]
    assert error_line(*args) == f"error: {url}: file is not a database"
    assert path.read_bytes() == content


@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_a_path_that_cannot_be_opened_is_named(tmp_path, where):
    """``study run`` writes (it would create a missing file); ``report`` only reads, and names a
    missing file as such (tests/bad_inputs/test_cli_boundary.py)."""
    path = tmp_path / "missing" / "mlrc.db" if where == "missing-folder" else tmp_path
    url = f"sqlite:///{path}"
    assert error_line(*run_args(tmp_path, url)) == f"error: {url}: unable to open database file"
    expected = (
        f"error: {url}: no such database file ({path}); check --storage or MLRC_STORAGE"
        if where == "missing-folder"
        else f"error: {url}: unable to open database file"
    )
    assert error_line("report", "--storage", url) == expected


def test_a_path_with_brackets_is_shown_as_written(tmp_path):
    """Needs mlrc/terminal.py's ``user_errors`` to escape Rich markup in the message (it printed
    ``.../[red]x/db`` as ``.../x/db``, a path that does not exist)."""
    url = f"sqlite:///{tmp_path / '[red]x' / 'db'}"
    assert error_line(*run_args(tmp_path, url)) == f"error: {url}: unable to open database file"


@pytest.mark.parametrize("version", [str(SCHEMA_VERSION + 1), "banana"])
def test_a_database_of_another_schema_version_is_refused_untouched(tmp_path, version):
    path = tmp_path / "newer.db"
    url = new_store(path, "s")
    engine = store.connect(url)
    with session(engine) as s:
        s.get(Meta, "schema_version").value = version
    engine.dispose()
    expected = (
        f"error: {url}: written by mlrc schema version {version}, "
        f"this mlrc reads version {SCHEMA_VERSION}"
    )
    for args in (
        ["report", "--storage", url],
        ["study", "status", "s", "--storage", url],
        run_args(tmp_path, url),
    ):
        assert error_line(*args) == expected
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT value FROM mlrc_meta").fetchall() == [(version,)]
        assert c.execute("SELECT name FROM mlrc_study").fetchall() == [("s",)]


# --- URLs and settings ---------------------------------------------------------------------------

FORMS = URL_FORMS


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "mlrc.db",
            "<unparsable database URL>: cannot use this database URL "
            f"(Could not parse SQLAlchemy URL from given URL string; {FORMS})",
        ),
        (
            f"foo://u:{PASSWORD}@h/db",
            "foo://u:***@h/db: cannot use this database URL "
            f"(Can't load plugin: sqlalchemy.dialects:foo; {FORMS})",
        ),
        (
            f"postgresql+psycopg://u:{PASSWORD}@h:abc/db",
            "<unparsable database URL>: cannot use this database URL "
            f"(invalid literal for int() with base 10: 'abc'; {FORMS})",
        ),
        (
            f"postgresql+psycopg://u:{PASSWORD[:4]}@{PASSWORD[4:]}@127.0.0.1:1/db",
            "postgresql+psycopg://<credentials hidden: percent-encode '@' in a password as %40>: "
            "cannot use this database URL",
        ),
    ],
    ids=["no-scheme", "unknown-dialect", "bad-port", "unescaped-at"],
)
def test_a_malformed_url_is_one_line_without_the_password(url, expected):
    t0 = time.monotonic()
    assert error_line("report", "--storage", url) == f"error: {expected}"
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("value", ["soon", "nan", "-1"])
def test_a_bad_retry_window_is_one_line(tmp_path, monkeypatch, value):
    store.connect(f"sqlite:///{tmp_path / 'db'}").dispose()  # report reads an existing store
    monkeypatch.setenv("MLRC_DB_RETRY_S", value)
    line = error_line("report", "--storage", f"sqlite:///{tmp_path / 'db'}")
    assert line == f"error: MLRC_DB_RETRY_S={value!r} is not a number of seconds ≥ 0"


# --- PostgreSQL ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def password_url(postgres_server) -> str:
    """A database whose owner must give PASSWORD over TCP (the server trusts its other roles)."""
    return postgres_server.password_role(ROLE, PASSWORD)


@pytest.fixture(scope="module", autouse=True)
def real_process(request) -> Iterator[tuple[subprocess.Popen, str] | None]:
    """``mlrc report`` with a wrong password in a real process, started with the module so that
    its imports (seconds) overlap the tests that wait; None without a PostgreSQL server."""
    try:
        url = with_password(request.getfixturevalue("password_url"), WRONG)
    except pytest.skip.Exception:
        yield None
        return
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlrc.cli", "report", "--storage", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield proc, url
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def with_password(url: str, password: str) -> str:
    return url.replace(f"//{ROLE}@", f"//{ROLE}:{password}@", 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_secret_in_logs(caplog) -> None:
    for rec in caplog.records:
        text = rec.getMessage()
        assert PASSWORD not in text and WRONG not in text, text


def test_a_wrong_password_fails_at_once_in_one_line_without_it(password_url, monkeypatch, caplog):
    monkeypatch.setenv("MLRC_DB_RETRY_S", "600")  # never the window of a first connection
    store.connect(with_password(password_url, PASSWORD)).dispose()  # the right one works
    caplog.set_level(logging.DEBUG)
    url = with_password(password_url, WRONG)
    shown = url.replace(WRONG, "***")
    t0 = time.monotonic()
    with pytest.raises(store.StoreError) as e:
        store.connect(url)
    assert time.monotonic() - t0 < 3  # a refused login is not retried
    message = str(e.value)
    assert message.startswith(f"{shown}: cannot connect (connection failed: ")
    assert message.endswith(f'password authentication failed for user "{ROLE}")')
    assert WRONG not in message and "\n" not in message
    assert error_line("study", "status", "s", "--storage", url) == f"error: {message}"
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    no_secret_in_logs(caplog)


def test_a_wrong_password_in_a_real_process_prints_no_traceback(real_process):
    if real_process is None:
        require(False, "no PostgreSQL server here (the throwaway server could not start)")
    proc, url = real_process
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr
    assert stdout == ""
    assert len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith(f"error: {url.replace(WRONG, '***')}: cannot connect (")
    assert "Traceback" not in stderr and WRONG not in stderr


def failed_connect(url: str) -> tuple[str, float]:
    """The StoreError message of ``store.connect(url)`` and the seconds it took."""
    t0 = time.monotonic()
    with pytest.raises(store.StoreError) as e:
        store.connect(url)
    return str(e.value), time.monotonic() - t0


def test_unreachable_servers_fail_within_the_first_connection_window(monkeypatch, caplog):
    """Before a first success, connections are retried for 5 s (a server still starting), not
    for MLRC_DB_RETRY_S (600 s: for a server lost after connecting), and each attempt has a
    timeout. A closed port, and a server that accepts connections but never answers (the
    kernel's listen backlog), side by side (the waits overlap)."""
    monkeypatch.setenv("MLRC_DB_RETRY_S", "600")
    caplog.set_level(logging.DEBUG)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        closed, hung = free_port(), silent.getsockname()[1]
        urls = [
            f"postgresql+psycopg://mlrc:{PASSWORD}@127.0.0.1:{p}/postgres" for p in (closed, hung)
        ]
        with ThreadPoolExecutor(2) as pool:
            (refused, refused_s), (timeout, timeout_s) = pool.map(failed_connect, urls)
    shown = [u.replace(PASSWORD, "***") for u in urls]
    assert refused == (
        f'{shown[0]}: cannot connect (connection failed: connection to server at "127.0.0.1", '
        f"port {closed} failed: Connection refused)"
    )
    assert 3 <= refused_s < 8  # tries at 0, 0.5, 1.5 and 3.5 s
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 3 and all(f"port {closed} " in r.getMessage() for r in retries)
    assert timeout == f"{shown[1]}: cannot connect (connection timeout expired)"
    assert 4 <= timeout_s < 9  # one attempt, given the 5 s of the window
    no_secret_in_logs(caplog)


def test_processes_creating_a_fresh_sqlite_store_at_once_all_succeed(tmp_path):
    """Optuna's RDBStorage creates its tables and inserts its alembic version in two steps: two
    processes doing it at once on a new file race (IntegrityError for the loser; 15 of 18
    processes failed here without the lock). ``connect`` serialises it with a file lock."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = f"from mlrc import store; store.connect({url!r}); store.optuna_storage({url!r})"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    errors = [p.stderr.read() for p in procs if p.wait() != 0]
    assert errors == []


@pytest.mark.parametrize("opening", ["mlrc's engine", "Optuna's storage"])
def test_a_first_connection_during_a_database_restart_waits_for_it(
    own_postgres_server, monkeypatch, caplog, opening
):
    """A worker that starts while the database restarts (a pool bench's replacement worker once
    exited 2 so, and a soak's worker at its Optuna storage): the server's "shutting down" is no
    typo, so the first connection waits the long window. A smart shutdown held by one open
    session keeps the server saying so."""
    import threading

    import psycopg

    monkeypatch.setenv("MLRC_DB_RETRY_S", "60")
    server = own_postgres_server
    url = server.new_database()
    holder = psycopg.connect(f"host=127.0.0.1 port={server.port} user=mlrc dbname=postgres")
    stopper = threading.Thread(target=server.stop, kwargs={"mode": "smart"})
    stopper.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "shutting down" not in _refusal(server.port):
        time.sleep(0.1)
    result: list = []
    t0 = time.monotonic()
    opened = store.connect if opening == "mlrc's engine" else store.optuna_storage
    connector = threading.Thread(target=lambda: result.append(_open(opened, url)))
    connector.start()
    time.sleep(2)
    holder.close()  # the server stops: "Connection refused" from here on
    stopper.join()
    time.sleep(max(0.0, 7 - (time.monotonic() - t0)))  # past the 5 s of a first connection
    server.start()
    connector.join(60)
    [opened] = result
    assert not isinstance(opened, Exception), opened
    assert time.monotonic() - t0 > 7
    assert any("shutting down" in r.getMessage() for r in caplog.records)
    getattr(opened, "engine", opened).dispose()


def _refusal(port: int) -> str:
    import psycopg

    try:
        psycopg.connect(f"host=127.0.0.1 port={port} user=mlrc dbname=postgres").close()
    except psycopg.OperationalError as e:
        return str(e)
    return ""


def _open(opened, url: str):  # noqa: ANN001, ANN202 — what it opened, or the error raised
    try:
        return opened(url)
    except Exception as e:  # noqa: BLE001
        return e
