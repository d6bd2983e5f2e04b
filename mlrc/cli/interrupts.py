"""Ctrl-C and SIGTERM in a command that trains: one line, exit 128 + signal number."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from mlrc.cli.terminal import err_console
from mlrc.errors import interrupt_behind

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

    got: list[int] = []

    def on_sigterm(signum: int, _frame: object) -> None:
        got.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    try:
        yield
    except Exception as e:  # raised while a Ctrl-C unwound (torch.save's zip writer does)?
        stop = None if isinstance(e, typer.Exit) else interrupt_behind(e)
        if stop is None:
            raise
        _stopped(stop, got)
    except KeyboardInterrupt as e:
        _stopped(e, got)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _stopped(e: KeyboardInterrupt, got: list[int]) -> None:
    """The one line of a stopped command, naming the work recorded as interrupted (``e.what``,
    set by :class:`~mlrc.search.errors.Interrupted`); exit 128 + the signal's number."""
    import signal

    from mlrc.errors import signal_behind

    sig = signal.Signals(got[0] if got else signal_behind(e) or signal.SIGINT)
    what = getattr(e, "what", None)
    marked = f"{what} marked interrupted; " if what else ""
    err_console.print(
        f"interrupted ({sig.name}): {marked}run the same command to resume", highlight=False
    )
    raise typer.Exit(128 + sig.value) from None
