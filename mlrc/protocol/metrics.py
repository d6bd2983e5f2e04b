"""Retrieval metrics of the metric-learning reality check, exactly as its reference code scores.

Musgrave, Belongie & Lim, "A Metric Learning Reality Check" (ECCV 2020), as PML's
``AccuracyCalculator`` computes them; the definitions as recorded in
notes/protocol-and-anchors.md §1.8 ("MLRC §1.8" below). For each query q:

- embeddings are L2-normalised first (``normalize=True``); neighbours are ranked by Euclidean
  distance, which on unit vectors is the same order as cosine similarity;
- exact k-nearest neighbours (:mod:`mlrc.protocol.knn`); the query set *is* the reference set
  and q's own row is excluded from its neighbours (by index, so a duplicate embedding of
  another item still counts); exact ties go to the lower index;
- R = number of *other* items with q's label; queries with R = 0 are left out;
- rel(i) = 1 if q's i-th nearest neighbour has q's label, else 0; P(i) = (1/i) Σ_{j≤i} rel(j);
- P@1 = rel(1);  R-Precision = r/R with r = Σ_{i≤R} rel(i);
- MAP@R = (1/R) Σ_{i≤R} P(i)·rel(i) — divided by R, not by the number of hits;
- each metric is the plain mean over the kept queries (PML ``avg_of_avgs=False``);
- only ranks ≤ R are read, so a query needs at most its R nearest neighbours (PML: k = the
  largest class size).

All returned values are fractions in [0, 1], as Python floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mlrc.protocol.knn import ArrayLike, check_embeddings, exact_neighbours, to_tensor

METRICS = ("map_at_r", "precision_at_1", "r_precision")


def retrieval_metrics(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    normalize: bool = True,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """MAP@R, P@1 and R-Precision of ``embeddings`` (n × d) with integer ``labels`` (n,).

    ``device`` is where the k-NN search runs (default: the embeddings' device, CPU for numpy).
    Neighbours are ranked by the float64 squared Euclidean distance of the (normalised) rows,
    ties to the lower index (:mod:`mlrc.protocol.knn`); the result is the same on every device.
    The n × n distance matrix is never materialised: besides a float64 copy of the embeddings
    and a float32 one (two without ``normalize`` or for collapsed embeddings), the CPU (numpy)
    search walks the upper triangle of 2048 × 2048 float32 tiles and needs a GEMM buffer no
    larger than the float32 copy and a few tens of bytes per (query, needed neighbour);
    elsewhere (torch) queries are processed in blocks of at most 256 MiB of float32 scores.
    Also returns ``num_queries`` (queries with R > 0).
    """
    x = to_tensor(embeddings, device)
    if isinstance(labels, torch.Tensor) and not (labels.is_floating_point() or labels.is_complex()):
        y = labels.detach().to(x.device).long().reshape(-1)  # integers: no read-back to check
    else:
        y = torch.from_numpy(integer_labels(labels, "labels")).to(x.device)
    x = x if x.dtype in (torch.float32, torch.float64) else x.double()
    check_embeddings(x, y)
    _, y, class_sizes = torch.unique(y, return_inverse=True, return_counts=True)  # y: class id
    R = (class_sizes[y] - 1).cpu().numpy()  # other items of the query's class
    num_queries = int((R > 0).sum())
    if num_queries == 0:
        raise ValueError("no query has another item of its class: metrics are undefined")
    y = y.cpu().numpy()
    sums = np.zeros(3)
    for q, nbr in exact_neighbours(x, R, normalize=normalize):
        sums += _metric_sums(y[nbr] == y[q, None], R[q])
    out = dict(zip(METRICS, (sums / num_queries).tolist(), strict=True))
    out["num_queries"] = num_queries
    return out


def integer_labels(labels: ArrayLike, what: str = "labels") -> np.ndarray:
    """``labels`` (n,) as a numpy int64 array; a ``ValueError`` in one line unless every value is
    an integer (class ids). Integer and boolean arrays pass; a float array passes only if every
    value is a whole number (``2.0``), since casting ``0.01 … 0.04`` would silently make one
    class of them; anything else (strings, objects, NaN) is refused."""
    a = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    a = a.reshape(-1)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.round(a)) | (np.abs(a) > 2.0**53)
        if not bad.any():
            return a.astype(np.int64)
        raise ValueError(
            f"{what} must be integer class ids, got {float(a[bad][0])!r} ({a.dtype}, "
            f"{int(bad.sum())} of {a.size} values not whole numbers)"
        )
    raise ValueError(f"{what} must be integer class ids, got dtype {a.dtype}")


def _metric_sums(rel: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Sums over the queries with R > 0 of (AP@R, P@1, R-Precision), float64 array of 3.

    ``rel`` (m × k bool, k ≥ every R): relevance of each query's ranks 1..k; ranks beyond R
    are ignored.
    """
    keep = R > 0
    rel, R = rel[keep].astype(np.float64), R[keep].astype(np.float64)
    return np.array(
        [
            average_precision_at_r(rel, R).sum(),
            precision_at_1(rel).sum(),
            r_precision(rel, R).sum(),
        ]
    )


def precision_at_1(rel: np.ndarray) -> np.ndarray:
    """P@1 = rel(1) of each query: 1.0 if its nearest other item shares its label, else 0.0.

    ``rel``: (m × k) relevance of each query's ranks 1..k, float64 0/1, k ≥ 1.
    """
    return rel[:, 0]  # MLRC §1.8: P@1 = rel(1)


def r_precision(rel: np.ndarray, R: np.ndarray) -> np.ndarray:
    """R-Precision = r/R of each query, a fraction in [0, 1]: r = same-label items among its R
    nearest.

    ``rel``: (m × k) relevance of ranks 1..k, float64 0/1, k ≥ max R; ``R``: (m,) float64 > 0,
    the other items of each query's class.
    """
    return _hits_within_r(rel, R).sum(1) / R  # MLRC §1.8: R-Precision = r/R


def average_precision_at_r(rel: np.ndarray, R: np.ndarray) -> np.ndarray:
    """AP@R of each query, a fraction in [0, 1]; MAP@R is its mean over queries.

    AP@R = (1/R) Σ_{i≤R} P(i)·rel(i), P(i) = (1/i) Σ_{j≤i} rel(j): divided by R, not by the
    number of hits, so a relevant item missed in the top R counts as 0. Arguments as
    :func:`r_precision`.
    """
    ranks = np.arange(1, rel.shape[1] + 1, dtype=np.float64)
    precision_at_i = rel.cumsum(1) / ranks[None, :]  # P(i)
    # MLRC §1.8: AP@R = (1/R) Σ_{i≤R} P(i)·rel(i)
    return (precision_at_i * _hits_within_r(rel, R)).sum(1) / R


def _hits_within_r(rel: np.ndarray, R: np.ndarray) -> np.ndarray:
    """rel(i)·𝟙[i ≤ R] (m × k float64): the relevance of ranks 1..R, zero beyond."""
    ranks = np.arange(1, rel.shape[1] + 1, dtype=np.float64)
    return rel * (ranks[None, :] <= R[:, None])


def concatenate_embeddings(embeddings: Sequence[ArrayLike]) -> ArrayLike:
    """Concatenated ("512-D") embedding: each part L2-normalised, concatenated, normalised again.

    Accepts numpy arrays or torch tensors (all rows aligned, same items in the same order);
    returns the same kind as the first part.
    """
    if len(embeddings) == 0:
        raise ValueError("need at least one embedding array to concatenate")
    parts = [to_tensor(e, None).float() for e in embeddings]
    rows = {p.shape[0] for p in parts}
    if len(rows) != 1:
        raise ValueError(f"embedding arrays have different numbers of rows: {sorted(rows)}")
    device = parts[0].device
    joined = torch.cat([torch.nn.functional.normalize(p.to(device), dim=1) for p in parts], dim=1)
    joined = torch.nn.functional.normalize(joined, dim=1)
    return joined.cpu().numpy() if isinstance(embeddings[0], np.ndarray) else joined
