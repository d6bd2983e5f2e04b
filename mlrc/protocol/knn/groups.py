"""Identical rows, found once: the groups of equal ranked vectors, and float64 scores between
the distinct vectors for the exact fallback (:mod:`.fallback`).

Identical ranked vectors are at the same distance from every item, so they tie with everyone
alike: the exact ranking scores each distinct vector once and lists a group's items by index
(ties to the lower index). Scores here are similarities t ≈ s = −d/2 (larger = nearer) with a
proven error bound e64; they only pick candidates, the order comes from the exact d.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlrc.protocol.knn.arrays import CHUNK_BYTES, U64, gamma


@dataclass
class Groups:
    """Items grouped by identical ranked vector (numpy int64): identical rows tie with everyone
    alike, so the exact ranking scores each distinct vector once."""

    group: np.ndarray  # (n,) group of each item
    members: np.ndarray  # (n,) items sorted by (group, index)
    starts: np.ndarray  # (U,) where each group's members begin in ``members``
    counts: np.ndarray  # (U,) items per group

    @property
    def reps(self) -> np.ndarray:
        """(U,) each group's lowest item."""
        return self.members[self.starts]


@dataclass
class Approx:
    """Float64 scores of the distinct vectors relative to their mean, for the exact fallback.

    t(g, h) = w_g·w_h − ‖w_g‖²/2 − ‖w_h‖²/2 with w = v − mean (rounded), computed by matrix
    products: |t − s| ≤ e64_g for the exact score s = −d/2 (bound in :func:`approx`).
    """

    w: np.ndarray  # U × d float64
    half_sq: np.ndarray  # (U,) ‖w‖²/2
    e64: np.ndarray  # (U,) bound per query group


def row_groups(v: np.ndarray) -> Groups:
    """Groups of identical rows of v (the ranked vectors, n × d): a 64-bit hash of each
    vector's bits, checked against the vectors (a collision falls back to comparing bytes)."""
    n, d = v.shape
    v = np.ascontiguousarray(v)
    keys = np.random.default_rng(0).integers(0, 2**63, d, dtype=np.uint64) * 2 + 1
    step = max(1, CHUNK_BYTES // (8 * d))
    h = np.concatenate(  # Σ_k bits_k·key_k modulo 2⁶⁴ (uint64 arithmetic wraps)
        [(v[lo : lo + step].view(np.uint64) * keys).sum(1) for lo in range(0, n, step)]
    )
    _, group = np.unique(h, return_inverse=True)
    counts = np.bincount(group)
    members = np.argsort(group, kind="stable")
    starts = np.cumsum(counts) - counts
    shared = np.flatnonzero(counts[group] > 1)  # rows whose hash another row has
    if not np.array_equal(v[shared], v[members[starts][group[shared]]]):  # a hash collision
        rows = v.view(np.dtype((np.void, 8 * d))).reshape(n)
        _, group = np.unique(rows, return_inverse=True)
        counts = np.bincount(group)
        members = np.argsort(group, kind="stable")
        starts = np.cumsum(counts) - counts
    return Groups(group.reshape(n).astype(np.int64), members, starts, counts)


def approx(w_rows: np.ndarray) -> Approx:
    """:class:`Approx` of the distinct vectors ``w_rows`` (U × d, before centring).

    Bound: with β_g = (‖w_g‖ + max‖w‖)²/2, the matrix product errs by ≤ γ_d·2β, each ‖w‖²/2
    by ≤ γ_d·β, the two subtractions and the rounding of w by ≤ 8·2⁻⁵³β, the exact d by
    ≤ γ_{d+2}·β: all below e64 = 16γ_{d+3}(2⁻⁵³)β (+ d·2⁻¹⁰⁰⁰ for subnormals).
    """
    d = w_rows.shape[1]
    w = w_rows - w_rows.mean(0)
    half_sq = (w * w).sum(1) / 2
    norm = np.sqrt(2 * half_sq)
    beta = (norm + norm.max()) ** 2 / 2 * (1.0 + 2.0**-40)
    return Approx(w, half_sq, 16 * gamma(d + 3, U64) * beta + d * 2.0**-1000)
