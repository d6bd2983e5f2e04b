"""The processes of a fold that can end without an error of their own (killed, lost): a rank of
a K-process fold, a loader process. The work is interrupted and retried, not failed."""

from __future__ import annotations

__all__ = ["LoaderLost", "RankLost"]


class RankLost(RuntimeError):
    """A rank of a K-process fold ended without an error of its own (killed, lost)."""


class LoaderLost(RankLost):
    """A loader process of the fold was ended from outside (the OOM killer, a kill): like a
    lost rank, the trial is interrupted and retried, and the worker goes on."""
