"""Embedding-space analysis metrics of Roth et al. 2020 (Revisiting DML) and Metrix (Venkataramanan
et al. 2022): Recall@k, NMI, mAP@1000, spectral decay ρ(Φ), density π_ratio and utilization.

Sources: notes/000-revisiting.md §5–§6 and notes/003-metrix.md §4, checked against the papers in
shared/seeds/ (000, 003) and the Revisiting reference code (github.com/Confusezius/
Revisiting_Deep_Metric_Learning_PyTorch, ``metrics/*.py``). Each function says which equation or
code it follows and what it chose where paper and code disagree.

Conventions, shared with :mod:`mlrc.protocol.metrics` and :mod:`mlrc.protocol.knn`:

- inputs are numpy arrays or torch tensors, embeddings (n × d) and integer labels (n,): labels
  that are not whole numbers are refused in one line (``metrics.integer_labels``);
- ``normalize=True`` L2-normalises the embeddings first (in float64). The Revisiting code computes
  every metric on the model's output, which its architectures L2-normalise, so ``True`` reproduces
  it for raw embeddings;
- neighbour searches are exact in float64: the query set *is* the reference set, each query's own
  row is excluded by index (a duplicate of another item still counts), exact ties go to the lower
  index (``knn.exact_knn`` for small k, direct float64 scores for mAP@1000's k = 1000).
  Queries are processed in blocks of ≤ 256 MiB, so 60,000 × 512 fits in well under 1 GB beyond
  the embeddings;
- every returned value is a Python float; rates are fractions in [0, 1], not percent.

Which set to pass: the Revisiting paper computes Recall@k, NMI and mAP@1000 on the *test* set, but
ρ(Φ) and π_ratio on the *training* set embeddings (notes/000 §5); :func:`analysis_metrics` computes
all of them on the one set it is given.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import faiss
import numpy as np
import torch
from sklearn.metrics import normalized_mutual_info_score

from mlrc.protocol.knn import (
    ArrayLike,
    check_embeddings,
    exact_knn,
    full_fp32_matmul,
    to_tensor,
)
from mlrc.protocol.metrics import integer_labels

# Bytes of one working block (float32 similarities, or float64 candidate vectors) at a time.
BLOCK_BYTES = 256 * 2**20

MAP_WINDOW = 1000  # neighbours scored by mAP@1000
SMALL_K = 64  # largest k ranked by knn.exact_knn (float32 candidates + certificate)
KMEANS_ITERATIONS = 20  # as the Revisiting code (and PML's FaissKMeans)


def recall_at_k(
    embeddings: ArrayLike,
    labels: ArrayLike,
    ks: Sequence[int] = (1, 2, 4, 8),
    *,
    normalize: bool = True,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """Recall@k for each k in ``ks``, keys ``recall_at_{k}``.

    Definition (Revisiting paper App. A.3 eq. 25–26; code ``metrics/e_recall.py``): with F_q^k the
    k nearest neighbours of query q among the *other* items (Euclidean distance),
    R@k = (1/n) Σ_q 𝟙[∃ i ∈ F_q^k : y_i = y_q]. Every item is a query and the mean is over *all*
    n queries, so a query without another item of its class counts as a miss (the Revisiting code
    does the same; PML's precision_at_1 instead leaves such queries out). k larger than n − 1 is
    capped at n − 1. Paper and code agree.
    """
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    x32, x64, y = _prepare(embeddings, labels, normalize, device)
    n = x64.shape[0]
    k_max = min(max(ks), n - 1)
    hits = torch.zeros(len(ks), dtype=torch.float64, device=x64.device)
    for q, nn_idx in _knn_blocks(x32, x64, k_max, normalize):
        first = _first_hit_rank(y[nn_idx] == y[q, None])
        for j, k in enumerate(ks):
            hits[j] += (first < min(k, k_max)).sum()
    return {f"recall_at_{k}": float(h) / n for k, h in zip(ks, hits.tolist(), strict=True)}


def map_at_1000(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    normalize: bool = True,
    divisor: Literal["class_size", "min_r"] = "class_size",
    device: str | torch.device | None = None,
) -> float:
    """mAP@1000: average precision over each query's 1000 nearest other items, mean over queries.

    Implemented as the Revisiting code ``metrics/mAP_1000.py`` computes it (the published numbers):
    for each query q of class c, with rel(i) = 𝟙[i-th neighbour has label c] and
    P(i) = (1/i) Σ_{j≤i} rel(j) over the W = min(1000, n − 1) nearest other items,

        AP@1000(q) = Σ_{i≤W} P(i)·rel(i) / n_c,

    where n_c is the class size *including* the query (``np.unique(..., return_counts=True)``), and
    mAP@1000 = plain mean over all n queries (a query alone in its class scores 0). Because the
    query itself is excluded, a perfect embedding scores (n_c − 1)/n_c per query, not 1.

    Paper vs code: the paper's eq. 30 is |{hits in the top 1000}| / 1000 (a precision@1000, not an
    AP), which the code does not compute; we follow the code, as notes/000 §6 records. The code
    divides by n_c, *not* by min(R, 1000) with R = n_c − 1; ``divisor="min_r"`` gives that
    MAP@R-style normalisation instead (perfect = 1; queries with R = 0 still count as 0). The code
    searches 1001 neighbours in float32 faiss and drops column 0 assuming it is the query; we
    exclude the query by index and rank exactly.
    """
    if divisor not in ("class_size", "min_r"):
        raise ValueError(f"divisor must be 'class_size' or 'min_r', got {divisor!r}")
    x32, x64, y = _prepare(embeddings, labels, normalize, device)
    _, y_idx, counts = torch.unique(y, return_inverse=True, return_counts=True)
    n_c = counts[y_idx].double()
    window = min(MAP_WINDOW, x64.shape[0] - 1)
    total = 0.0
    for q, nn_idx in _knn_blocks(x32, x64, window, normalize):
        ap = _ap_sums(y[nn_idx] == y[q, None])
        if divisor == "class_size":
            denominator = n_c[q]
        else:
            denominator = (n_c[q] - 1).clamp(min=1, max=MAP_WINDOW)
        total += float((ap / denominator).sum())
    return total / x64.shape[0]


def nmi(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    seed: int = 0,
    normalize: bool = True,
) -> float:
    """Normalised mutual information between k-means clusters and the labels.

    Clustering as the Revisiting code (``metrics/__init__.py``): faiss k-means with
    K = number of distinct labels in ``labels``, 20 Lloyd iterations, one run (no restarts,
    ``nredo=1``), faiss's random initialisation (K distinct data points drawn with ``seed``), no
    subsampling (min/max points per centroid 1/10⁹); then each item is assigned to its nearest
    centroid. Runs on CPU in float32. Score: sklearn ``normalized_mutual_info_score`` with the
    arithmetic-mean normalisation 2·I(Ω;Y)/(H(Ω) + H(Y)) (code ``metrics/nmi.py``, PML).

    Paper vs code: the printed eq. 27 divides by 2(H + H) (an erratum, notes/000 §6); we use the
    code's (and sklearn's) form. The code sets K to the number of *training* classes, equal to the
    test classes on CUB/CARS; we use the classes of the set given. PML's FaissKMeans differs only in
    subsampling at 256 points per centroid. k-means from a random start is a local optimum, so the
    value depends on ``seed`` (deterministic for a fixed seed).
    """
    x32, _, y = _prepare(embeddings, labels, normalize, "cpu")
    y_np = y.numpy()
    k = int(np.unique(y_np).size)
    if x32.shape[0] < k:
        raise ValueError(f"k-means needs at least K = {k} points, got {x32.shape[0]}")
    clusters = kmeans_assign(x32.numpy(), k, seed)
    return float(normalized_mutual_info_score(y_np, clusters, average_method="arithmetic"))


def spectral_decay(
    embeddings: ArrayLike,
    *,
    normalize: bool = True,
    drop_largest: int = 1,
) -> float:
    """Spectral decay ρ(Φ) = KL(U ‖ S̃_Φ) of the embedding matrix (Revisiting §5, footnote 3).

    Steps (paper §5 and code ``metrics/rho_spectrum.py``):

    1. singular values s_1 ≥ … ≥ s_m of the n × d embedding matrix Φ as given (rows L2-normalised
       if ``normalize``), *not* centred; m = min(n, d), computed exactly in float64;
    2. drop the ``drop_largest`` largest (paper: 1, "excluding highest SV which can obfuscate
       remaining DoVs" = code ``rho_spectrum@2``; 0 = code ``rho_spectrum@1``, which the README
       calls the paper's metric — notes/000 §5.1 says log both);
    3. normalise the kept values to sum 1: s̃_k = s_k / Σ s_k;
    4. ρ = KL(U ‖ S̃) = Σ_k u_k log(u_k / s̃_k) in nats, u_k = 1/(number of kept values)
       (scipy ``entropy(uniform, s_norm)`` in the code; the uniform is first, so ρ → ∞ as any kept
       singular value → 0).

    Lower ρ = flatter spectrum = more directions of significant variance. Paper vs code: the paper
    speaks of a D-dim uniform; the code's CPU path (``TruncatedSVD(n_components=D−1)``) silently
    drops the *smallest* singular value as well, its GPU path (``torch.svd``) keeps all D. We keep
    all min(n, d), as the paper and the GPU path. Returns ``inf`` if a kept value is exactly 0.
    """
    if drop_largest < 0:
        raise ValueError(f"drop_largest must be >= 0, got {drop_largest}")
    x = to_tensor(embeddings, "cpu").double()
    if x.ndim != 2 or not torch.isfinite(x).all():
        raise ValueError(f"need finite embeddings (n, d), got shape {tuple(x.shape)}")
    if normalize:
        x = torch.nn.functional.normalize(x, p=2, dim=1)
    s = torch.linalg.svdvals(x)[drop_largest:]
    if s.numel() < 1 or float(s.sum()) <= 0.0:
        raise ValueError("no non-zero singular values left: spectral decay is undefined")
    p = s / s.sum()
    if bool((p == 0).any()):
        return float("inf")
    m = p.numel()
    return float((-np.log(m) - torch.log(p)).mean())


def embedding_density(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    normalize: bool = True,
) -> dict[str, float]:
    """π_intra, π_inter and π_ratio = π_intra / π_inter (Revisiting §5; code ``metrics/dists.py``).

    The paper leaves d(·,·) and the normalisers Z open; we follow the code, with d = cosine
    distance 1 − cos(a, b):

    - π_intra = mean over classes of [Σ_{i,j ∈ class} d(φ_i, φ_j)] / (n_c² − n_c), i.e. the mean
      pairwise distance *within each class*, then averaged over classes with equal weight. A class
      with one item has no pair; the code means to set it to the maximum over the other classes
      (its ``intra_dists[1 - np.isnan(...)]`` indexing bug picks from entries 0 and 1 instead) —
      we do what it means;
    - π_inter = mean cosine distance between the L2-normalised *class means* μ̂_l (means of the
      embeddings, normalised first if ``normalize`` as the code's model output is), over the
      C² − C ordered pairs l ≠ k;
    - π_ratio = π_intra / max(π_inter, 1e-8).

    Computed without the n_c × n_c matrices: for unit vectors 1 − cos = ‖a − b‖²/2, so
    Σ_{i,j} d = n Σ_i ‖φ̂_i − φ̄‖², giving π_intra(c) = Σ_i ‖φ̂_i − φ̄_c‖² / (n_c − 1) and
    π_inter = Σ_l ‖μ̂_l − mean(μ̂)‖² / (C − 1), both in float64.
    """
    x = to_tensor(embeddings, "cpu").double()
    y = to_tensor(integer_labels(labels), "cpu")  # 0.01 … 0.04 are not one class: refused
    check_embeddings(x, y)
    norms = x.norm(dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError("an embedding is the zero vector: its cosine distance is undefined")
    unit = x / norms
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    n_classes = counts.numel()
    if n_classes < 2:
        raise ValueError("π_inter needs at least two classes")
    if int(counts.max()) < 2:
        raise ValueError("π_intra needs a class with at least two items")
    d = x.shape[1]
    centroid = torch.zeros(n_classes, d, dtype=torch.float64).index_add_(0, inv, unit)
    centroid /= counts[:, None].double()
    spread = torch.zeros(n_classes, dtype=torch.float64).index_add_(
        0, inv, ((unit - centroid[inv]) ** 2).sum(1)
    )
    several = counts > 1
    intra_c = torch.empty(n_classes, dtype=torch.float64)
    intra_c[several] = spread[several] / (counts[several] - 1).double()
    intra_c[~several] = intra_c[several].max()
    intra = float(intra_c.mean())

    source = unit if normalize else x
    means = torch.zeros(n_classes, d, dtype=torch.float64).index_add_(0, inv, source)
    mean_norms = means.norm(dim=1, keepdim=True)
    if bool((mean_norms == 0).any()):
        raise ValueError("a class mean is the zero vector: its cosine distance is undefined")
    means = means / mean_norms
    inter = float(((means - means.mean(0)) ** 2).sum() / (n_classes - 1))
    return {"pi_intra": intra, "pi_inter": inter, "pi_ratio": intra / max(inter, 1e-8)}


def pi_ratio(embeddings: ArrayLike, labels: ArrayLike, *, normalize: bool = True) -> float:
    """Embedding space density π_ratio = π_intra / π_inter; see :func:`embedding_density`.

    Revisiting §5 (π_ratio(Φ) = π_intra(Φ)/π_inter(Φ)) with the code's definitions
    (``metrics/dists.py``, mode ``intra_over_inter``): mean within-class *pairwise* cosine distance
    (per class, then averaged over classes) over mean cosine distance between normalised *class
    means*. Higher = denser embedding space. The paper computes it on the training embeddings.
    """
    return embedding_density(embeddings, labels, normalize=normalize)["pi_ratio"]


def metrix_utilization(
    test_embeddings: ArrayLike,
    train_embeddings: ArrayLike,
    *,
    normalize: bool = False,
    device: str | torch.device | None = None,
) -> float:
    """Utilization u(Q, X) = (1/|Q|) Σ_{q∈Q} min_{x∈X} ‖f(q) − f(x)‖² (Metrix paper eq. 12, §4.3).

    The mean over test queries of the *squared* Euclidean distance to the nearest training
    embedding (notes/003 §4); lower is better. Units: squared embedding distance (on unit vectors
    in [0, 4]). The search is exact in float64 and the minimum distance is recomputed as
    ‖q − x*‖² directly, without cancellation.

    ``train_embeddings`` is X (clean) for u(Q, X), or clean plus mixed embeddings for u(Q, X̂);
    the mixed ones must be produced by the caller with the frozen model (notes/003 §4). The paper
    uses f as given, so by default the embeddings are used as passed; ``normalize=True``
    L2-normalises both sets (which also re-normalises mixed embeddings — the paper leaves that
    open). The paper reports no code; this follows eq. 12 literally.
    """
    q = to_tensor(test_embeddings, device).double()
    x = to_tensor(train_embeddings, q.device).double()
    if q.ndim != 2 or x.ndim != 2 or q.shape[1] != x.shape[1] or len(q) == 0 or len(x) == 0:
        raise ValueError(
            f"need test (n, d) and train (m, d) embeddings, got {tuple(q.shape)}, {tuple(x.shape)}"
        )
    if not (torch.isfinite(q).all() and torch.isfinite(x).all()):
        raise ValueError("embeddings contain NaN or infinite values")
    if normalize:
        q = torch.nn.functional.normalize(q, p=2, dim=1)
        x = torch.nn.functional.normalize(x, p=2, dim=1)
    x_sq = (x * x).sum(1)
    block = max(1, BLOCK_BYTES // (8 * x.shape[0]))
    total = 0.0
    for start in range(0, q.shape[0], block):
        qb = q[start : start + block]
        with full_fp32_matmul():  # float64 here, so only a guard
            nearest = (x_sq[None, :] - 2.0 * qb @ x.T).argmin(1)
        total += float(((qb - x[nearest]) ** 2).sum())
    return total / q.shape[0]


# Recall@K of the DML papers' tables, by dataset (the small sets: 1, 2, 4, 8).
RECALL_KS = {"sop": (1, 10, 100, 1000), "inshop": (1, 10, 20, 30, 40, 50)}


def recall_ks(dataset: str) -> tuple[int, ...]:
    """The K of Recall@K the papers report for ``dataset``: 1, 10, 100, 1000 on SOP; 1, 10,
    20, …, 50 on In-Shop; 1, 2, 4, 8 on CUB, Cars and any other dataset."""
    return RECALL_KS.get(dataset, (1, 2, 4, 8))


def analysis_metrics(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    seed: int = 0,
    normalize: bool = True,
    device: str | torch.device | None = None,
    ks: tuple[int, ...] = (1, 2, 4, 8),
) -> dict[str, float]:
    """Every metric above that needs only (embeddings, labels), on this one set.

    Keys: ``recall_at_{k}`` for k in ``ks`` (default 1, 2, 4, 8), ``nmi``, ``map_at_1000``,
    ``spectral_decay``, ``pi_ratio`` —
    the same values as :func:`recall_at_k`, :func:`nmi` (``seed``), :func:`map_at_1000`,
    :func:`spectral_decay` (paper default, largest SV dropped) and :func:`pi_ratio`. Recall@k and
    mAP@1000 share one neighbour search. The paper reads ρ and π from the *training* set and the
    others from the test set: call this once per set and pick the keys.
    """
    ks = tuple(sorted(set(ks)))
    x32, x64, y = _prepare(embeddings, labels, normalize, device)
    n = x64.shape[0]
    _, y_idx, counts = torch.unique(y, return_inverse=True, return_counts=True)
    n_c = counts[y_idx].double()
    window = min(max(MAP_WINDOW, max(ks)), n - 1)
    hits = [0.0] * len(ks)
    ap_total = 0.0
    for q, nn_idx in _knn_blocks(x32, x64, window, normalize):
        rel = y[nn_idx] == y[q, None]
        first = _first_hit_rank(rel)
        for j, k in enumerate(ks):
            hits[j] += float((first < min(k, window)).sum())
        ap_total += float((_ap_sums(rel[:, : min(MAP_WINDOW, window)]) / n_c[q]).sum())
    out = {f"recall_at_{k}": h / n for k, h in zip(ks, hits, strict=True)}
    out["nmi"] = nmi(embeddings, labels, seed=seed, normalize=normalize)
    out["map_at_1000"] = ap_total / n
    out["spectral_decay"] = spectral_decay(embeddings, normalize=normalize)
    out["pi_ratio"] = pi_ratio(embeddings, labels, normalize=normalize)
    return out


def _prepare(
    embeddings: ArrayLike,
    labels: ArrayLike,
    normalize: bool,
    device: str | torch.device | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32, float64, labels) on one device; rows L2-normalised in float64 if asked."""
    x = to_tensor(embeddings, device)
    x64 = x.double()
    y = to_tensor(integer_labels(labels), x64.device)  # 0.01 … 0.04 are not one class: refused
    check_embeddings(x64, y)
    if x64.shape[0] < 2:
        raise ValueError("need at least two items: a query needs another item to rank")
    if normalize:
        x64 = torch.nn.functional.normalize(x64, p=2, dim=1)
    return x64.float(), x64, y


def _knn_blocks(
    x32: torch.Tensor, x64: torch.Tensor, k: int, normalize: bool
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(query indices, their k nearest other items) block by block, exact in float64.

    Small k (Recall@k): ``knn.exact_knn`` — float32 candidates, float64 re-ranking with a
    certificate. Large k (mAP@1000): that certificate is too loose for the dense ranks near
    1000 and nearly every query would fall back to a full float64 ranking one by one, so the
    block's float64 scores are computed directly (:func:`_knn64`). A block holds at most
    BLOCK_BYTES of similarities (block × n) and of re-ranked candidate vectors.
    """
    n, d = x64.shape
    if k <= SMALL_K:
        block = max(1, min(BLOCK_BYTES // (4 * n), BLOCK_BYTES // (8 * (k + 8) * d)))
    else:
        block = max(1, BLOCK_BYTES // (8 * n))
    for start in range(0, n, block):
        q = torch.arange(start, min(start + block, n), device=x64.device)
        if k <= SMALL_K:
            yield q, exact_knn(x32, x64, q, k, normalize)
        else:
            yield q, _knn64(x64, q, k, normalize)


def _knn64(x64: torch.Tensor, q: torch.Tensor, k: int, normalize: bool) -> torch.Tensor:
    """Indices (len(q) × k) of each query's k nearest other items from float64 scores.

    Score: q·r on unit vectors, else 2q·r − ‖r‖² (same order as −‖q − r‖²; float64 dot
    products, not ``knn``'s canonical squared distances, so exact ties of collapsed sets may
    still rank differently on CPU and GPU here). Exact ties go to the lower index: the top k are
    re-sorted by index, then stably by score; a row whose k-th score ties with a score outside
    the top k is sorted in full.
    """
    n = x64.shape[0]
    rows = torch.arange(len(q), device=x64.device)
    with full_fp32_matmul():  # float64 here, so only a guard
        s = x64[q] @ x64.T
    if not normalize:
        s = 2.0 * s - (x64 * x64).sum(1)[None, :]
    s[rows, q] = -torch.inf  # exclude self
    top_s, top = s.topk(k, dim=1)
    top, order = top.sort(dim=1)
    top_s = top_s.gather(1, order)
    top_s, order = top_s.sort(dim=1, descending=True, stable=True)
    best = top.gather(1, order)
    if k < n - 1:
        boundary_ties = torch.nonzero((s >= top_s[:, -1:]).sum(1) > k).flatten()
        for i in boundary_ties.tolist():
            best[i] = torch.sort(-s[i], stable=True).indices[:k]
    return best


def _first_hit_rank(rel: torch.Tensor) -> torch.Tensor:
    """0-based rank of each row's first True, or the row length if there is none."""
    width = rel.shape[1]
    ranks = torch.arange(width, device=rel.device).expand_as(rel)
    return torch.where(rel, ranks, torch.full_like(ranks, width)).min(1).values


def _ap_sums(rel: torch.Tensor) -> torch.Tensor:
    """Σ_i P(i)·rel(i) per row, P(i) = hits among the first i / i (not yet divided)."""
    r = rel.double()
    ranks = torch.arange(1, r.shape[1] + 1, device=r.device, dtype=torch.float64)
    return (r.cumsum(1) / ranks * r).sum(1)


def kmeans_assign(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Nearest-centroid assignment after faiss k-means as in the Revisiting code (see :func:`nmi`)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    kmeans = faiss.Kmeans(
        x.shape[1],
        k,
        niter=KMEANS_ITERATIONS,
        nredo=1,
        seed=int(seed),
        min_points_per_centroid=1,
        max_points_per_centroid=10**9,
        verbose=False,
    )
    kmeans.train(x)
    _, assignment = kmeans.index.search(x, 1)
    return assignment.reshape(-1)
