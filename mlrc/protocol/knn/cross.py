"""Query → reference search: each query's k nearest reference rows, exact, ties to lower index.

The ranking is the one of the whole package (:mod:`.ranking`): the ranked vectors v (float64,
L2-normalised with ``normalize``), the distance d(q, r) = Σ_k (v_qk − v_rk)² as a plain float64
loop, ties to the lower reference index; so a query set searched against itself with its own
row excluded gives exactly :func:`mlrc.protocol.knn.exact_neighbours`' neighbours.

How, per block of queries (torch, on the vectors' device): the float64 estimate
d̂ = ‖q‖² + ‖r‖² − 2 q·r (a matmul) is within e_q = 4·γ_{d+5}·(‖q‖ + max_r ‖r‖)² of d (Higham's
bound for both; the factor 2 is a safety margin). The k-th smallest d̂ + e_q bounds the k-th
smallest d from above, so every reference item with d̂ − e_q above it is out; the rest are
sorted by d̂, and runs of consecutive items closer than 2·e_q (where d̂ cannot decide) are
ordered by the exact d, then by index. Memory: blocks of at most 64 MiB of float64 estimates.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from mlrc.protocol.knn.arrays import U64, as_torch, backend_array, gamma
from mlrc.protocol.knn.ranking import ranked_vectors, sq_dist

_BLOCK_BYTES = 64 * 2**20  # float64 estimates of one block of queries
_PAIR_BYTES = 16 * 2**20  # float64 temporaries of one chunk of exact distances


def cross_neighbours(
    query: torch.Tensor,
    reference: torch.Tensor,
    k: int,
    *,
    normalize: bool,
    own_rows: bool,
    rows: np.ndarray | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each query's k nearest reference rows (module docstring), in blocks of queries.

    ``query`` (m × d) and ``reference`` (n × d): finite float32/float64 tensors on one device;
    ``own_rows``: query i is reference row i (PML's ``ref_includes_query``: the first m rows of
    the reference are the queries), excluded from its neighbours by index. ``k`` ≥ 1 is capped
    at the reference rows available (n, or n − 1 with ``own_rows``). Yields ``(queries, nbr)``:
    numpy int64 query indices and ``nbr[i, j]``, the (j + 1)-th nearest reference row of query
    ``queries[i]``; every query once (or every one of ``rows``, query indices), in order.
    """
    vq = ranked_vectors(query, normalize=normalize)
    vr = ranked_vectors(reference, normalize=normalize)
    m, n = vq.shape[0], vr.shape[0]
    k = min(int(k), n - int(own_rows))
    if k < 1:
        raise ValueError("the reference set has no row a query may retrieve")
    norm_r = vr.square().sum(1)
    radius = float(norm_r.max().sqrt()) if n else 0.0
    step = max(1, _BLOCK_BYTES // (8 * max(n, 1)))
    wanted = np.arange(m) if rows is None else np.asarray(rows, dtype=np.int64)
    for lo in range(0, len(wanted), step):
        block = torch.from_numpy(wanted[lo : lo + step]).to(vr.device)
        yield wanted[lo : lo + step], _block(vq, vr, norm_r, radius, block, k, own_rows)


def _block(
    vq: torch.Tensor,
    vr: torch.Tensor,
    norm_r: torch.Tensor,
    radius: float,
    rows: torch.Tensor,
    k: int,
    own_rows: bool,
) -> np.ndarray:
    """The k nearest reference rows of the queries ``rows`` (len(rows) × k numpy int64)."""
    q = vq[rows]
    norm_q = q.square().sum(1)
    estimate = norm_q[:, None] + norm_r[None, :] - 2.0 * (q @ vr.T)  # d̂
    err = 4.0 * gamma(vq.shape[1] + 5, U64) * (norm_q.sqrt() + radius) ** 2 + 1e-300
    if own_rows:
        estimate[torch.arange(len(rows), device=rows.device), rows] = torch.inf
    bound = torch.kthvalue(estimate + err[:, None], k, dim=1).values
    cand_q, cand_r = torch.nonzero(estimate - err[:, None] <= bound[:, None], as_tuple=True)
    est = estimate[cand_q, cand_r]
    order = _stable_argsort(est)
    order = order[_stable_argsort(cand_q[order])]  # by query, then d̂, then index
    cand_q, cand_r, est = cand_q[order], cand_r[order], est[order]
    start = torch.ones_like(cand_q, dtype=torch.bool)
    start[1:] = (cand_q[1:] != cand_q[:-1]) | (est[1:] - est[:-1] > 2.0 * err[cand_q[1:]])
    run = torch.cumsum(start.long(), 0)
    undecided = torch.bincount(run)[run] > 1
    exact = torch.zeros_like(est)
    exact[undecided] = _exact_distances(vq, vr, rows[cand_q[undecided]], cand_r[undecided])
    order = _stable_argsort(cand_r)  # by run (so query, d̂), then exact d, then index
    order = order[_stable_argsort(exact[order])]
    order = order[_stable_argsort(run[order])]
    cand_q, cand_r = cand_q[order].cpu().numpy(), cand_r[order].cpu().numpy()
    starts = np.flatnonzero(np.r_[True, cand_q[1:] != cand_q[:-1]])
    rank = np.arange(len(cand_q)) - np.repeat(starts, np.diff(np.r_[starts, len(cand_q)]))
    keep = rank < k
    nbr = np.empty((len(rows), k), dtype=np.int64)
    nbr[cand_q[keep], rank[keep]] = cand_r[keep]
    return nbr


def _stable_argsort(key: torch.Tensor) -> torch.Tensor:
    return torch.sort(key, stable=True).indices


def _exact_distances(
    vq: torch.Tensor, vr: torch.Tensor, qi: torch.Tensor, ri: torch.Tensor
) -> torch.Tensor:
    """d(q_i, r_i) of the pairs (1-D index tensors), the ranking's exact float64 loop."""
    a, b = backend_array(vq), backend_array(vr)
    qi_b, ri_b = backend_array(qi), backend_array(ri)
    step = max(1, _PAIR_BYTES // (24 * max(vq.shape[1], 1)))
    parts = [
        sq_dist(a[qi_b[p : p + step]], b[ri_b[p : p + step]]) for p in range(0, len(qi_b), step)
    ]
    if not parts:
        return vq.new_empty(0)
    out = np.concatenate(parts) if isinstance(a, np.ndarray) else torch.cat(parts)
    return as_torch(out).to(vq.device)
