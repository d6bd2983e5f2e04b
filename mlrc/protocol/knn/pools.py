"""Candidate pools of the numpy search: per query, the best float32 candidates seen so far and
a threshold τ_q that only rises.

Triples (query, reference, t32) with t32 a float32 similarity (larger = nearer, ≈ s + offset,
:mod:`.space`). Pruning keeps each query's c_q = R_q + PAD_CPU best by t32 and raises τ_q to
the last one kept, so every triple ever dropped has t32 ≤ τ_q: the invariant the certificates
(:mod:`.certify`) need. Which of equal t32 a pool keeps is not specified: the order that
counts (exact d, ties to the lower index) is decided later, in float64.
"""

from __future__ import annotations

import numpy as np

from mlrc.protocol.knn.arrays import rank_within_runs

PAD_CPU = 4  # candidates a query keeps beyond its R (c_q = R_q + PAD_CPU)


class Pool:
    """Candidate triples (query, reference, t32) of one block of queries, int32/int32/float32.

    ``kept``: the triples that survived the last pruning, sorted by (query, t32 descending);
    ``parts``: triples added since.
    """

    def __init__(self, limit: int) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.kept = (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32))
        self.size, self.limit = 0, limit

    def add(self, q: np.ndarray, r: np.ndarray, t: np.ndarray) -> None:
        if len(q):
            self.parts.append((q.astype(np.int32), r.astype(np.int32), t))
            self.size += len(q)

    def prune(self, want: np.ndarray, tau: np.ndarray) -> tuple[np.ndarray, ...]:
        """Keep each query's ``want`` best by t32; raise ``tau`` to the last kept t32.

        Returns (q, r, t): kept triples sorted by query, then by t32 descending. Every
        dropped triple has t32 ≤ the raised tau, which is the invariant the search needs.
        New triples at or below the current tau are dropped first; the rest are sorted and
        merged into the sorted kept ones.
        """
        if self.parts:
            q, r, t = (np.concatenate(p) for p in zip(*self.parts, strict=True))
            above = t > tau[q]
            q, r, t = q[above], r[above], t[above]
            key = _query_then_descending(q, t)
            order = np.argsort(key)
            new = (q[order], r[order], t[order], key[order])
            kept = (*self.kept, _query_then_descending(self.kept[0], self.kept[2]))
            q, r, t, _ = _merge_sorted(kept, new)
            rank = rank_within_runs(q)
            last = rank == want[q] - 1
            tau[q[last]] = np.maximum(tau[q[last]], t[last])
            keep = rank < want[q]
            self.kept = (q[keep], r[keep], t[keep])
            self.parts = []
        self.size = len(self.kept[0])
        return self.kept

    def add_and_prune(
        self, q: np.ndarray, r: np.ndarray, t: np.ndarray, want: np.ndarray, tau: np.ndarray
    ) -> None:
        self.add(q, r, t)
        if self.size > self.limit:
            self.prune(want, tau)


def _merge_sorted(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Merge two tuples of equally long arrays, each sorted by its last array (the key)."""
    if len(a[-1]) == 0:
        return b
    at = np.searchsorted(a[-1], b[-1], side="right") + np.arange(len(b[-1]))
    from_b = np.zeros(len(a[-1]) + len(b[-1]), bool)
    from_b[at] = True
    merged = []
    for x, y in zip(a, b, strict=True):
        out = np.empty(len(from_b), x.dtype)
        out[at], out[~from_b] = y, x
        merged.append(out)
    return tuple(merged)


def _query_then_descending(q: np.ndarray, t: np.ndarray) -> np.ndarray:
    """uint64 sort key: query index, then float32 t from largest to smallest."""
    bits = t.view(np.uint32)
    ascending = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    return (q.astype(np.uint64) << np.uint64(32)) | (~ascending).astype(np.uint64)
