"""Counts of the work the search did: how many exact distances, which certificates, how many
queries fell back to the exact ranking.

Counting changes no result. The tests read these counts to show that a path was taken (or was
not) and that tie-heavy sets cost O(n·k) exact distances, not n². Counting is on only inside
:func:`count_work` (process-wide, as :mod:`.tuning`); outside it the search only checks that
nobody is counting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(eq=False)  # one block's counts: compared (and removed) by identity
class Work:
    """What the searches inside one :func:`count_work` block did, added up."""

    exact_pairs: int = 0
    """Pairs (q, r) whose exact distance d(q, r) was evaluated (:mod:`.ranking`)."""
    certified_blocks: int = 0
    """numpy path: blocks of queries handed to the certificates, one per block of rows once
    all its tiles are done, one per strip when a single tile holds full rows (:mod:`.certify`)."""
    rescored: int = 0
    """numpy path: queries certified from the exact scores of their near candidates, retries
    with more candidates included (:func:`.certify.certify`)."""
    widened: int = 0
    """numpy path: queries retried with 4 × (R + 4) candidates (:func:`.certify.certify_wider`)."""
    ranked_exactly: int = 0
    """Queries ranked by the exact fallback, either path (:func:`.fallback.exact_top`)."""


_COUNTING: list[Work] = []


@contextmanager
def count_work() -> Iterator[Work]:
    """Count the work of every search inside the block into the :class:`Work` it yields."""
    work = Work()
    _COUNTING.append(work)
    try:
        yield work
    finally:
        _COUNTING.remove(work)


def add_work(what: str, amount: int) -> None:
    """Add ``amount`` to the count ``what`` (a field of :class:`Work`) of every open block."""
    for work in _COUNTING:
        setattr(work, what, getattr(work, what) + amount)
