"""The CLI's edges, as a new user meets them (issue #13 point 8): a device this machine does not
have, a mistyped SQLite path given to a command that only reads, a dashboard port already in
use, an ``--artifacts`` folder that cannot be created, and any exception nobody foresaw. Each
ends in one line on stderr, exit code ≠ 0, no traceback; the unforeseen ones name the command
and the file holding the full traceback (``--debug`` prints it instead).

Through the real ``mlrc`` command: in-process (``CliRunner``) and, for the boundary, one real
process. The device cases run on a CPU-only machine: CUDA's presence is patched where a case
needs a GPU count."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.store.engine import session
from mlrc.store.schema import Study, Trial

runner = CliRunner()
NO_CUDA = (
    "no CUDA device is available on this machine (torch.cuda.is_available() is False); "
    "use --device cpu"
)


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch, tmp_path):
    """No ``MLRC_DEBUG`` from the caller's shell; tracebacks go under this test's folder."""
    monkeypatch.delenv("MLRC_DEBUG", raising=False)
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))


def one_line(args: list, code: int = 2) -> str:
    """``mlrc ARGS``: exit ``code``, nothing on stdout, exactly one line on stderr (returned)."""
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, (r.exit_code, r.output, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and r.stdout == "", r.output
    assert "Traceback" not in r.output
    return lines[0]


def new_store(path: Path) -> str:
    url = f"sqlite:///{path}"
    store.connect(url).dispose()
    return url


# The commands that take --device, with the arguments they need to get as far as the check.
DEVICE_COMMANDS = {
    "data baselines": ["data", "baselines"],
    "study run": ["study", "run", "study.yaml"],
    "study test": ["study", "test", "study.yaml"],
    "worker": ["worker", "study.yaml"],
    "demo": ["demo"],
    "campaign run": ["campaign", "run", "campaign.yaml"],
}


# --- 1. the device, before any work ------------------------------------------------------------


@pytest.mark.parametrize("command", DEVICE_COMMANDS)
def test_cuda_on_a_machine_without_it_is_one_line_before_any_work(command, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    db = tmp_path / "store.db"
    storage = [] if command == "data baselines" else ["--storage", f"sqlite:///{db}"]
    line = one_line([*DEVICE_COMMANDS[command], *storage, "--device", "cuda"])
    assert line == f"error: --device cuda: {NO_CUDA}"
    assert not db.exists()


def test_a_gpu_number_past_the_count_names_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert one_line(["study", "run", "study.yaml", "--device", "cuda:3"]) == (
        "error: --device cuda:3: this machine has 1 CUDA device (cuda:0)"
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert one_line(["demo", "--device", "cuda:2"]) == (
        "error: --device cuda:2: this machine has 2 CUDA devices (cuda:0 to cuda:1)"
    )


@pytest.mark.parametrize("device", ["gpu", "CUDA", "cuda:", "cuda:x", "cpu:0", "cuda0", ""])
def test_a_mistyped_device_lists_the_accepted_forms(device):
    assert one_line(["data", "baselines", "--device", device]) == (
        f"error: --device {device}: not a device (cpu, cuda, cuda:N or mps)"
    )


def test_mps_on_a_machine_without_it_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert one_line(["worker", "study.yaml", "--device", "mps"]) == (
        "error: --device mps: no MPS device is available on this machine "
        "(torch.backends.mps.is_available() is False); use --device cpu"
    )


def test_the_worker_reads_its_device_from_the_environment(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("MLRC_DEVICE", "cuda:0")
    assert one_line(["worker", "study.yaml"]) == f"error: --device cuda:0: {NO_CUDA}"


# --- 2. commands that only read never create a database ---------------------------------------

READERS = {
    "report": ["report"],
    "study status": ["study", "status", "s"],
    "campaign status": ["campaign", "status", "c"],
    "dashboard build": ["dashboard", "build", "--out", "page.html"],
    "dashboard serve": ["dashboard", "serve", "--port", "0"],
}


@pytest.mark.parametrize("command", READERS)
def test_a_mistyped_sqlite_path_is_refused_by_readers_and_not_created(
    command, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    line = one_line([*READERS[command], "--storage", "sqlite:///typo.db"])
    assert line == (
        "error: sqlite:///typo.db: no such database file (typo.db); check --storage or MLRC_STORAGE"
    )
    assert sorted(os.listdir(tmp_path)) == ["cache"] or not os.listdir(tmp_path)


def test_the_storage_from_the_environment_is_refused_the_same_way(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "mlrc.db"
    monkeypatch.setenv("MLRC_STORAGE", f"sqlite:///{missing}")
    assert one_line(["report"]) == (
        f"error: sqlite:///{missing}: no such database file ({missing}); check --storage or "
        "MLRC_STORAGE"
    )
    assert not missing.parent.exists()


def test_readers_read_an_existing_store_and_writers_still_create_one(tmp_path):
    url = new_store(tmp_path / "mlrc.db")
    r = runner.invoke(app, ["report", "--storage", url])
    assert "no such database file" not in r.output
    fresh = tmp_path / "fresh.db"
    store.connect(f"sqlite:///{fresh}").dispose()  # what study run, worker and demo call
    assert fresh.exists()
    with pytest.raises(store.StoreError, match="no such database file"):
        store.connect(f"sqlite:///{tmp_path / 'other.db'}", read_only=True)
    assert not (tmp_path / "other.db").exists()


# --- 3. the dashboard's port -------------------------------------------------------------------


@pytest.fixture
def never_serve(monkeypatch):
    """A server that did bind must not block the test in ``serve_forever``."""
    from http.server import ThreadingHTTPServer

    def refuse(self, *a, **k):
        raise AssertionError("the server bound where it should have failed")

    monkeypatch.setattr(ThreadingHTTPServer, "serve_forever", refuse)


def test_a_port_in_use_is_one_line(tmp_path, never_serve):
    url = new_store(tmp_path / "mlrc.db")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line(["dashboard", "serve", "--port", port, "--storage", url])
    assert line == f"error: 127.0.0.1:{port} is already in use; choose another --port"


def test_a_port_in_use_is_named_before_the_store_is_read(tmp_path, never_serve):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line(["dashboard", "serve", "--port", port, "--storage", "sqlite:///typo.db"])
    assert line == f"error: 127.0.0.1:{port} is already in use; choose another --port"


def test_a_privileged_port_is_one_line(tmp_path, monkeypatch, never_serve):
    """Whoever runs the tests (root may bind port 80): the refusal the kernel gives others."""
    import mlrc.report.server as server

    def refused(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(server, "ThreadingHTTPServer", refused)
    url = new_store(tmp_path / "mlrc.db")
    assert one_line(["dashboard", "serve", "--port", "80", "--storage", url]) == (
        "error: 127.0.0.1:80: permission denied (ports below 1024 need administrator rights); "
        "choose another --port"
    )


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        (
            "192.0.2.1",  # TEST-NET-1: never an address of this machine
            8050,
            "error: --host 192.0.2.1: not an address of this machine (Cannot assign requested "
            "address); use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)",
        ),
        ("127.0.0.1", 70000, "error: --port 70000: not a port number (0 to 65535)"),
        ("127.0.0.1", -1, "error: --port -1: not a port number (0 to 65535)"),
    ],
)
def test_a_bad_host_or_port_is_one_line(tmp_path, never_serve, host, port, expected):
    url = new_store(tmp_path / "mlrc.db")
    assert one_line(["dashboard", "serve", "--host", host, "--port", port, "--storage", url]) == (
        expected
    )


# --- 4. an --artifacts folder that cannot be created ------------------------------------------

ARTIFACT_COMMANDS = [c for c in DEVICE_COMMANDS if c != "data baselines"]


@pytest.mark.parametrize("command", ARTIFACT_COMMANDS)
def test_artifacts_under_a_file_is_one_line_before_any_work(command, tmp_path):
    (tmp_path / "notes.txt").write_text("a file\n")
    folder = tmp_path / "notes.txt" / "artifacts"
    db = tmp_path / "store.db"
    line = one_line(
        [*DEVICE_COMMANDS[command], "--storage", f"sqlite:///{db}", "--artifacts", folder]
    )
    assert line == (
        f"error: --artifacts {folder}: cannot create this folder "
        f"({tmp_path / 'notes.txt'} is a file, not a folder)"
    )
    assert not db.exists()


def test_artifacts_naming_a_file_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("a file\n")
    assert one_line(["study", "run", "s.yaml", "--artifacts", tmp_path / "notes.txt"]) == (
        f"error: --artifacts {tmp_path / 'notes.txt'}: not a folder (a file of that name exists)"
    )


def test_artifacts_with_a_nul_character_is_refused_before_any_work(tmp_path, capsys):
    """No shell can pass a NUL in an argument; typer's path conversion refuses one as a usage
    error (exit 2, no traceback) before the command's own check
    (:func:`mlrc.cli.terminal.check_artifacts`), which names it in one line for other callers."""
    from mlrc.cli.terminal import check_artifacts

    folder = f"{tmp_path}/a\x00b"
    r = runner.invoke(app, ["demo", "--artifacts", folder])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "Invalid value for '--artifacts'" in r.output and "null byte" in r.output
    with pytest.raises(typer.Exit) as e:
        check_artifacts(Path(folder))
    assert e.value.exit_code == 2
    assert capsys.readouterr().err == (
        f"error: --artifacts {folder!r}: not a usable folder name (it contains a NUL character)\n"
    )


def test_artifacts_under_a_read_only_folder_is_one_line(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes into read-only folders: what any other user is told
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, m: p != str(locked) and access(p, m))
    try:
        assert one_line(["study", "test", "s.yaml", "--artifacts", locked / "a" / "b"]) == (
            f"error: --artifacts {locked / 'a' / 'b'}: cannot create this folder "
            f"({locked} is not writable)"
        )
    finally:
        locked.chmod(0o755)


# --- 5. the boundary: anything else is one line naming the command and the traceback's file ---


def boom(*args, **kwargs):
    return 1 / 0


def unexpected_report(tmp_path, monkeypatch, *options: str):
    monkeypatch.setattr("mlrc.report.tables.collect", boom)
    url = new_store(tmp_path / "mlrc.db")
    return runner.invoke(app, [*options, "report", "--storage", url])


def test_an_unexpected_exception_is_one_line_and_a_traceback_file(tmp_path, monkeypatch):
    r = unexpected_report(tmp_path, monkeypatch)
    assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.output, r.output
    logs = list((tmp_path / "cache" / "logs").iterdir())
    assert len(logs) == 1 and logs[0].name.startswith("mlrc-") and logs[0].suffix == ".log"
    assert r.stderr.splitlines() == [
        "error: mlrc report: ZeroDivisionError: division by zero "
        f"(full traceback in {logs[0]}; --debug prints it)"
    ]
    text = logs[0].read_text()
    assert text.startswith("mlrc report failed at ")
    assert "Traceback (most recent call last)" in text and "in boom" in text
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert logs[0].stat().st_mode & 0o077 == 0  # the user's only


def test_the_command_named_is_the_subcommand(tmp_path, monkeypatch):
    monkeypatch.setattr("mlrc.cli.study.print_status_by_name", lambda *a: {}["missing key"])
    url = new_store(tmp_path / "mlrc.db")
    line = one_line(["study", "status", "s", "--storage", url], code=1)
    assert line.startswith("error: mlrc study status: KeyError: 'missing key' (full traceback in ")


def test_a_multi_line_message_keeps_its_first_line(tmp_path, monkeypatch):
    def multi(*a, **k):
        raise RuntimeError("first line\nsecond line\nthird")

    monkeypatch.setattr("mlrc.report.tables.collect", multi)
    url = new_store(tmp_path / "mlrc.db")
    line = one_line(["report", "--storage", url], code=1)
    assert line.startswith("error: mlrc report: RuntimeError: first line (full traceback in ")


def test_without_a_writable_cache_the_traceback_goes_to_the_temporary_folder(tmp_path, monkeypatch):
    import tempfile

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r = unexpected_report(tmp_path, monkeypatch)
    (log,) = (tmp_path / "tmp").iterdir()
    assert r.exit_code == 1 and f"(full traceback in {log}; --debug prints it)" in r.stderr
    assert "ZeroDivisionError" in log.read_text()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_debug_prints_the_traceback_instead(tmp_path, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("MLRC_DEBUG", "1")
    r = unexpected_report(tmp_path, monkeypatch, *(["--debug"] if how == "option" else []))
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("Traceback (most recent call last)") and "in boom" in r.stderr
    assert r.stderr.splitlines()[-1] == "error: mlrc report: ZeroDivisionError: division by zero"
    assert not (tmp_path / "cache" / "logs").exists()


def test_one_line_errors_keep_their_message_and_exit_code(tmp_path):
    assert one_line(["report", "--storage", "not a url"]).startswith(
        "error: <unparsable database URL>: cannot use this database URL ("
    )
    missing = tmp_path / "nope.yaml"
    assert one_line(["study", "run", missing, "--storage", f"sqlite:///{tmp_path / 's.db'}"]) == (
        f"error: {missing}: cannot read (No such file or directory)"
    )
    assert not (tmp_path / "cache" / "logs").exists()


def test_ctrl_c_is_not_turned_into_an_error(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("mlrc.report.tables.collect", interrupted)
    url = new_store(tmp_path / "mlrc.db")
    r = runner.invoke(app, ["report", "--storage", url])
    assert r.exit_code == 130 and "error:" not in r.output, r.output
    assert not (tmp_path / "cache" / "logs").exists()


def test_an_error_raised_while_ctrl_c_unwinds_is_still_an_interrupt(tmp_path, monkeypatch):
    """torch.save's zip writer raises RuntimeError from its ``__exit__`` when Ctrl-C lands in
    the middle of a checkpoint write: the study command still ends as interrupted."""

    def interrupted_mid_write(*a, **k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")  # noqa: B904

    monkeypatch.setattr("mlrc.cli.study.open_study_file", interrupted_mid_write)
    line = one_line(["study", "run", "s.yaml", "--artifacts", tmp_path / "art"], code=130)
    assert line == "interrupted (SIGINT): run the same command to resume"
    assert not (tmp_path / "cache" / "logs").exists()


def test_a_real_process_ends_in_one_line_without_a_traceback(tmp_path):
    """What a shell sees from the installed entry point (``mlrc.cli:app``), standalone mode."""
    url = new_store(tmp_path / "mlrc.db")
    code = (
        "import mlrc.report.tables as t\n"
        "t.collect = lambda *a, **k: 1 / 0\n"
        "from mlrc.cli import app\n"
        "app(prog_name='mlrc')\n"
    )
    env = {**os.environ, "MLRC_CACHE": str(tmp_path / "cache")}
    env.pop("MLRC_DEBUG", None)
    p = subprocess.run(
        [sys.executable, "-c", code, "report", "--storage", url],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    (log,) = (tmp_path / "cache" / "logs").iterdir()
    assert p.returncode == 1 and p.stdout == "", p.stderr
    assert p.stderr.splitlines() == [
        "error: mlrc report: ZeroDivisionError: division by zero "
        f"(full traceback in {log}; --debug prints it)"
    ]


# --- status: the reason of every trial that has one -------------------------------------------


def test_status_shows_why_a_complete_trial_scored_zero(tmp_path):
    url = f"sqlite:///{tmp_path / 'mlrc.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        study = Study(
            name="s",
            dataset="glyphs",
            loss="contrastive",
            strategy=None,
            preset="cpu",
            config={},
            code_version="test",
        )
        s.add(study)
        s.flush()
        rows = [
            (0, "complete", 0.5, 0.01, None),
            (1, "complete", 0.0, None, "non-finite loss at iteration 12, fold 2"),
            (2, "failed", None, None, "fold 0: DatasetError: bad.png: unreadable"),
            (3, "failed", None, None, "RuntimeError: [enforce fail at x.cc:672] pos :x: [red]"),
        ]
        for number, state, value, sem, reason in rows:
            s.add(
                Trial(
                    study_id=study.id,
                    number=number,
                    params={"lr": 0.001},
                    params_hash=str(number),
                    state=state,
                    value=value,
                    sem=sem,
                    reason=reason,
                )
            )
    engine.dispose()
    r = runner.invoke(app, ["study", "status", "s", "--storage", url])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "trial 1 complete  0.0000  (scored 0: non-finite loss at iteration 12, fold 2)" in lines
    assert "trial 2 failed: fold 0: DatasetError: bad.png: unreadable" in lines
    assert "trial 3 failed: RuntimeError: [enforce fail at x.cc:672] pos :x: [red]" in lines
    assert "best so far: trial 0, val MAP@R 0.5000 ± 0.0100 (SEM over folds)" in lines
