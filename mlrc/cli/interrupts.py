"""Ctrl-C and SIGTERM in a command that trains: one line, exit 128 + signal number."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from mlrc.terminal import err_console

__all__ = ["interrupt_behind", "interrupts"]


@contextmanager
def interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM stop a study command the same way: the running trial is recorded as
    interrupted (retried, not counted), one line on stderr, exit code 128 + signal number
    (130 for SIGINT, 143 for SIGTERM, as a shell reports them); re-running the same command
    resumes. A second SIGTERM during that cleanup is ignored (SIGKILL still ends it)."""
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
        if isinstance(e, typer.Exit) or interrupt_behind(e) is None:
            raise
        sig = signal.Signals(got[0] if got else signal.SIGINT)
        err_console.print(
            f"interrupted ({sig.name}): run the same command to resume", highlight=False
        )
        raise typer.Exit(128 + sig.value) from None
    except KeyboardInterrupt as e:
        sig = signal.Signals(got[0] if got else signal.SIGINT)
        trial = getattr(e, "trial", None)
        what = f"trial {trial} marked interrupted; " if trial is not None else ""
        err_console.print(
            f"interrupted ({sig.name}): {what}run the same command to resume", highlight=False
        )
        raise typer.Exit(128 + sig.value) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt that ``e`` was raised while handling, if any."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
