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
    x = _as_tensor(embeddings, device).float()
    y = _as_tensor(labels, x.device).long().reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"need embeddings (n, d) and labels (n,), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if not torch.isfinite(x).all():
        raise ValueError("embeddings contain NaN or infinite values")
    n = x.shape[0]
    if normalize:
        x = torch.nn.functional.normalize(x, p=2, dim=1)

    _, y_idx, counts = torch.unique(y, return_inverse=True, return_counts=True)
    R_all = counts[y_idx] - 1  # other items of the query's class
    k = int(min(counts.max().item(), n - 1))
    if k < 1 or int((R_all > 0).sum()) == 0:
        raise ValueError("no query has another item of its class: metrics are undefined")

    sq_norm = (x * x).sum(1)
    block = max(1, _BLOCK_BYTES // (4 * n))
    sums = torch.zeros(3, dtype=torch.float64, device=x.device)
    ranks = torch.arange(1, k + 1, device=x.device, dtype=torch.float64)
    for start in range(0, n, block):
        q = torch.arange(start, min(start + block, n), device=x.device)
        # −‖q − r‖² up to a per-query constant: ranks exactly as Euclidean distance
        score = 2.0 * (x[q] @ x.T) - sq_norm[None, :]
        score[torch.arange(len(q), device=x.device), q] = -torch.inf  # exclude self
        nn_idx = score.topk(k, dim=1).indices
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
