"""``mlrc plugins list [KIND]``: every registered plug-in, built-in or installed, with its source
package, parameters, default search space and capabilities (the records of
:func:`mlrc.config.plugins.plugin_records`; this module only prints them)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from mlrc.cli.terminal import console, user_errors

plugins_app = typer.Typer(
    no_args_is_help=True,
    help="Registered plug-ins (losses, miners, strategies, samplers, trunks, datasets, metrics).",
)


@plugins_app.command("list")
def plugins_list(
    kind: Annotated[
        str | None,
        typer.Argument(
            help="loss, miner, strategy, sampler, trunk, dataset or metric (default: all)"
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON only")] = False,
) -> None:
    """Every registered plug-in of KIND: name, source package (mlrc for a built-in, else the
    installed distribution that registered it), parameters with their defaults, the parameters
    searched by default, and capabilities (a loss's batch kind, whether it takes a miner's
    tuples, whether it has trainable parameters; a strategy's needs; a metric's @ parameter,
    depth and needs)."""
    from mlrc.config.plugins import PLUGIN_KINDS, plugin_records

    with user_errors():
        records = plugin_records(kind)
    if json_out:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return
    for k in PLUGIN_KINDS:
        rows = [r for r in records if r.kind == k]
        if rows:
            console.print(_table(k, rows))


def _table(kind: str, records: list[Any]) -> Table:
    """One rich table of the records of ``kind``."""
    table = Table(title=f"{kind} plug-ins", title_justify="left", show_lines=False)
    table.add_column("name", no_wrap=True)  # whole, to copy into a study file
    table.add_column("source", no_wrap=True)
    for column in ("parameters (default)", "searched", "capabilities"):
        table.add_column(column, overflow="fold")
    for r in records:
        params = ", ".join(
            f"{p} (required)" if v.get("required") else f"{p}={v['default']!r}"
            for p, v in r.params.items()
        )
        space = ", ".join(f"{p} {text}" for p, text in r.space.items())
        caps = ", ".join(f"{c}={v}" for c, v in r.capabilities.items())
        table.add_row(r.name, r.source, params or "–", space or "–", caps or "–")
    return table
