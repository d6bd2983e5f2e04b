"""Small helpers for one-line error messages and process checks, shared by every module.

Imports nothing of mlrc, so any module (the store, the trainer, the command line) can use it.
"""

from __future__ import annotations

import os

__all__ = ["alive", "first_line", "interrupt_behind", "signal_behind", "worker_message"]


def first_line(error: BaseException | str, default: str | None = None) -> str:
    """The first non-blank line of ``error``'s message, stripped. An empty message gives
    ``default``: the exception's type name when not given (``""`` for a string).

    For a database error pass the driver's exception (``getattr(e, "orig", None) or e``): its
    message is the server's, without SQLAlchemy's ``[SQL: ...]`` lines."""
    for line in str(error).splitlines():
        if line.strip():
            return line.strip()
    if default is not None:
        return default
    return "" if isinstance(error, str) else type(error).__name__


def worker_message(message: str) -> str:
    """The original message of an error re-raised from a DataLoader worker, whose message
    carries the worker's traceback: its last line, without a ``DatasetError:``/``mlrc.…:``
    prefix (e.g. ``/path: unreadable ...``). Any other message is returned unchanged."""
    if "Original Traceback" in message:
        last = [ln for ln in message.splitlines() if ln.strip()][-1]
        return last.split(": ", 1)[1] if last.startswith(("DatasetError", "mlrc.")) else last
    return message


def interrupt_behind(e: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt that ``e`` is, or was raised while handling, if any (a Ctrl-C may
    surface as another error raised while it unwound: torch.save's RuntimeError mid-write)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def signal_behind(e: BaseException | None) -> int | None:
    """The signal number an exception of ``e``'s chain says stopped the work (a ``signum``
    attribute: a launcher that caught SIGTERM itself), or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(getattr(e, "signum", None), int):
            return e.signum
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def alive(pid: int) -> bool:
    """Is process ``pid`` running on this host (this process included)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
