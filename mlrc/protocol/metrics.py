"""Retrieval metrics of the metric-learning reality check, exactly as its reference code scores.

Conventions (notes/protocol-and-anchors.md §1.8):

- embeddings are L2-normalised first (``normalize=True``); neighbours are ranked by Euclidean
  distance, which on unit vectors is the same order as cosine similarity;
- exact k-nearest neighbours; the query set *is* the reference set and each query's own row is
  excluded from its neighbours (by index, so a duplicate embedding of another item still counts);
- R = number of *other* items with the query's label; queries with R = 0 are left out;
- P@1 = rel(1);  R-Precision = r/R with r the same-class items among the R nearest;
- MAP@R = (1/R) Σ_{i≤R} P(i)·rel(i) — divided by R, not by the number of hits;
- each metric is the plain mean over the kept queries (PML ``avg_of_avgs=False``);
- k = the largest class size, so no query needs more than k neighbours.

Neighbours are exact in float64 (normalisation included): a float32 candidate search is
followed by a float64 re-ranking with a proof that the candidates hold the true top k (see
``_exact_knn``); exact ties go to the lower index. faiss (and so PML) ranks in float32, which can
order near-ties of collapsed, nearly collinear embeddings differently (effect ~1e-5).

All returned values are fractions in [0, 1], as Python floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

METRICS = ("map_at_r", "precision_at_1", "r_precision")

# Bytes of one float32 similarity block (queries × references) computed at a time.
_BLOCK_BYTES = 256 * 2**20

ArrayLike = np.ndarray | torch.Tensor


def retrieval_metrics(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    normalize: bool = True,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """MAP@R, P@1 and R-Precision of ``embeddings`` (n × d) with integer ``labels`` (n,).

    ``device`` is where the k-NN search runs (default: the embeddings' device, CPU for numpy).
    The n × n similarity matrix is never materialised: queries are processed in blocks of at
    most 256 MiB of float32 similarities, so 60,000 × 512 needs well under 1 GB beyond the
    embeddings themselves. Also returns ``num_queries`` (queries with R > 0).
    """
    x = _as_tensor(embeddings, device)
    x = x if x.dtype == torch.float64 else x.float()
    y = _as_tensor(labels, x.device).long().reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"need embeddings (n, d) and labels (n,), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if not torch.isfinite(x).all():
        raise ValueError("embeddings contain NaN or infinite values")
    n, d = x.shape
    x64 = x.double()
    if normalize:
        x64 = torch.nn.functional.normalize(x64, p=2, dim=1)
    x32 = x64.float()

    _, y_idx, counts = torch.unique(y, return_inverse=True, return_counts=True)
    R_all = counts[y_idx] - 1  # other items of the query's class
    k = int(min(counts.max().item(), n - 1))
    if k < 1 or int((R_all > 0).sum()) == 0:
        raise ValueError("no query has another item of its class: metrics are undefined")

    block = max(1, _BLOCK_BYTES // (4 * n))
    sums = torch.zeros(3, dtype=torch.float64, device=x.device)
    ranks = torch.arange(1, k + 1, device=x.device, dtype=torch.float64)
    for start in range(0, n, block):
        q = torch.arange(start, min(start + block, n), device=x.device)
        nn_idx = _exact_knn(x32, x64, q, k, normalize)
        rel = (y[nn_idx] == y[q, None]).double()
        R = R_all[q].double()
        keep = R > 0
        in_R = ranks[None, :] <= R[:, None]
        hits = rel * in_R
        precision_at_i = rel.cumsum(1) / ranks[None, :]
        sums[0] += ((precision_at_i * hits).sum(1)[keep] / R[keep]).sum()  # MAP@R
        sums[1] += rel[keep, 0].sum()  # P@1
        sums[2] += (hits.sum(1)[keep] / R[keep]).sum()  # R-Precision
    num_queries = int((R_all > 0).sum())
    values = (sums / num_queries).tolist()
    out = dict(zip(METRICS, values, strict=True))
    out["num_queries"] = num_queries
    return out


_U32 = 2.0**-24  # unit roundoff of float32
_PAD = 8  # extra float32 candidates per query before the float64 re-ranking


def _score64(x64: torch.Tensor, q: torch.Tensor, r: torch.Tensor, normalize: bool) -> torch.Tensor:
    """Float64 ranking score of references ``r`` (len(q) × c indices) for queries ``q``."""
    if r.shape[1] == x64.shape[0]:  # every item: one matrix product, no gathered copy
        dot = x64[q] @ x64.T
        sq = (x64 * x64).sum(1)[None, :]
    else:
        dot = torch.bmm(x64[r], x64[q].unsqueeze(2)).squeeze(2)
        sq = (x64[r] ** 2).sum(-1)
    return dot if normalize else 2.0 * dot - sq


def _exact_knn(
    x32: torch.Tensor, x64: torch.Tensor, q: torch.Tensor, k: int, normalize: bool
) -> torch.Tensor:
    """Indices (len(q) × k) of each query's k nearest other items, exact in float64.

    Score s(q, r) = q·r on unit vectors (same order as −‖q − r‖²), else 2q·r − ‖r‖². A float32
    pass keeps the top c = k + 8 candidates; they are re-scored in float64 and sorted (ties by
    index). Why this is exact: with u = 2⁻²⁴ and γ_d = d·u/(1 − d·u), a float32 score of
    rounded inputs is within e = 2(γ_d + 3u)(2‖q‖·M + M²) of the float64 score, M = max ‖r‖
    (Higham, Accuracy and Stability, §3.1; the bound holds for any summation order). Every
    non-candidate r has s32(r) ≤ s, the lowest candidate's float32 score, so its float64 score
    is ≤ s + e. If the k-th best float64 candidate score exceeds s + e, no non-candidate can
    enter the top k. Queries where this check fails retry once with 4× more candidates, then
    are ranked over all items in float64 (one matrix product per block of such queries).
    """
    n, d = x32.shape
    dev = x32.device
    s32 = x32[q] @ x32.T
    if not normalize:
        s32 = 2.0 * s32 - (x32 * x32).sum(1)[None, :]
    s32[torch.arange(len(q), device=dev), q] = -torch.inf  # exclude self
    gamma = d * _U32 / (1 - d * _U32)
    M = x64.norm(dim=1).max()
    e = 2 * (gamma + 3 * _U32) * (2 * x64[q].norm(dim=1) * M + M * M)
    best = torch.empty(len(q), k, dtype=torch.long, device=dev)
    todo = torch.arange(len(q), device=dev)
    c = min(k + _PAD, n - 1)
    while len(todo):
        if 2 * c >= n or c > 4 * (k + _PAD):  # the rest: all items in float64 (one matmul)
            full = _score64(
                x64, q[todo], torch.arange(n, device=dev).expand(len(todo), n), normalize
            )
            full[torch.arange(len(todo), device=dev), q[todo]] = -torch.inf
            best[todo] = torch.sort(-full, dim=1, stable=True).indices[:, :k]
            break
        cand_s32, cand = s32[todo].topk(c, dim=1)
        cand = cand.sort(dim=1).values  # index order, so the stable sort breaks ties by index
        s64, order = _score64(x64, q[todo], cand, normalize).sort(
            dim=1, descending=True, stable=True
        )
        sure = s64[:, k - 1] > cand_s32[:, -1].double() + e[todo]
        best[todo[sure]] = cand.gather(1, order)[sure, :k]
        todo, c = todo[~sure], min(4 * c, n - 1)
    return best


def concatenate_embeddings(embeddings: Sequence[ArrayLike]) -> ArrayLike:
    """Concatenated ("512-D") embedding: each part L2-normalised, concatenated, normalised again.

    Accepts numpy arrays or torch tensors (all rows aligned, same items in the same order);
    returns the same kind as the first part.
    """
    if len(embeddings) == 0:
        raise ValueError("need at least one embedding array to concatenate")
    parts = [_as_tensor(e, None).float() for e in embeddings]
    rows = {p.shape[0] for p in parts}
    if len(rows) != 1:
        raise ValueError(f"embedding arrays have different numbers of rows: {sorted(rows)}")
    device = parts[0].device
    joined = torch.cat([torch.nn.functional.normalize(p.to(device), dim=1) for p in parts], dim=1)
    joined = torch.nn.functional.normalize(joined, dim=1)
    return joined.cpu().numpy() if isinstance(embeddings[0], np.ndarray) else joined


def _as_tensor(a: ArrayLike, device: str | torch.device | None) -> torch.Tensor:
    t = a.detach() if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device) if device is not None else t
