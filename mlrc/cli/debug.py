"""``mlrc --debug``: whether this invocation shows full tracebacks (and passes that on to the
worker processes it starts)."""

from __future__ import annotations

import os

__all__ = ["debugging", "set_debug"]

_run = {"debug": False}  # this invocation's global option (set by the app's callback)


def set_debug(on: bool) -> None:
    """Record ``mlrc --debug`` for this invocation."""
    _run["debug"] = on


def debugging() -> bool:
    """``mlrc --debug`` or ``MLRC_DEBUG`` set (not empty, 0, false, no or off)."""
    env = os.environ.get("MLRC_DEBUG", "").strip().lower()
    return _run["debug"] or env not in ("", "0", "false", "no", "off")
