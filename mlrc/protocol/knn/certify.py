"""The certificates of the numpy search: proofs, from float32 scores and a few exact distances,
that a query's candidates hold its exact top k.

Similarities throughout: t32 ≈ s + offset within e32_q (:mod:`.space`), s = −d/2 the exact
score (larger = nearer, :mod:`.ranking`), θ_q a bound on the t32 of every non-candidate (the
pool's final τ_q, :mod:`.pools`). The top k written is ordered by s descending, ties to the
lower index. Three certificates, cheapest first: :func:`certified_top_k` (from the float32
order, exact scores only inside near-tied runs), :func:`certify` (exact scores of all near
candidates), :func:`certify_wider` (the same with 4 × (R + 4) candidates from a full float32
row). A query none of them proves is returned to the caller for the exact fallback.
"""

from __future__ import annotations

import numpy as np

from mlrc.protocol.knn.arrays import CHUNK_BYTES, rank_within_runs
from mlrc.protocol.knn.pools import PAD_CPU, Pool
from mlrc.protocol.knn.ranking import pair_scores
from mlrc.protocol.knn.space import Factors
from mlrc.protocol.knn.work import add_work


def certified_top_k(
    f: Factors,
    block: tuple[int, int],
    pool: Pool,
    want: np.ndarray,
    tau: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """Write the certified top k = R of the block's queries into ``nbr``; return the others.

    Fast certificate, from the float32 order (candidates t_1 ≥ t_2 ≥ … by t32, e = e32_q):
    split them into runs where consecutive t32 differ by ≤ 2e; let t_end be the last of the
    run holding rank k. With t64 = s + offset (s the exact score), items of different runs are
    ordered alike in t32 and t64 (they differ by > 2e); items after that run have
    t64 < t_end − e, and if t_end > θ_q + 2e every item up to t_end has t64 > θ_q + e ≥ any
    non-candidate. Then the top k is the t32 order with each run of ≥ 2 items re-sorted by s
    (ties to the lower index): only those get s. Queries where t_end ≤ θ_q + 2e take
    :func:`certify` (s of all near candidates). Counted as ``certified_blocks``.
    """
    add_work("certified_blocks", 1)
    lo, hi = block
    q, r, t = pool.prune(want, tau)
    k = R[lo:hi]
    if len(q) == 0:
        return lo + np.flatnonzero(k > 0)
    m, rank = hi - lo, rank_within_runs(q)
    c = int(rank.max()) + 1
    T = np.full((m, c), -np.inf)
    T[q - lo, rank] = t
    C = np.full((m, c), -1, np.int32)
    C[q - lo, rank] = r
    e = f.e32[lo:hi, None]
    with np.errstate(invalid="ignore"):  # −inf − −inf in the padding: no link
        link = T[:, :-1] - T[:, 1:] <= 2 * e
    run = np.ones((m, c), np.int32)
    run[:, 1:] = ~link
    run = np.cumsum(run, axis=1, dtype=np.int32)
    rows = np.arange(m)
    end = (run <= run[rows, np.maximum(k, 1) - 1, None]).sum(1) - 1
    ok = (k > 0) & (T[rows, end] > tau[lo:hi] + 2 * e[:, 0])
    in_run = np.zeros((m, c), bool)
    in_run[:, 1:] |= link
    in_run[:, :-1] |= link
    i, j = np.nonzero(in_run & ok[:, None] & (np.arange(c) <= end[:, None]))
    if len(i):
        s = pair_scores(f.v, lo + i, C[i, j])
        C[i, j] = C[i, j][np.lexsort((C[i, j], -s, run[i, j], i))]
    good, w = np.flatnonzero(ok), min(c, nbr.shape[1])
    nbr[lo + good, :w] = C[good, :w]
    rest = np.flatnonzero((k > 0) & ~ok)
    failed = certify(f, lo + rest, C[rest], T[rest], tau[lo + rest].astype(np.float64), R, nbr)
    return certify_wider(f, failed, R, nbr)


def certify_wider(f: Factors, g: np.ndarray, R: np.ndarray, nbr: np.ndarray) -> np.ndarray:
    """:func:`certify` queries ``g`` again with 4 × (R + 4) candidates from a float32 row each.

    θ is the best t32 left out. Returns the queries still not certified. Counted as
    ``widened``.
    """
    add_work("widened", len(g))
    n = f.n
    failed = [np.empty(0, np.int64)]
    step = max(1, CHUNK_BYTES // (4 * n))
    for start in range(0, len(g), step):
        gq = g[start : start + step]
        c = min(4 * (int(R[gq].max()) + PAD_CPU), n - 2)
        if c < int(R[gq].max()):
            failed.append(gq)
            continue
        t = f.a[gq] @ f.b.T
        t[np.arange(len(gq)), gq] = -np.inf  # self
        top = np.argpartition(t, n - c - 1, axis=1)[:, n - c - 1 :]  # the c + 1 largest
        t_top = np.take_along_axis(t, top, 1).astype(np.float64)
        order = np.argsort(-t_top, axis=1, kind="stable")
        top, t_top = np.take_along_axis(top, order, 1), np.take_along_axis(t_top, order, 1)
        failed.append(certify(f, gq, top[:, :c], t_top[:, :c], t_top[:, c], R, nbr))
    return np.concatenate(failed)


def certify(
    f: Factors,
    g: np.ndarray,
    cand: np.ndarray,
    t32: np.ndarray,
    theta: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """Certify queries ``g`` from exact scores of candidates; write their top R; return the
    failures.

    ``cand``/``t32``: each query's candidates (−1: none) sorted by t32 descending; ``theta``:
    a bound on the t32 of every non-candidate. Only candidates with t32 ≥ T_k − 2·e32 get their
    exact score s (T_k: the k-th best t32, k = R): any other has s + offset < T_k − e32 ≤ that
    of each of the k candidates with t32 ≥ T_k. Then the k-th best s + offset must exceed
    θ + e32 (:mod:`.numpy_search`). Counted as ``rescored``.
    """
    add_work("rescored", len(g))
    failed = [np.empty(0, np.int64)]
    step = max(1, CHUNK_BYTES // (8 * max(1, cand.shape[1]) * f.d))
    for start in range(0, len(g), step):
        rows = slice(start, start + step)
        gq, k = g[rows], R[g[rows]]
        t_k = t32[rows][np.arange(len(gq)), k - 1]
        idx = np.where(t32[rows] >= (t_k - 2 * f.e32[gq])[:, None], cand[rows], -1)
        valid = idx >= 0
        s = np.full(idx.shape, -np.inf)
        s[valid] = pair_scores(f.v, np.broadcast_to(gq[:, None], idx.shape)[valid], idx[valid])
        s, idx = _sort_by_score_then_index(s, idx, f.n)
        kth = s[np.arange(len(gq)), k - 1] + f.offset
        ok = kth > theta[rows] + f.e32[gq]
        w = min(idx.shape[1], nbr.shape[1])
        nbr[gq[ok], :w] = idx[ok, :w]
        failed.append(gq[~ok])
    return np.concatenate(failed)


def _sort_by_score_then_index(
    s: np.ndarray, idx: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise order of (s, idx): s descending, ties by idx ascending; idx < 0 (s = −inf) last."""
    order = np.argsort(np.where(idx >= 0, idx, n), axis=1, kind="stable")
    s, idx = np.take_along_axis(s, order, 1), np.take_along_axis(idx, order, 1)
    order = np.argsort(-s, axis=1, kind="stable")
    return np.take_along_axis(s, order, 1), np.take_along_axis(idx, order, 1)
