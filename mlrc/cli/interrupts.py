"""Ctrl-C and SIGTERM in a command that trains: one line, exit 128 + signal number."""

from __future__ import annotations

import signal
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
    stops_raise_now,
)

__all__ = ["STOP_SIGNALS", "interrupt_behind", "interrupts"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def interrupts() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP stop a command that trains (``study run|test``, ``worker``,
    ``demo``, ``campaign run``) the same way: the running work is recorded as interrupted (a
    trial: retried, not counted; a test fold: resumed), one line on stderr naming it —
    ``interrupted (SIGINT): trial 3 marked interrupted; run the same command to resume`` —,
    exit code 128 + signal number (130 for SIGINT, 143 for SIGTERM, as a shell reports them);
    re-running the same command resumes.

    The handlers only record the signal (:func:`mlrc.errors.note_stop_signal`); mlrc raises the
    stop at its next safe point (a training step, a pass of a wait or backoff loop). The three
    signals are unblocked while inside (a launcher's blocked mask is inherited through fork and
    exec), the caller's mask and handlers restored on exit. SIGINT or SIGTERM ignored at entry
    is handled all the same, with a one-line warning; an ignored SIGHUP (``nohup``) stays so."""
    import threading

    forget_stop_signals()
    main = threading.current_thread() is threading.main_thread()
    installed = _install() if main else None
    try:
        yield
    except Exception as e:  # raised while a stop unwound (torch.save's zip writer does)?
        stop = None if isinstance(e, typer.Exit) else interrupt_behind(e)
        if stop is None:
            raise
        _stopped(stop)
    except KeyboardInterrupt as e:
        _stopped(e)
    else:
        if stop_signal() is not None:  # received after the last safe point: the work ended
            _stopped(KeyboardInterrupt())
    finally:
        if installed is not None:
            _uninstall(*installed)
        forget_stop_signals()


def _on_signal(signum: int, _frame: object) -> None:
    """Record the signal; raise only inside :func:`mlrc.errors.stops_raise_at_once`, once."""
    if note_stop_signal(signum) == 1 and stops_raise_now():
        raise KeyboardInterrupt


def _install() -> tuple[dict[int, object], set[int]]:
    """The handlers set, then the signals unblocked; (previous handlers, previous mask)."""
    previous: dict[int, object] = {}
    for s in STOP_SIGNALS:
        current = signal.getsignal(s)
        if current == signal.SIG_IGN:
            if s == signal.SIGHUP:
                continue  # nohup: the user asked to outlive the terminal
            name = signal.Signals(s).name
            err_console.print(
                f"warning: {name} was ignored when mlrc started (inherited); mlrc stops on it "
                "all the same",
                highlight=False,
            )
        previous[s] = signal.signal(s, _on_signal)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
    return previous, mask


def _uninstall(previous: dict[int, object], mask: set[int]) -> None:
    """The caller's mask, then its handlers (a signal arriving in between is recorded)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for s, handler in previous.items():
        signal.signal(s, handler)  # type: ignore[arg-type]


def _stopped(e: KeyboardInterrupt) -> None:
    """The one line of a stopped command, naming the work recorded as interrupted (``e.what``,
    set by :class:`~mlrc.search.errors.Interrupted`); exit 128 + the signal's number."""
    sig = signal.Signals(stop_signal() or signal_behind(e) or signal.SIGINT)
    what = getattr(e, "what", None)
    marked = f"{what} marked interrupted; " if what else ""
    err_console.print(
        f"interrupted ({sig.name}): {marked}run the same command to resume", highlight=False
    )
    raise typer.Exit(128 + sig.value) from None
