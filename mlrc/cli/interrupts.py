"""Ctrl-C and SIGTERM in a command that trains: one line, exit 128 + signal number."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from mlrc.cli.terminal import err_console
from mlrc.errors import (
    forget_stop_signals,
    interrupt_behind,
    note_stop_signal,
    signal_behind,
    stop_signal,
)

__all__ = ["interrupt_behind", "interrupts"]


@contextmanager
def interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM stop a command that trains (``study run|test``, ``worker``, ``demo``,
    ``campaign run``) the same way: the running work is recorded as interrupted (a trial:
    retried, not counted; a test fold: resumed), one line on stderr naming it —
    ``interrupted (SIGINT): trial 3 marked interrupted; run the same command to resume`` —,
    exit code 128 + signal number (130 for SIGINT, 143 for SIGTERM, as a shell reports them);
    re-running the same command resumes. A second SIGTERM during that cleanup is ignored
    (SIGKILL still ends it)."""
    import signal
    import threading

    def on_signal(signum: int, _frame: object) -> None:
        note_stop_signal(signum)
        if signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    forget_stop_signals()
    previous = (
        {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    )
    try:
        yield
    except Exception as e:  # raised while a Ctrl-C unwound (torch.save's zip writer does)?
        stop = None if isinstance(e, typer.Exit) else interrupt_behind(e)
        if stop is None:
            raise
        _stopped(stop)
    except KeyboardInterrupt as e:
        _stopped(e)
    else:
        if stop_signal() is not None:  # its KeyboardInterrupt was swallowed, the work ended
            _stopped(KeyboardInterrupt())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        forget_stop_signals()


def _stopped(e: KeyboardInterrupt) -> None:
    """The one line of a stopped command, naming the work recorded as interrupted (``e.what``,
    set by :class:`~mlrc.search.errors.Interrupted`); exit 128 + the signal's number."""
    import signal

    sig = signal.Signals(stop_signal() or signal_behind(e) or signal.SIGINT)
    what = getattr(e, "what", None)
    marked = f"{what} marked interrupted; " if what else ""
    err_console.print(
        f"interrupted ({sig.name}): {marked}run the same command to resume", highlight=False
    )
    raise typer.Exit(128 + sig.value) from None
