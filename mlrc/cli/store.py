"""``mlrc store``: the store's schema revision (``current``) and its upgrade (``upgrade``)."""

from __future__ import annotations

import typer

from mlrc.cli.options import DEFAULT_STORAGE, StorageOpt
from mlrc.cli.terminal import console, user_errors

store_app = typer.Typer(
    no_args_is_help=True,
    help="The store's schema: show its revision, upgrade it to this mlrc's.",
)


@store_app.command("upgrade")
def store_upgrade(storage: StorageOpt = DEFAULT_STORAGE) -> None:
    """Upgrade the store to this mlrc's schema; prints old → new revision (again: no change).

    Opening a store upgrades it too when the pending revisions only add columns or tables; this
    command runs every pending revision. A SQLite file that does not exist is an error."""
    from mlrc.store import upgrade

    with user_errors():
        old, new = upgrade(storage)
    note = " (up to date)" if old == new else ""
    _say(f"{old or 'none'} → {new}{note}")


@store_app.command("current")
def store_current(storage: StorageOpt = DEFAULT_STORAGE) -> None:
    """The store's schema revision, changing nothing ("none" for an empty database)."""
    from mlrc.store import current
    from mlrc.store.migrate import HEAD, known

    with user_errors():
        revision = current(storage)
    if revision is None:
        _say("none (empty database)")
    elif revision == HEAD:
        _say(f"{revision} (head)")
    elif known(revision):
        _say(f"{revision} (behind {HEAD}: run mlrc store upgrade)")
    else:
        _say(f"{revision} (newer than this mlrc, which knows revisions up to {HEAD})")


def _say(line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)
