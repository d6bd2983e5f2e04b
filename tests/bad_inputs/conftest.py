"""The bad-input corpus runs the real ``mlrc`` command (in-process, ``typer.testing.CliRunner``)
and reads what a user sees: exit code 2 and exactly one line ``error: FILE: KEY: reason``."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import typer.core
import typer.main
import typer.testing
from typer.testing import CliRunner, Result

PREFIX = "..."  # an expected message ending in "..." is a prefix (the rest lists names available)

runner = CliRunner()


@functools.cache
def _command() -> typer.core.TyperGroup:
    from mlrc.cli import app

    return typer.main.get_command(app)


def invoke(args: list[str | Path]) -> Result:
    """``mlrc ARGS`` in-process. The click command is built once: typer's runner rebuilds it
    on every call (most of the time of a call that fails at validation)."""
    from mlrc.cli import app  # here, not at the top: the folder's other tests need no CLI

    with mock.patch.object(typer.testing, "_get_command", lambda _: _command()):
        return runner.invoke(app, [str(a) for a in args])


def message_of(output: str, path: Path) -> str:
    """The message of a one-line ``error: PATH: message`` output (asserting that shape)."""
    lines = output.splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{output}"
    assert "Traceback" not in output
    assert lines[0].startswith(f"error: {path}: "), lines[0]
    return lines[0].removeprefix(f"error: {path}: ")


def assert_message(message: str, expected: str) -> None:
    """``expected`` is the whole message, or its beginning when it ends in ``...``."""
    if expected.endswith(PREFIX):
        assert message.startswith(expected.removesuffix(PREFIX)), message
    else:
        assert message == expected


@pytest.fixture
def fails_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """``fails_with(command, path, expected)``: run ``mlrc COMMAND PATH --storage ...`` and check
    exit code 2, one error line naming ``path``, the message, and that no store was created.
    A file that wrongly passes validation fails the test (it never gets to train)."""
    db = tmp_path / "store.sqlite"
    monkeypatch.setattr("mlrc.store.connect", lambda *a, **k: pytest.fail("passed validation"))

    def check(command: list[str], path: Path, expected: str) -> str:
        result = invoke([*command, path, "--storage", f"sqlite:///{db}"])
        assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
        message = message_of(result.output, path)
        assert_message(message, expected)
        assert not db.exists(), "a bad file must stop before the store is touched"
        return message

    return check


def run_mlrc(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``mlrc`` command in a subprocess (what a user's shell runs)."""
    exe = Path(sys.executable).with_name("mlrc")
    command = [str(exe)] if exe.is_file() else [sys.executable, "-m", "mlrc.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)
