"""The exceptions a study raises: refused as asked (:class:`StudyError`), or stopped
(:class:`Interrupted`)."""

from __future__ import annotations


class StudyError(RuntimeError):
    """The study cannot run as asked (locked, changed config, no complete trial, ...)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the search; ``trial``: the trial recorded as interrupted."""

    def __init__(self, trial: int | None = None) -> None:
        super().__init__("interrupted" if trial is None else f"trial {trial} interrupted")
        self.trial = trial
