"""Small helpers for one-line error messages and process checks, shared by every module.

Imports nothing of mlrc, so any module (the store, the trainer, the command line) can use it.
"""

from __future__ import annotations

import os

__all__ = [
    "alive",
    "counted",
    "first_line",
    "forget_stop_signals",
    "interrupt_behind",
    "note_stop_signal",
    "raise_if_stopped",
    "signal_behind",
    "stop_signal",
    "worker_message",
]

# The stop signals (SIGINT, SIGTERM) this process's command received: ``mlrc.cli.interrupts``
# notes each one as it raises KeyboardInterrupt, so that a KeyboardInterrupt a library swallowed
# still stops the work at the next epoch or trial (:func:`raise_if_stopped`).
_stop_signals: list[int] = []


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``1 study``, ``2 studies``: ``n`` and the word in the number it takes (``plural``
    defaults to ``singular + "s"``, or ``…ies`` for a word in ``y``)."""
    if n == 1:
        return f"{n} {singular}"
    if plural is None:
        plural = singular[:-1] + "ies" if singular.endswith("y") else singular + "s"
    return f"{n} {plural}"


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


def note_stop_signal(signum: int) -> None:
    """Remember that ``signum`` asked this process to stop (the command line's handler)."""
    _stop_signals.append(signum)


def stop_signal() -> int | None:
    """The first stop signal this process's command received, or None."""
    return _stop_signals[0] if _stop_signals else None


def forget_stop_signals() -> None:
    """A new command starts (or one ended): no stop signal received yet."""
    _stop_signals.clear()


def raise_if_stopped() -> None:
    """KeyboardInterrupt again if a stop signal was received: called between epochs and before
    each trial, it stops the work even where the first KeyboardInterrupt was swallowed."""
    if _stop_signals:
        raise KeyboardInterrupt


def alive(pid: int) -> bool:
    """Is process ``pid`` running on this host (this process included)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
