"""The torch search: blocks of queries against all items in float32 on the device, a certificate per
query, the exact fallback for the rest. ``exact_knn`` runs it on every device, ``exact_neighbours``
on every device but the CPU (there too when :mod:`.tuning` asks).

Float32 similarities t32 = a_q·b_r ≈ s + offset (larger = nearer, :mod:`.space`) under
:func:`~.arrays.full_fp32_matmul`, the exact scores s = −d/2 of the candidates on the device
(:mod:`.ranking`), sorted stably so ties go to the lower index. Queries the certificate cannot
prove, and all queries of a mostly duplicated or float32-overflowing set, are ranked by the
exact fallback (:mod:`.fallback`, on the CPU) and copied back.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from mlrc.protocol.knn.arrays import full_fp32_matmul
from mlrc.protocol.knn.fallback import exact_top, rank_all_exactly
from mlrc.protocol.knn.ranking import pair_scores
from mlrc.protocol.knn.space import Space
from mlrc.protocol.knn.tuning import current_tuning

_PAD = 8  # extra float32 candidates per query before the exact re-ranking


def blocks_torch(space: Space, k: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``exact_neighbours`` with torch on the space's device, every query to max k_q + 1
    (PML's k = the largest class size when k_q = R_q), blocks of ``block_bytes`` of scores."""
    n, device = space.n, space.v.device
    k_all = int(min(int(k.max()) + 1, n - 1))
    block = max(1, current_tuning().block_bytes // (4 * n))
    # few distinct rows, or float32 could overflow: all exactly at once
    at_once = rank_all_exactly(space)
    for start in range(0, n, block):
        q = torch.arange(start, min(start + block, n), device=device)
        nn_idx = _exact_top_torch(space, q, k_all) if at_once else knn_block(space, q, k_all)
        yield q.cpu().numpy(), nn_idx.cpu().numpy()


def knn_block(space: Space, q: torch.Tensor, k: int) -> torch.Tensor:
    """``exact_knn`` of queries ``q`` (len(q) × k) in a prepared space.

    A float32 pass keeps the top c = k + 8 candidates and θ, the best float32 score left out;
    the candidates get their exact score s and are sorted (ties by index). Exact if the k-th
    best s + offset exceeds θ + e32_q: every non-candidate has s + offset ≤ θ + e32_q
    (:mod:`.space`). Queries where this fails retry once with 4× more candidates, then take
    the exact fallback.
    """
    n, dev = space.n, q.device
    if not space.fits32:
        return _exact_top_torch(space, q, k)
    with full_fp32_matmul():  # e32 bounds IEEE float32 products and sums
        t = space.a[q] @ space.b.T
    t[torch.arange(len(q), device=dev), q] = -torch.inf  # exclude self
    best = torch.empty(len(q), k, dtype=torch.long, device=dev)
    todo = torch.arange(len(q), device=dev)
    c = min(k + _PAD, n - 1)
    for _ in range(2):
        t32, cand = t[todo].topk(c + 1, dim=1)  # c + 1 ≤ n; self (−inf) is last if c = n − 1
        cand, theta = cand[:, :c].sort(dim=1).values, t32[:, c].double()  # index order
        qs = q[todo, None].expand(-1, c)
        s = pair_scores(space.v, qs.reshape(-1), cand.reshape(-1)).reshape(cand.shape)
        s, order = s.sort(dim=1, descending=True, stable=True)  # ties: index order
        sure = s[:, k - 1] + space.offset > theta + space.e32[q[todo]]
        best[todo[sure]] = cand.gather(1, order)[sure, :k]
        todo, c = todo[~sure], min(4 * c, n - 1)
        if len(todo) == 0:
            return best
    best[todo] = _exact_top_torch(space, q[todo], k)
    return best


def _exact_top_torch(space: Space, q: torch.Tensor, k: int) -> torch.Tensor:
    """The exact fallback's top k of queries q (a tensor), on q's device."""
    top = exact_top(space, q.cpu().numpy(), np.full(len(q), k, np.int64))
    return torch.from_numpy(top).to(q.device)
