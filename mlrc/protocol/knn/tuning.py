"""The search's tuning: which backend ranks CPU tensors, and the sizes of its blocks and tiles.

None of these settings changes a result: every value gives the same exact ranking (ranks ≤ k_q;
see :mod:`mlrc.protocol.knn`). They set how the work is cut up, so tests use them to reach every
code path on a few hundred items (the torch path on CPU, several tiles and pool prunings, many
blocks) and benchmarks to measure the trade-offs. Process-wide, like torch's own settings:
read the tuning in force with :func:`current_tuning`, change it for a block with :func:`tuned`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class Tuning:
    """How the exact k-NN search cuts up its work (the defaults are the measured best)."""

    cpu_backend: Literal["numpy", "torch"] = "numpy"
    """What ranks CPU tensors: numpy BLAS over the upper triangle of the score matrix
    (:mod:`.numpy_search`), or the torch path that other devices take (:mod:`.torch_search`)."""
    block_bytes: int = 256 * 2**20
    """Bytes of one float32 score block (queries × references) computed at a time: the torch
    path's blocks of queries, and the exact ranking's blocks of groups (:mod:`.fallback`)."""
    tile: int = 2048
    """numpy path: rows (= columns) of one float32 score tile, and the most rows of one GEMM."""
    strip: int = 512
    """numpy path: rows of a tile compared with the thresholds at a time."""
    pool_slack: int = 2**15
    """numpy path: triples a pool of candidates may hold beyond Σc_q before it is pruned."""
    dense_per_candidate: int = 100
    """numpy path: one full-width tile if n ≤ this × the mean c_q (candidates per query)."""


_CURRENT = Tuning()


def current_tuning() -> Tuning:
    """The tuning in force."""
    return _CURRENT


@contextmanager
def tuned(**changes: object) -> Iterator[Tuning]:
    """The tuning in force with ``changes`` (fields of :class:`Tuning`) inside the block, the
    previous one restored after it; yields the new tuning. ``tuned(cpu_backend="torch")`` runs
    the CUDA path on CPU tensors."""
    global _CURRENT
    before = _CURRENT
    _CURRENT = replace(before, **changes)
    try:
        yield _CURRENT
    finally:
        _CURRENT = before
