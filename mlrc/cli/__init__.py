"""The ``mlrc`` command.

One module per command group: ``mlrc data …`` is :mod:`mlrc.cli.data`, ``mlrc study
run|test|status`` :mod:`mlrc.cli.study`, ``mlrc worker`` :mod:`mlrc.cli.worker`, ``mlrc report``
:mod:`mlrc.cli.report`, ``mlrc demo`` :mod:`mlrc.cli.demo`, ``mlrc campaign …``
:mod:`mlrc.cli.campaign`, ``mlrc plugins list`` :mod:`mlrc.cli.plugins`, ``mlrc dashboard …``
and ``mlrc store …`` their namesakes; options they share are in :mod:`mlrc.cli.options`, and
every command's help is made readable from its docstring by :mod:`mlrc.cli.help`. This module holds the Typer ``app``, its error
boundary and the registration of the groups (:func:`_add_subapps`).
"""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from mlrc.cli.debug import debugging, set_debug
from mlrc.cli.help import readable_help
from mlrc.cli.options import (
    DEFAULT_ARTIFACTS,
    DEFAULT_STORAGE,
    ArtifactsOpt,
    DeviceOpt,
    QuietOpt,
    StorageOpt,
)
from mlrc.cli.terminal import err_console
from mlrc.errors import first_line, worker_message

__all__ = [
    "DEFAULT_ARTIFACTS",
    "DEFAULT_STORAGE",
    "ArtifactsOpt",
    "DeviceOpt",
    "QuietOpt",
    "StorageOpt",
    "app",
    "command_paths",
    "debugging",
    "traceback_folder",
]

# --- the boundary: any unexpected exception becomes one line ----------------------------------


class _Boundary(TyperGroup):
    """The ``mlrc`` command group, and the one place where an exception that no command turned
    into a one-line message ends: ``error: mlrc COMMAND: Type: first line (full traceback in
    FILE; --debug prints it)``, exit code 1. The traceback goes to a file under
    ``$MLRC_CACHE/logs`` (default ``~/.cache/mlrc/logs``, else the system's temporary folder);
    ``mlrc --debug`` or ``MLRC_DEBUG=1`` prints it instead. Exits, usage errors, Ctrl-C and a
    closed pipe (``mlrc report | head``) pass through to typer as before."""

    def invoke(self, ctx: typer.Context) -> Any:
        import errno

        words = [*vars(ctx).get("_protected_args", []), *ctx.args]  # before typer empties them
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, EOFError):
            raise  # an exit code, a usage error, Ctrl-C: typer's own handling
        except Exception as e:  # noqa: BLE001 — this is the boundary
            if isinstance(e, OSError) and e.errno == errno.EPIPE:
                raise  # typer ends quietly on a closed pipe
            _unexpected(e, self._command(ctx, words), bool(ctx.params.get("debug")))

    def _command(self, ctx: typer.Context, words: list[str]) -> str:
        """``mlrc study run``: the names of the (sub)commands at the start of ``words``."""
        names, group = ["mlrc"], self  # also under `python -m mlrc.cli`
        for word in words:
            sub = group.get_command(ctx, word) if isinstance(group, TyperGroup) else None
            if sub is None:
                break
            names.append(word)
            group = sub
        return " ".join(names)


def traceback_folder() -> Path:
    """Where the boundary writes tracebacks: ``$MLRC_CACHE/logs``, :func:`mlrc.paths.logs_dir`."""
    from mlrc.paths import logs_dir

    return logs_dir()


def _save_traceback(text: str) -> Path | None:
    """Write ``text`` to ``mlrc-YYYYmmdd-HHMMSS-PID.log`` in :func:`traceback_folder`, else in
    the system's temporary folder (readable by this user only); None if neither can be written."""
    import tempfile
    import time

    name = f"mlrc-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    folders = []
    with suppress(Exception):  # no home folder, a bad MLRC_CACHE: the fallback below
        folders.append(traceback_folder())
    folders.append(Path(tempfile.gettempdir()))
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            return path
        except (OSError, ValueError):
            continue
    return None


def _unexpected(e: Exception, command: str, debug: bool = False) -> None:
    """End ``command`` on an exception nobody expected: one line (or the traceback with
    ``--debug``), exit code 1."""
    import datetime as dt
    import platform
    import sys
    import traceback

    line = first_line(worker_message(str(e)), default="")
    what = f"{type(e).__name__}: {line}" if line else type(e).__name__
    trace = "".join(traceback.format_exception(e))
    if debug or debugging():
        sys.stderr.write(trace)
        err_console.print(f"[red]error:[/red] {escape(f'{command}: {what}')}", highlight=False)
        raise typer.Exit(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        mlrc_version = version("mlrc")
    except PackageNotFoundError:
        mlrc_version = "unknown"
    header = (
        f"{command} failed at {dt.datetime.now().astimezone().isoformat(timespec='seconds')}\n"
        f"mlrc {mlrc_version}, Python {platform.python_version()}, {platform.platform()}, "
        f"pid {os.getpid()}\n\n"
    )
    path = _save_traceback(header + trace)
    where = (
        f"full traceback in {path}; --debug prints it"
        if path is not None
        else "the traceback could not be saved; --debug prints it"
    )
    err_console.print(
        f"[red]error:[/red] {escape(f'{command}: {what} ({where})')}", highlight=False
    )
    raise typer.Exit(1)


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Hyperparameter search for deep metric learning under the protocol of A Metric Learning "
    "Reality Check: datasets, studies, campaigns and their reports.",
    cls=_Boundary,
)


def _print_version(value: bool) -> None:
    """``mlrc --version``: the version that computes (with the git commit in a checkout)."""
    if value:
        from mlrc.config.identity import code_version

        typer.echo(f"mlrc {code_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="print mlrc's version (with the git commit in a checkout) and exit",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="an unexpected error prints its full traceback (also MLRC_DEBUG=1) instead of "
            "writing it to a file under $MLRC_CACHE/logs",
        ),
    ] = False,
) -> None:
    set_debug(debug)


def _add_subapps() -> None:
    """Register every command group, one module each (the order of ``mlrc --help``)."""
    from mlrc.cli.campaign import campaign_app
    from mlrc.cli.dashboard import dashboard_app
    from mlrc.cli.data import data_app
    from mlrc.cli.demo import demo
    from mlrc.cli.gc import gc
    from mlrc.cli.plugins import plugins_app
    from mlrc.cli.replay import replay
    from mlrc.cli.report import report
    from mlrc.cli.slurm import slurm_app
    from mlrc.cli.store import store_app
    from mlrc.cli.study import study_app
    from mlrc.cli.worker import worker

    app.command()(worker)
    app.command()(report)
    app.command()(demo)
    app.command()(gc)
    app.command()(replay)
    app.add_typer(data_app, name="data")
    app.add_typer(study_app, name="study")
    app.add_typer(campaign_app, name="campaign")
    app.add_typer(dashboard_app, name="dashboard")
    app.add_typer(store_app, name="store")
    app.add_typer(slurm_app, name="slurm")
    app.add_typer(plugins_app, name="plugins")


_add_subapps()
readable_help(app)  # whole sentences, no RST markup, in --help and the generated CLI reference


def command_paths() -> list[str]:
    """Every visible command and sub-command as typed (``mlrc study run``), for the docs."""
    paths: list[str] = []

    def walk(command: object, prefix: str) -> None:
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                paths.append(f"{prefix} {name}")
                walk(sub, f"{prefix} {name}")

    walk(typer.main.get_command(app), "mlrc")
    return paths
