"""What the dashboard's retrieval view shows, computed from test embeddings while they exist:
sample queries with their k nearest other items, and a 2-D map of the embeddings.

- :func:`sample_queries`: ``n`` query rows spread over the classes (one per class, classes in a
  seeded random order, a class again only when there are fewer classes than queries);
- :func:`sample_retrievals`: those queries and their k nearest other rows, exact, by the same
  ranking as the metrics (:func:`mlrc.protocol.knn.exact_knn`: L2-normalised float64 rows,
  ascending squared distance, the query itself excluded, ties to the lower index);
- :func:`embedding_map`: 2-D coordinates of (a seeded subsample of) the rows: UMAP when the
  ``umap`` package is installed, else PCA (scikit-learn), of the L2-normalised rows;
- :func:`retrieval_view`: the three together as the JSON the store keeps
  (``mlrc_retrieval_view.data``), rows mapped to dataset indices and class labels.

Everything is seeded by ``seed`` (an int or a sequence of ints, e.g. (study seed, reproduction)):
the same inputs give the same view.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import numpy as np
import torch

from mlrc.protocol.knn import exact_knn, ranked_vectors

Seed = int | Sequence[int]

__all__ = ["embedding_map", "retrieval_view", "sample_queries", "sample_retrievals"]


def sample_queries(labels: np.ndarray, n: int, seed: Seed) -> np.ndarray:
    """``min(n, len(labels))`` distinct row indices: one per class, the classes in a seeded random
    order, then round again while queries are missing (classes whose rows are all taken are
    skipped). Each row is drawn at random within its class."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes = rng.permutation(np.unique(labels))
    free = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    n = min(int(n), len(labels))
    out: list[int] = []
    while len(out) < n:
        for c in classes:
            if free[int(c)] and len(out) < n:
                out.append(int(free[int(c)].pop()))
    return np.asarray(out, dtype=np.int64)


def sample_retrievals(
    emb: np.ndarray, labels: np.ndarray, n_queries: int = 8, k: int = 5, seed: Seed = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(queries, neighbours): ``queries`` (q,) rows from :func:`sample_queries`, ``neighbours``
    (q × k') the k' = min(k, n − 1) nearest other rows of each, nearest first (exact: L2-normalised
    float64 rows, ascending squared distance, ties to the lower index)."""
    emb = np.asarray(emb)
    if emb.ndim != 2 or len(emb) != len(labels) or len(emb) < 2:
        raise ValueError(f"need n ≥ 2 embeddings (n, d) and n labels, got {emb.shape}")
    if not np.isfinite(emb).all():
        raise ValueError("embeddings contain NaN or infinite values")
    queries = sample_queries(labels, n_queries, seed)
    k = min(int(k), len(emb) - 1)
    x64 = ranked_vectors(torch.from_numpy(np.ascontiguousarray(emb)), normalize=True)
    nbr = exact_knn(x64.float(), x64, torch.from_numpy(queries), k, normalize=True)
    return queries, np.asarray(nbr.cpu().numpy(), dtype=np.int64)


def embedding_map(
    emb: np.ndarray, seed: Seed = 0, max_points: int = 2000, method: str | None = None
) -> tuple[np.ndarray, np.ndarray, str]:
    """(rows, xy, method): at most ``max_points`` rows (a seeded subsample, in ascending order;
    all rows when there are fewer), their 2-D coordinates (len(rows) × 2, float64) and the method
    used: ``umap`` when the package is installed, else ``pca`` (``method`` forces one). The rows
    are L2-normalised first, as the retrieval ranks them."""
    emb = np.asarray(emb, dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows = np.arange(len(emb))
    if len(emb) > max_points:
        rows = np.sort(rng.choice(len(emb), size=max_points, replace=False))
    x = emb[rows]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.where(norms > 0, norms, 1.0)
    method = method or ("umap" if importlib.util.find_spec("umap") is not None else "pca")
    state = int(rng.integers(2**31 - 1))
    if len(x) < 3:  # too few points to project: lay them out on a line
        return rows, np.column_stack([np.arange(len(x), dtype=np.float64), np.zeros(len(x))]), "pca"
    if method == "umap":
        import umap

        neighbours = min(15, len(x) - 1)
        xy = umap.UMAP(n_components=2, n_neighbors=neighbours, random_state=state).fit_transform(x)
    elif method == "pca":
        from sklearn.decomposition import PCA

        xy = PCA(n_components=2, svd_solver="full", random_state=state).fit_transform(x)
    else:
        raise ValueError(f"unknown map method {method!r} (umap or pca)")
    return rows, np.asarray(xy, dtype=np.float64), method


def retrieval_view(
    emb: np.ndarray,
    labels: np.ndarray,
    indices: np.ndarray,
    names: Sequence[str] | None = None,
    *,
    n_queries: int = 8,
    k: int = 5,
    max_points: int = 2000,
    seed: Seed = 0,
) -> dict:
    """The stored view (``mlrc_retrieval_view.data``) of embeddings ``emb`` (n × d) whose rows are
    the dataset items ``indices`` (n,) of classes ``labels`` (n,, dataset class labels; ``names``:
    class label → name, optional): ``{"k", "n", "queries": [{"index", "label", "name",
    "neighbours": [{"index", "label", "name", "same"}, ...]}, ...], "map": {"method", "index",
    "x", "y", "label"}}``. Map coordinates are rounded to 4 decimals; plain JSON types only."""
    labels = np.asarray(labels, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if len(labels) != len(emb) or len(indices) != len(emb):
        raise ValueError(f"{len(emb)} embeddings, {len(labels)} labels, {len(indices)} indices")
    queries, nbr = sample_retrievals(emb, labels, n_queries, k, seed=_child(seed, 0))
    rows, xy, method = embedding_map(emb, seed=_child(seed, 1), max_points=max_points)

    def item(row: int) -> dict:
        label = int(labels[row])
        name = str(names[label]) if names is not None else str(label)
        return {"index": int(indices[row]), "label": label, "name": name}

    return {
        "k": int(nbr.shape[1]),
        "n": len(emb),
        "queries": [
            {
                **item(q),
                "neighbours": [
                    {**item(r), "same": bool(labels[r] == labels[q])} for r in nbr[i].tolist()
                ],
            }
            for i, q in enumerate(queries.tolist())
        ],
        "map": {
            "method": method,
            "index": indices[rows].tolist(),
            "x": [round(float(v), 4) for v in xy[:, 0]],
            "y": [round(float(v), 4) for v in xy[:, 1]],
            "label": labels[rows].tolist(),
        },
    }


def _child(seed: Seed, part: int) -> list[int]:
    """An independent seed for one part of the view."""
    return [*(seed if isinstance(seed, Sequence) else [seed]), part]
