"""Small helpers for one-line error messages and process checks, shared by every module.

Imports nothing of mlrc, so any module (the store, the trainer, the command line) can use it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "alive",
    "counted",
    "first_line",
    "forget_stop_signals",
    "interrupt_behind",
    "note_stop_signal",
    "raise_if_stopped",
    "signal_behind",
    "sleep_or_stop",
    "stop_signal",
    "stops_raise_at_once",
    "stops_raise_now",
    "worker_message",
]

# Signals as data. The stop signals (SIGINT, SIGTERM, SIGHUP) this process's command received:
# ``mlrc.cli.interrupts``'s handlers only note them here. mlrc's own code raises the stop at its
# safe points (:func:`raise_if_stopped`: each training step, each pass of every wait, poll and
# backoff loop), never from inside whatever a library runs when the signal lands (a weakref
# callback drops an exception raised there).
_stop_signals: list[int] = []
# > 0 while mlrc waits inside a library that has no safe point of its own (Ray Tune's fit): the
# handler then raises KeyboardInterrupt at once, as Python's default handler does.
_raise_at_once: list[int] = [0]
SLICE_S = 0.1  # the longest a wait of :func:`sleep_or_stop` goes without looking for a stop


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
    surface as another error raised while it unwound: torch.save's RuntimeError mid-write).
    Once this process received a stop signal, any error is one: the work the stop cut short
    (a loader process ended by the same signal sent to the whole group) is interrupted, not
    failed; a real failure shows again when the work resumes."""
    first = e
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    if first is not None and _stop_signals:
        return _stop()
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


def note_stop_signal(signum: int) -> int:
    """Remember that ``signum`` asked this process to stop (the command line's handler: it
    must do little else, as it runs between any two bytecodes); how many were received."""
    _stop_signals.append(signum)
    return len(_stop_signals)


def stop_signal() -> int | None:
    """The first stop signal this process's command received, or None."""
    return _stop_signals[0] if _stop_signals else None


def forget_stop_signals() -> None:
    """A new command starts (or one ended): no stop signal received yet."""
    _stop_signals.clear()


def _stop() -> KeyboardInterrupt:
    """The KeyboardInterrupt that stops the work, carrying the first signal's number."""
    stop = KeyboardInterrupt()
    stop.signum = _stop_signals[0]  # type: ignore[attr-defined]  # read by signal_behind
    return stop


def raise_if_stopped() -> None:
    """KeyboardInterrupt (its ``signum``: the signal's number) if a stop signal was received:
    mlrc's safe points call it — each training step and evaluation batch, each epoch and trial,
    each pass of a wait, poll or backoff loop."""
    if _stop_signals:
        raise _stop()


def sleep_or_stop(seconds: float) -> None:
    """Sleep ``seconds``, looking for a stop every :data:`SLICE_S` (a handler that only records
    does not cut ``time.sleep`` short): KeyboardInterrupt within that of a signal. A negative
    wait returns at once (after one look). Tenacity's ``sleep``, and every poll's."""
    deadline = time.monotonic() + seconds
    while True:
        raise_if_stopped()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(SLICE_S, left))


@contextmanager
def stops_raise_at_once() -> Iterator[None]:
    """While inside, a stop signal raises KeyboardInterrupt at once (the handler does, the first
    time): for a wait inside a library that never reaches one of mlrc's safe points (Ray Tune's
    fit, which runs the trials in other processes). A stop already received raises on entry."""
    raise_if_stopped()
    _raise_at_once[0] += 1
    try:
        yield
    finally:
        _raise_at_once[0] -= 1


def stops_raise_now() -> bool:
    """Should the handler raise KeyboardInterrupt itself (inside :func:`stops_raise_at_once`)?"""
    return _raise_at_once[0] > 0


def alive(pid: int) -> bool:
    """Is process ``pid`` running on this host (this process included)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
