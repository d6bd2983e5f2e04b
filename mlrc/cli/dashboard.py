"""``mlrc dashboard build|serve``: the Plotly dashboard of the store, written as one
self-contained HTML file or served live (the code is :mod:`mlrc.report.dashboard` and
:mod:`mlrc.report.server`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from mlrc.cli.options import DEFAULT_STORAGE, StorageOpt
from mlrc.cli.terminal import check_out, fail, write_out

__all__ = ["build_command", "dashboard_app", "serve_command"]

ArchivedOpt = Annotated[
    bool,
    typer.Option(
        "--archived",
        help="also the studies archived by --force-new (NAME.old-K) whose current study has "
        "test results (always marked archived)",
    ),
]

dashboard_app = typer.Typer(
    no_args_is_help=True,
    help="Plotly dashboards of the store: a self-contained HTML file, or served live.",
)


@contextmanager
def _user_errors() -> Iterator[None]:
    """A bad store, selection or address: one line on stderr, exit code 2."""
    from mlrc.report.server import ServeError
    from mlrc.report.tables import ReportError
    from mlrc.store import StoreError

    try:
        yield
    except (StoreError, ReportError, ServeError) as e:
        fail(str(e))


@dashboard_app.command("build")
def build_command(
    out: Annotated[
        Path, typer.Option("--out", help="HTML file to write (its folder is created)")
    ] = Path("mlrc-dashboard.html"),
    storage: StorageOpt = DEFAULT_STORAGE,
    study: Annotated[
        list[str] | None, typer.Option("--study", help="study name (repeat); default: all")
    ] = None,
    campaign: Annotated[
        list[str] | None,
        typer.Option("--campaign", help="campaign name (repeat): its studies in campaign order"),
    ] = None,
    archived: ArchivedOpt = False,
) -> None:
    """Write one self-contained HTML page (works offline) with every view of the store."""
    from mlrc.report.dashboard import build

    check_out(out)
    with _user_errors():
        write_out(out, lambda tmp: build(storage, tmp, study, campaign, archived))
    typer.echo(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


@dashboard_app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="address to bind (127.0.0.1: this machine only)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="port (0: any free port)")] = 8050,
    storage: StorageOpt = DEFAULT_STORAGE,
    refresh: Annotated[
        int, typer.Option(help="reload the page every S seconds (0: never)", min=0)
    ] = 30,
    archived: ArchivedOpt = False,
) -> None:
    """Serve the dashboard live: every request re-reads the store; the page reloads itself."""
    from mlrc.report.server import make_server
    from mlrc.store import redact

    with _user_errors():
        server = make_server(storage, host, port, refresh, archived)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(
        f"serving http://{shown}:{server.server_address[1]}/ (store {redact(storage)}, "
        f"refresh {refresh or 'off'}{' s' if refresh else ''}); Ctrl-C stops",
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
