"""The exact fallback: queries the float32 search cannot certify — ties at the boundary of
their candidates, many exact copies, float32 overflow, mostly duplicated rows — ranked in
float64 directly.

Each distinct vector (:mod:`.groups`) is scored against the distinct vectors once, so identical
rows cost one ranking between them; float64 similarities t (larger = nearer, within e64 of
s = −d/2) pick the candidate groups, the exact d (:mod:`.ranking`) orders them, and a group's
items follow by index: ties to the lower index, the query's own row skipped. Numpy, on the CPU
copy of the ranked vectors, whichever device the search runs on.
"""

from __future__ import annotations

import numpy as np

from mlrc.protocol.knn.arrays import rank_within_runs
from mlrc.protocol.knn.ranking import pair_scores
from mlrc.protocol.knn.space import Space
from mlrc.protocol.knn.tuning import current_tuning
from mlrc.protocol.knn.work import add_work

DISTINCT_SHARE = 0.25  # at most this share of distinct rows: rank all queries exactly at once


def rank_all_exactly(space: Space) -> bool:
    """True where the float32 search could prove almost nothing: its scores could overflow,
    or at most DISTINCT_SHARE of the rows are distinct (identical or duplicated inputs)."""
    return not space.fits32 or space.distinct <= DISTINCT_SHARE * space.n


def exact_top(space: Space, queries: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Exact top k[i] of each query (len(queries) × max k int64, −1 beyond k[i]), ties to the
    lower index. Numpy, on the CPU copy of the ranked vectors.

    Queries with the same ranked vector share one ranking of all items (their own included):
    ``_group_lists`` gives each such group its best max k + 1, and each query takes them in
    order, skipping itself. Blocks of at most ``block_bytes`` / 48 bytes per item of groups
    (:mod:`.tuning`). Counted as ``ranked_exactly`` (:mod:`.work`).
    """
    add_work("ranked_exactly", len(queries))
    groups = space.groups
    out = np.full((len(queries), int(k.max())), -1, np.int64)
    query_groups, inv = np.unique(groups.group[queries], return_inverse=True)
    inv = inv.reshape(-1)
    K = np.zeros(len(query_groups), np.int64)
    np.maximum.at(K, inv, k + 1)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(query_groups) + 1))
    block = max(1, current_tuning().block_bytes // (48 * space.n))
    for b0 in range(0, len(query_groups), block):
        b1 = min(b0 + block, len(query_groups))
        lists = _group_lists(space, query_groups[b0:b1], K[b0:b1])
        sel = order[bounds[b0] : bounds[b1]]  # the queries of these groups
        ranked = lists[inv[sel] - b0]
        keep = (ranked >= 0) & (ranked != queries[sel, None])
        rank = keep.cumsum(1) - 1
        i, j = np.nonzero(keep & (rank < k[sel, None]))
        out[sel[i], rank[i, j]] = ranked[i, j]
    return out


def _group_lists(space: Space, gid: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Best K[i] items of the ranking from group gid[i]'s vector (m × max K, −1 padded).

    Float64 scores t of the group against every distinct vector (``Approx``, |t − s| ≤ e64)
    pick the candidates: τ = the K-th best t (each group has ≥ 1 item, so the K best groups
    hold ≥ K items) and every group with t ≥ τ − 2e64; any other group has s < τ − e64 ≤ s of
    each of those K groups, so none of its items can place. Candidates get their exact score
    s; their items (at most K per group, the lowest indices) are sorted by s descending, then
    index, and the first K kept.
    """
    groups, approx = space.groups, space.approx
    U = len(groups.starts)
    t = approx.w[gid] @ approx.w.T
    t -= approx.half_sq[gid, None]
    t -= approx.half_sq[None, :]
    kc = min(int(K.max()), U)
    best = -np.sort(-np.partition(t, U - kc, axis=1)[:, U - kc :], axis=1)  # kc best, sorted
    tau = best[np.arange(len(gid)), np.minimum(K, kc) - 1]
    tau[K > U] = -np.inf  # fewer groups than K: all of them
    i, h = np.nonzero(t >= (tau - 2 * approx.e64[gid])[:, None])
    reps = groups.reps
    s = pair_scores(space.v_np, reps[gid[i]], reps[h])
    take = np.minimum(groups.counts[h], K[i])  # a group's lowest-index items come first
    pair = np.repeat(np.arange(len(i)), take)
    within = np.arange(len(pair)) - np.repeat(np.cumsum(take) - take, take)
    r = groups.members[groups.starts[h][pair] + within]
    row = i[pair]
    order = np.lexsort((r, -s[pair], row))  # by row, s descending, index
    row, r = row[order], r[order]
    rank = rank_within_runs(row)
    keep = rank < K[row]
    lists = np.full((len(gid), int(K.max())), -1, np.int64)
    lists[row[keep], rank[keep]] = r[keep]
    return lists
