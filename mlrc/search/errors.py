"""The exceptions a study raises: refused as asked (:class:`StudyError`), or stopped
(:class:`Interrupted`); and the one rule for how work that raised ends (:func:`ending`)."""

from __future__ import annotations

import re
import signal

from mlrc.config import ConfigError
from mlrc.data.base import DatasetError
from mlrc.errors import interrupt_behind
from mlrc.protocol import SplitError
from mlrc.registry import RegistryError
from mlrc.store import StoreError, is_database_error
from mlrc.train.ranks import RankLost

__all__ = [
    "INTERRUPTED",
    "USER_ERRORS",
    "Interrupted",
    "StudyError",
    "ending",
    "failure_reason",
    "loader_lost",
    "rank_lost",
    "interrupt_behind",
]

INTERRUPTED = "interrupted"  # the state, and the reason, of work stopped by a signal


class StudyError(RuntimeError):
    """The study cannot run as asked (locked, changed config, no complete trial, ...)."""


# The expected failures: a user's input or the state of the store, each one line for the user
# (the CLI prints it and exits 2; a campaign records it as the study's reason), never a crash.
USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    StudyError,
    StoreError,
    DatasetError,
    RegistryError,
    SplitError,
)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the work; ``trial``: the trial recorded as interrupted, or
    ``what``: the work recorded as interrupted (``reproduction 2, fold 1``)."""

    def __init__(self, trial: int | None = None, what: str | None = None) -> None:
        if what is None and trial is not None:
            what = f"trial {trial}"
        super().__init__(INTERRUPTED if what is None else f"{what} {INTERRUPTED}")
        self.trial, self.what = trial, what


def failure_reason(e: BaseException) -> str:
    """The one line the user sees for ``e`` (without ``error:``), the reason kept with the work
    it failed: an expected error's message as written (``…/x.png: unreadable or corrupt image
    (…)``; an error re-raised from a DataLoader worker: its original message), any other
    ``Type: first line`` (as the command's boundary prints it)."""
    from mlrc.config import ConfigError
    from mlrc.data.base import DatasetError
    from mlrc.errors import first_line, worker_message
    from mlrc.protocol import SplitError
    from mlrc.registry import RegistryError

    cause = getattr(e, "cause", None)  # a Ray task's error: the exception the task raised
    if type(e).__name__.startswith("RayTaskError") and isinstance(cause, BaseException):
        e = cause
    line = first_line(worker_message(str(e)), default="")
    if isinstance(e, ConfigError | StudyError | DatasetError | RegistryError | SplitError):
        return line or type(e).__name__
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def ending(e: BaseException) -> tuple[str, str | None]:
    """How work (a trial, a fold, a reproduction) that raised ``e`` ends — the one rule of every
    backend and of campaigns: ``("interrupted", None)`` for a signal (Ctrl-C, SIGTERM: a
    KeyboardInterrupt, or an error raised while one unwound), ``("lost", None)`` for a lost
    database (nothing can be written: the next run, or another worker after the heartbeat's
    grace period, records it as interrupted), ``("failed", reason)`` for everything else, the
    reason being the one-line error the user sees (:func:`failure_reason`). A lost worker (no
    heartbeat) is the third way to be interrupted; it is found by others, not raised. A rank of
    a K-process fold killed or lost (:class:`~mlrc.train.launch.RankLost`) is the fourth:
    ``("interrupted", "interrupted: rank 1 of 2 ended by SIGKILL")`` — retried, resuming from
    ``last.pt``, and the worker goes on."""
    if interrupt_behind(e) is not None:
        return INTERRUPTED, None
    if is_database_error(e):
        return "lost", None
    lost = rank_lost(e)
    if lost is not None:
        return INTERRUPTED, f"{INTERRUPTED}: {lost}"
    loader = loader_lost(e)
    if loader is not None:
        return INTERRUPTED, f"{INTERRUPTED}: {loader}"
    return "failed", failure_reason(e)


def rank_lost(e: BaseException) -> RankLost | None:
    """``e`` (or the exception a Ray task's error carries) when it is a lost rank."""
    cause = getattr(e, "cause", None)
    for x in (e, cause):
        if isinstance(x, RankLost):
            return x
    return None


# PyTorch's words (its SIGCHLD handler) for a DataLoader process that a signal ended; the names
# are strsignal's. Only the signals sent from outside (the OOM killer, scancel, kill): a loader
# that crashes (SIGSEGV, SIGABRT) fails its trial as any error does.
_LOADER_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
_FROM_OUTSIDE = {
    signal.strsignal(s): s.name for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
}


def loader_lost(e: BaseException) -> str | None:
    """``data loader process PID ended by SIGKILL`` when ``e``, or an error it was raised from,
    says a DataLoader process of the work was ended from outside: interrupted and retried (as
    a lost rank), not a failure of the trial's parameters. None otherwise."""
    x: BaseException | None = e
    for _ in range(6):
        if x is None:
            return None
        m = _LOADER_KILLED.search(str(x))
        if m and m[2] in _FROM_OUTSIDE:
            return f"data loader process {m[1]} ended by {_FROM_OUTSIDE[m[2]]}"
        x = x.__cause__ or x.__context__
    return None
