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
- only ranks ≤ R are read, so a query needs at most its R nearest neighbours (PML: k = the
  largest class size).

Neighbours are exact in float64 (normalisation included): a float32 candidate search is
followed by a float64 re-ranking with a proof that the candidates hold the true top k (CPU:
``_knn_numpy``, numpy BLAS on the upper triangle of the similarity matrix; other devices:
``_exact_knn`` with torch); exact ties go to the lower index. faiss (and so PML) ranks in
float32, which can order near-ties of collapsed, nearly collinear embeddings differently
(effect ~1e-5).

All returned values are fractions in [0, 1], as Python floats.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

METRICS = ("map_at_r", "precision_at_1", "r_precision")

# Bytes of one float32 similarity block (queries × references) computed at a time (torch path).
_BLOCK_BYTES = 256 * 2**20

# CPU path: rows (= columns) of one float32 similarity tile, candidates kept per query beyond
# its R, and bytes of the float64 temporaries of the re-ranking.
_TILE = 2048
_STRIP = 512  # rows of a tile compared with the thresholds at a time (and GEMM rows, small n)
_PAD_CPU = 4
_POOL_SLACK = 2**15  # triples a pool may hold beyond Σc_q before it is pruned
_DENSE_PER_CANDIDATE = 100  # one full-width tile if n ≤ this × mean c_q (see _tile_width)
_CHUNK_BYTES = 4 * 2**20
_NUMPY_ON_CPU = True  # False: the torch path also on CPU (tests)

_U32 = 2.0**-24  # unit roundoff of float32
_U64 = 2.0**-53  # unit roundoff of float64

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
    The n × n similarity matrix is never materialised. On CPU (numpy) the search walks the
    upper triangle of 2048 × 2048 float32 tiles, each serving its rows and its columns, and
    needs a float32 copy of the embeddings (two without ``normalize``), a GEMM buffer no
    larger than that copy and a few tens of bytes per (query, needed neighbour); elsewhere
    (torch) queries are processed in blocks of at most 256 MiB of float32 similarities. Also
    returns ``num_queries`` (queries with R > 0).
    """
    x = _as_tensor(embeddings, device)
    x = x if x.dtype == torch.float64 else x.float()
    y = _as_tensor(labels, x.device).long().reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"need embeddings (n, d) and labels (n,), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    on_numpy = x.device.type == "cpu" and _NUMPY_ON_CPU
    if not (np.isfinite(x.numpy()).all() if on_numpy else bool(torch.isfinite(x).all())):
        raise ValueError("embeddings contain NaN or infinite values")
    if on_numpy:
        _, y_np, counts = np.unique(y.numpy(), return_inverse=True, return_counts=True)
        R = counts[y_np] - 1  # other items of the query's class
    else:
        _, y_t, counts_t = torch.unique(y, return_inverse=True, return_counts=True)
        R = (counts_t[y_t] - 1).cpu().numpy()
    num_queries = int((R > 0).sum())
    if num_queries == 0:
        raise ValueError("no query has another item of its class: metrics are undefined")
    if on_numpy:
        nbr = _knn_numpy(_factors(x.numpy(), normalize), R)
        sums = _rank_sums_of(nbr, y_np, R)
    else:
        sums = _sums_torch(x, y_t, torch.as_tensor(R, device=x.device), normalize)
    out = dict(zip(METRICS, (sums / num_queries).tolist(), strict=True))
    out["num_queries"] = num_queries
    return out


def _rank_sums(rel: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Sums over queries with R > 0 of (AP@R, P@1, R-Precision), float64 array of 3.

    ``rel`` (m × k bool, k ≥ every R): relevance of each query's ranks 1..k; ranks beyond R
    are ignored.
    """
    keep = R > 0
    rel, R = rel[keep].astype(np.float64), R[keep].astype(np.float64)
    ranks = np.arange(1, rel.shape[1] + 1, dtype=np.float64)
    hits = rel * (ranks[None, :] <= R[:, None])
    precision_at_i = rel.cumsum(1) / ranks[None, :]
    return np.array(
        [
            ((precision_at_i * hits).sum(1) / R).sum(),  # MAP@R
            rel[:, 0].sum(),  # P@1
            (hits.sum(1) / R).sum(),  # R-Precision
        ]
    )


def _rank_sums_of(nbr: np.ndarray, y: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``_rank_sums`` of neighbour indices ``nbr`` (n × max R; only ranks ≤ R are read)."""
    sums = np.zeros(3)
    step = max(1, 2**18 // nbr.shape[1])
    for lo in range(0, len(nbr), step):
        rows = slice(lo, lo + step)
        sums += _rank_sums(y[nbr[rows]] == y[rows, None], R[rows])
    return sums


def _sums_torch(
    x: torch.Tensor, y: torch.Tensor, R_all: torch.Tensor, normalize: bool
) -> np.ndarray:
    """``_rank_sums`` over all queries, ranked with torch on x's device (``_exact_knn``)."""
    n = x.shape[0]
    x64 = x.double()
    if normalize:
        x64 = torch.nn.functional.normalize(x64, p=2, dim=1)
    x32 = x64.float()
    k = int(min(int(R_all.max()) + 1, n - 1))  # the largest class size
    block = max(1, _BLOCK_BYTES // (4 * n))
    sums = np.zeros(3)
    for start in range(0, n, block):
        q = torch.arange(start, min(start + block, n), device=x.device)
        nn_idx = _exact_knn(x32, x64, q, k, normalize)
        sums += _rank_sums((y[nn_idx] == y[q, None]).cpu().numpy(), R_all[q].cpu().numpy())
    return sums


def _gamma(m: int, u: float) -> float:
    """Higham's γ_m = m·u/(1 − m·u): relative error bound of an m-term dot product."""
    return m * u / (1 - m * u)


@dataclass(frozen=True)
class _Factors:
    """The CPU path's view of the embeddings x (n × d), see ``_knn_numpy``.

    Ranking score of reference r for query q, in float64: s = x̂_q·x̂_r on unit vectors
    x̂ = x/‖x‖, else s = 2x_q·x_r − ‖x_r‖² (same order as −‖x_q − x_r‖²); ``score`` is the
    canonical evaluation, ``gemm_score`` a fast one within e64 of it. The float32 search uses
    the symmetric t = s − shift_q (shift = 0, or ‖x_q‖²) as t32 = a_q·b_r with a = b = x̂, or
    a = [2x, −‖x‖², −1] and b = [x, 1, ‖x‖²].
    """

    x: np.ndarray  # n × d input rows, float32 or float64 (not copied)
    normalize: bool
    norm: np.ndarray  # float64 ‖x‖ clamped at 1e-12 (normalising), else ones
    sq: np.ndarray  # float64 ‖x‖² of the raw rows (unused when normalising)
    a: np.ndarray  # float32 n × D
    b: np.ndarray  # float32 n × D (the same array when normalising)
    e32: np.ndarray  # per query: bound on |t32 − t64|
    e64: np.ndarray  # per query: bound on |float64 GEMM score − canonical score|
    fits32: bool  # float32 scores cannot overflow

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Float64 ranked vectors (x̂ or x) of the items ``idx`` (any shape), shape idx × d."""
        r = self.x[idx].astype(np.float64)
        return r / self.norm[idx][..., None] if self.normalize else r

    def score(self, q_rows: np.ndarray, r_idx: np.ndarray) -> np.ndarray:
        """Canonical float64 scores (m × c) of references ``r_idx`` for queries ``q_rows``.

        ``q_rows`` = rows(q). On unit vectors s = (Σ_k x_rk·x̂_qk)/‖x_r‖, else
        s = 2Σ_k x_rk·x_qk − ‖x_r‖²: elementwise products summed along the last axis, the same
        arithmetic for every pair, so identical rows get identical scores (ties by index).
        """
        dot = np.multiply(self.x[r_idx], q_rows[:, None, :]).sum(-1)
        return dot / self.norm[r_idx] if self.normalize else 2.0 * dot - self.sq[r_idx]

    def gemm_score(self, q_rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Float64 GEMM scores (m × (hi − lo)) of references lo..hi − 1: fast, not canonical."""
        dot = q_rows @ self.rows(np.arange(lo, hi)).T
        return dot if self.normalize else 2.0 * dot - self.sq[None, lo:hi]

    def shift(self, q: np.ndarray) -> np.ndarray:
        """s − t for queries ``q``: 0 on unit vectors, else ‖x_q‖²."""
        return np.zeros(len(q)) if self.normalize else self.sq[q]


def _factors(x: np.ndarray, normalize: bool) -> _Factors:
    """``_Factors`` of x, built in row chunks (no full float64 copy).

    Error bounds (u = 2⁻²⁴, Higham, Accuracy and Stability, §3.1, any summation order, FMA or
    not): with β_q ≥ Σ_k |a_qk||b_rk| for every r (β = 1 on unit vectors; (‖x_q‖ + max‖x‖)²
    else), rounding the factors to float32 moves t by ≤ (2u + u²)β and the float32 dot product
    adds ≤ γ_D(1 + u)²β; the float64 evaluation of t adds ≤ γ_D(2⁻⁵³)β. All of it is below
    e32 = 2(γ_D + 3u)β (plus D·2⁻¹²⁵ for flushed subnormals). Two float64 evaluations of s
    (GEMM vs canonical) differ by ≤ (4γ_d + 2·2⁻⁵³)β < e64 = 8γ_D(2⁻⁵³)β.
    """
    n, d = x.shape
    D = d if normalize else d + 2
    a = np.empty((n, D), np.float32)
    b = a if normalize else np.empty((n, D), np.float32)
    norm, sq = np.ones(n), np.zeros(n)
    step = max(1, _CHUNK_BYTES // (8 * d))
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        x64 = x[lo:hi].astype(np.float64)
        if normalize:
            norm[lo:hi] = np.maximum(np.sqrt((x64 * x64).sum(1)), 1e-12)
            a[lo:hi] = x64 / norm[lo:hi, None]
            continue
        sq[lo:hi] = (x64 * x64).sum(-1)
        with np.errstate(over="ignore"):  # too large for float32: fits32 is False
            a[lo:hi, :d], a[lo:hi, d], a[lo:hi, d + 1] = 2.0 * x64, -sq[lo:hi], -1.0
            b[lo:hi, :d], b[lo:hi, d], b[lo:hi, d + 1] = x64, 1.0, sq[lo:hi]
    if normalize:
        beta = np.full(n, 1.0 + 2.0**-40)  # ‖x̂‖ ≤ 1 + d·2⁻⁵³
    else:
        length = np.sqrt(sq)
        beta = (length + length.max()) ** 2 * (1.0 + 2.0**-40)
    e32 = 2 * (_gamma(D, _U32) + 3 * _U32) * beta + D * 2.0**-125
    e64 = 8 * _gamma(D, _U64) * beta + D * 2.0**-1020
    fits32 = bool(np.isfinite(a).all() and np.isfinite(b).all() and beta.max() < 2.0**120)
    return _Factors(x, normalize, norm, sq, a, b, e32, e64, fits32)


class _Pool:
    """Candidate triples (query, reference, t32) of one block of queries, int32/int32/float32.

    ``kept``: the triples that survived the last pruning, sorted by (query, t32 descending);
    ``parts``: triples added since.
    """

    def __init__(self, limit: int) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.kept = (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32))
        self.size, self.limit = 0, limit

    def add(self, q: np.ndarray, r: np.ndarray, t: np.ndarray) -> None:
        if len(q):
            self.parts.append((q.astype(np.int32), r.astype(np.int32), t))
            self.size += len(q)

    def prune(self, want: np.ndarray, tau: np.ndarray) -> tuple[np.ndarray, ...]:
        """Keep each query's ``want`` best by t32; raise ``tau`` to the last kept t32.

        Returns (q, r, t): kept triples sorted by query, then by t32 descending. Every
        dropped triple has t32 ≤ the raised tau, which is the invariant ``_knn_numpy`` needs.
        New triples at or below the current tau are dropped first; the rest are sorted and
        merged into the sorted kept ones.
        """
        if self.parts:
            q, r, t = (np.concatenate(p) for p in zip(*self.parts, strict=True))
            above = t > tau[q]
            q, r, t = q[above], r[above], t[above]
            key = _query_then_descending(q, t)
            order = np.argsort(key)
            new = (q[order], r[order], t[order], key[order])
            kept = (*self.kept, _query_then_descending(self.kept[0], self.kept[2]))
            q, r, t, _ = _merge_sorted(kept, new)
            rank = _rank_within_runs(q)
            last = rank == want[q] - 1
            tau[q[last]] = np.maximum(tau[q[last]], t[last])
            keep = rank < want[q]
            self.kept = (q[keep], r[keep], t[keep])
            self.parts = []
        self.size = len(self.kept[0])
        return self.kept

    def add_and_prune(
        self, q: np.ndarray, r: np.ndarray, t: np.ndarray, want: np.ndarray, tau: np.ndarray
    ) -> None:
        self.add(q, r, t)
        if self.size > self.limit:
            self.prune(want, tau)


def _merge_sorted(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Merge two tuples of equally long arrays, each sorted by its last array (the key)."""
    if len(a[-1]) == 0:
        return b
    at = np.searchsorted(a[-1], b[-1], side="right") + np.arange(len(b[-1]))
    from_b = np.zeros(len(a[-1]) + len(b[-1]), bool)
    from_b[at] = True
    merged = []
    for x, y in zip(a, b, strict=True):
        out = np.empty(len(from_b), x.dtype)
        out[at], out[~from_b] = y, x
        merged.append(out)
    return tuple(merged)


def _rank_within_runs(q: np.ndarray) -> np.ndarray:
    """Position of each entry of the sorted ``q`` within its run of equal values (0, 1, …)."""
    position = np.arange(len(q))
    starts = np.ones(len(q), bool)
    starts[1:] = q[1:] != q[:-1]
    return position - np.maximum.accumulate(np.where(starts, position, 0))


def _query_then_descending(q: np.ndarray, t: np.ndarray) -> np.ndarray:
    """uint64 sort key: query index, then float32 t from largest to smallest."""
    bits = t.view(np.uint32)
    ascending = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    return (q.astype(np.uint64) << np.uint64(32)) | (~ascending).astype(np.uint64)


def _knn_numpy(f: _Factors, R: np.ndarray) -> np.ndarray:
    """Each query's R nearest other items (n × max R int32, ranks > R unset), exact in float64.

    Only ranks ≤ R enter MAP@R, R-Precision and P@1, so query q needs its top k_q = R_q.

    Search: float32 t32 = a_q·b_r (``_Factors``) with numpy BLAS over the upper triangle of
    _TILE × _TILE tiles: t is symmetric, so a tile (I, J) serves the queries of I and, read by
    columns, those of J (half the work of a full search). Each query q has a pool of candidates
    and a float32 threshold τ_q that only rises. The diagonal tile gives q the entries of its
    own block at or above its c-th best (c ≥ c_q = R_q + 4); the other tiles add the entries
    with t32 > τ_q; a pool that outgrows Σc_q + _POOL_SLACK, and each pool after its diagonal
    tile, is pruned to the best c_q per query and τ_q raised to the c_q-th kept t32. When the
    queries need many candidates relative to n (``_tile_width``) there is one tile of full rows
    and each strip of queries is finished at once. Every entry ever left out was at or below
    the τ_q of that moment, so each item r that is not a candidate of q has t32(q, r) ≤ θ_q,
    the final τ_q.

    Why this is exact: |t32 − t64| ≤ e32_q for every pair (``_factors``), so a non-candidate
    has t64 ≤ θ_q + e32_q. If k_q candidates have t64 > θ_q + e32_q, no non-candidate can be
    in the top k_q, and the candidates ranked by float64 score (ties to the lower index) give
    the exact top k_q. ``_certified_top_k`` proves this mostly from the float32 scores alone
    (re-scoring only near-tied candidates), else by re-scoring (``_certify``, then with 4×
    more candidates, ``_certify_wider``). Queries still unproven (collapsed embeddings, many
    exact copies) and all queries when float32 could overflow are ranked by
    ``_rank_exactly``. The factor 2 in e32 also covers the float64 roundings of these
    comparisons.

    Memory: the float32 factors (4 bytes per entry, 8 unnormalised), a GEMM buffer no larger
    than them (128 to 2048 rows), a mask of ≤ 512 × tile bytes, the pools (12 bytes per
    triple, about Σc_q + _POOL_SLACK per block) and the n × max R result.
    """
    n = len(R)
    nbr = np.full((n, int(R.max())), -1, np.int32)
    want = np.where(R > 0, np.minimum(R + _PAD_CPU, n - 1), 0)
    if not f.fits32:
        _rank_exactly(f, np.flatnonzero(R > 0), R, nbr)
        return nbr
    tau = np.where(R > 0, -np.inf, np.inf).astype(np.float32)  # R = 0: never a candidate
    tile = _tile_width(n, want)
    blocks = [(lo, min(lo + tile, n)) for lo in range(0, n, tile)]
    search = _one_tile if len(blocks) == 1 else _upper_triangle
    failed = search(f, blocks, want, tau, R, nbr)
    _rank_exactly(f, failed, R, nbr)
    return nbr


def _one_tile(
    f: _Factors,
    blocks: list[tuple[int, int]],
    want: np.ndarray,
    tau: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """Full rows (one tile): each strip of queries is certified as soon as it is computed."""
    step = _gemm_rows(f, len(f.x))
    mask = np.empty(min(step, _STRIP) * len(f.x), np.bool_)
    jobs = [(0, 0, g0) for g0 in range(0, len(f.x), step)]
    failed = []
    for (_, _, g0), t in _gemm_stream(f, jobs, blocks, step):
        for s0 in range(0, len(t), _STRIP):
            rows, pool = (g0 + s0, g0 + min(s0 + _STRIP, len(t))), _Pool(0)
            _diagonal_strip(rows, blocks[0], pool, want, tau, t[s0 : s0 + _STRIP], mask)
            failed.append(_certified_top_k(f, rows, pool, want, tau, R, nbr))
    return np.concatenate(failed)


def _upper_triangle(
    f: _Factors,
    blocks: list[tuple[int, int]],
    want: np.ndarray,
    tau: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """The tiles (I, J ≥ I), diagonal ones first; a block is certified once all its tiles are
    done. Returns the queries left unproven."""
    step = _gemm_rows(f, blocks[0][1])
    pools = [_Pool(int(want[lo:hi].sum()) + _POOL_SLACK) for lo, hi in blocks]
    jobs = [(i, i, g0) for i, (lo, hi) in enumerate(blocks) for g0 in range(lo, hi, step)]
    jobs += [
        (i, j, g0)
        for i, (lo, hi) in enumerate(blocks)
        for j in range(i + 1, len(blocks))
        for g0 in range(lo, hi, step)
    ]
    # tiles still to come that feed block b's pool (as rows or as columns)
    left = np.bincount([b for i, j, _ in jobs for b in {i, j}], minlength=len(blocks))
    mask = np.empty(min(step, _STRIP) * blocks[0][1], np.bool_)
    failed = []
    for (i, j, g0), t in _gemm_stream(f, jobs, blocks, step):
        for s0 in range(0, len(t), _STRIP):
            rows, strip = (g0 + s0, g0 + min(s0 + _STRIP, len(t))), t[s0 : s0 + _STRIP]
            if i == j:
                _diagonal_strip(rows, blocks[i], pools[i], want, tau, strip, mask)
            else:
                _off_diagonal_strip(rows, blocks[j], (pools[i], pools[j]), want, tau, strip, mask)
        if i == j and g0 + len(t) == blocks[i][1]:  # the diagonal tile is done
            pools[i].prune(want, tau)
        for b in {i, j}:
            left[b] -= 1
            if left[b] == 0:  # block b has all its candidates
                failed.append(_certified_top_k(f, blocks[b], pools[b], want, tau, R, nbr))
                pools[b] = _Pool(0)  # free
    return np.concatenate(failed)


def _tile_width(n: int, want: np.ndarray) -> int:
    """_TILE, or n (one tile: full rows, no pools to merge) when the queries need so many
    candidates that merging pools would cost more than the second half of the GEMM."""
    needed = want[want > 0]
    return n if n <= _DENSE_PER_CANDIDATE * needed.mean() else min(n, _TILE)


def _gemm_rows(f: _Factors, width: int) -> int:
    """Rows per GEMM: as many as fit a buffer no larger than the float32 factors (one GEMM of
    2048 rows runs faster than four of 512), 128 to _TILE, a multiple of 128."""
    rows = f.a.nbytes // (4 * width) // 128 * 128
    return min(len(f.a), max(128, min(_TILE, rows)))


def _gemm_stream(
    f: _Factors, jobs: list[tuple[int, int, int]], blocks: list[tuple[int, int]], step: int
) -> Iterator[tuple[tuple[int, int, int], np.ndarray]]:
    """Yield (job, t32 of rows g0..g0 + step − 1 × block j) for each job (i, j, g0) in order.

    One float32 buffer of step × tile width, reused.
    """
    buffer = np.empty(step * (blocks[0][1] - blocks[0][0]), np.float32)  # step × tile
    for i, j, g0 in jobs:
        (lo, hi), g1 = blocks[j], min(g0 + step, blocks[i][1])
        out = buffer[: (g1 - g0) * (hi - lo)].reshape(g1 - g0, hi - lo)
        yield (i, j, g0), np.matmul(f.a[g0:g1], f.b[lo:hi].T, out=out)


def _above(
    t: np.ndarray, floor: np.ndarray | float, mask_buf: np.ndarray
) -> tuple[np.ndarray, ...]:
    """(i, j, t[i, j]) of the entries with t > floor (broadcast against t)."""
    mask = mask_buf[: t.size].reshape(t.shape)
    flat = np.flatnonzero(np.greater(t, floor, out=mask))
    i, j = np.divmod(flat, t.shape[1])
    return i, j, t.ravel()[flat]


def _diagonal_strip(
    rows: tuple[int, int],
    block: tuple[int, int],
    pool: _Pool,
    want: np.ndarray,
    tau: np.ndarray,
    t: np.ndarray,
    mask_buf: np.ndarray,
) -> None:
    """Seed the pool of queries ``rows`` with their best c_q items of their own block.

    c = the strip's largest c_q and v = each row's c-th largest t32; the entries with t32 ≥ v
    are kept, so the pruning after the diagonal tile raises τ to ≥ v above every entry left
    out.
    """
    (r0, r1), (lo, hi) = rows, block
    c, m = int(want[r0:r1].max()), hi - lo
    if c == 0:
        return
    t[np.arange(r1 - r0), np.arange(r0 - lo, r1 - lo)] = -np.inf  # self
    floor = tau[r0:r1, None]
    if c < m - 1:
        v = np.partition(t, m - c, axis=1)[:, m - c : m - c + 1]
        floor = np.maximum(floor, np.nextafter(v, np.float32(-np.inf)))  # t ≥ v
    i, j, ts = _above(t, floor, mask_buf)
    pool.add(r0 + i, lo + j, ts)


def _off_diagonal_strip(
    rows: tuple[int, int],
    cols: tuple[int, int],
    pools: tuple[_Pool, _Pool],
    want: np.ndarray,
    tau: np.ndarray,
    t: np.ndarray,
    mask_buf: np.ndarray,
) -> None:
    """t32 of queries rows × references cols: entries above τ go to both sides' pools.

    One comparison with a floor at or below both sides' thresholds (per group of _STRIP
    columns: the lowest τ of the strip's rows and of the group's columns, so one query with a
    low τ does not open the whole tile), then the few entries above it are split by each
    side's own threshold.
    """
    (r0, r1), (c0, c1) = rows, cols
    groups = np.arange(0, c1 - c0, _STRIP)
    col_floor = np.minimum.reduceat(tau[c0:c1], groups)
    floor = np.repeat(np.minimum(col_floor, tau[r0:r1].min()), np.diff(groups, append=c1 - c0))
    i, j, ts = _above(t, floor[None, :], mask_buf)
    row = ts > tau[r0 + i]
    pools[0].add_and_prune(r0 + i[row], c0 + j[row], ts[row], want, tau)
    col = ts > tau[c0 + j]
    pools[1].add_and_prune(c0 + j[col], r0 + i[col], ts[col], want, tau)


def _sort_by_score_then_index(
    s: np.ndarray, idx: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise order of (s, idx): s descending, ties by idx ascending; idx < 0 (s = −inf) last."""
    order = np.argsort(np.where(idx >= 0, idx, n), axis=1, kind="stable")
    s, idx = np.take_along_axis(s, order, 1), np.take_along_axis(idx, order, 1)
    order = np.argsort(-s, axis=1, kind="stable")
    return np.take_along_axis(s, order, 1), np.take_along_axis(idx, order, 1)


def _certified_top_k(
    f: _Factors,
    block: tuple[int, int],
    pool: _Pool,
    want: np.ndarray,
    tau: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """Write the certified top k = R of the block's queries into ``nbr``; return the others.

    Fast certificate, from the float32 order (candidates t_1 ≥ t_2 ≥ … by t32, e = e32_q):
    split them into runs where consecutive t32 differ by ≤ 2e; let t_end be the last of the
    run holding rank k. Items of different runs are ordered alike in t32 and t64 (they differ
    by > 2e); items after that run have t64 < t_end − e, and if t_end > θ_q + 2e every item up
    to t_end has t64 > θ_q + e ≥ any non-candidate. Then the top k is the t32 order with each
    run of ≥ 2 items re-sorted by float64 score (ties to the lower index): only those are
    re-scored. Queries where t_end ≤ θ_q + 2e take ``_certify`` (all near candidates
    re-scored).
    """
    lo, hi = block
    q, r, t = pool.prune(want, tau)
    k = R[lo:hi]
    if len(q) == 0:
        return lo + np.flatnonzero(k > 0)
    m, rank = hi - lo, _rank_within_runs(q)
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
        s = _pair_scores(f, lo + i, C[i, j])
        C[i, j] = C[i, j][np.lexsort((C[i, j], -s, run[i, j], i))]
    good, w = np.flatnonzero(ok), min(c, nbr.shape[1])
    nbr[lo + good, :w] = C[good, :w]
    rest = np.flatnonzero((k > 0) & ~ok)
    failed = _certify(f, lo + rest, C[rest], T[rest], tau[lo + rest].astype(np.float64), R, nbr)
    return _certify_wider(f, failed, R, nbr)


def _certify_wider(f: _Factors, g: np.ndarray, R: np.ndarray, nbr: np.ndarray) -> np.ndarray:
    """``_certify`` queries ``g`` again with 4 × (R + 4) candidates from a float32 row each.

    θ is the best t32 left out. Returns the queries still not certified.
    """
    n = len(f.x)
    failed = [np.empty(0, np.int64)]
    step = max(1, _CHUNK_BYTES // (4 * n))
    for start in range(0, len(g), step):
        gq = g[start : start + step]
        c = min(4 * (int(R[gq].max()) + _PAD_CPU), n - 2)
        if c < int(R[gq].max()):
            failed.append(gq)
            continue
        t = f.a[gq] @ f.b.T
        t[np.arange(len(gq)), gq] = -np.inf  # self
        top = np.argpartition(t, n - c - 1, axis=1)[:, n - c - 1 :]  # the c + 1 largest
        t_top = np.take_along_axis(t, top, 1).astype(np.float64)
        order = np.argsort(-t_top, axis=1, kind="stable")
        top, t_top = np.take_along_axis(top, order, 1), np.take_along_axis(t_top, order, 1)
        failed.append(_certify(f, gq, top[:, :c], t_top[:, :c], t_top[:, c], R, nbr))
    return np.concatenate(failed)


def _pair_scores(f: _Factors, q: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Canonical float64 scores of the pairs (q[i], r[i])."""
    step = max(1, _CHUNK_BYTES // (8 * f.x.shape[1]))
    parts = [
        f.score(f.rows(q[p : p + step]), r[p : p + step, None])[:, 0]
        for p in range(0, len(q), step)
    ]
    return np.concatenate(parts) if parts else np.empty(0)


def _certify(
    f: _Factors,
    g: np.ndarray,
    cand: np.ndarray,
    t32: np.ndarray,
    theta: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """Certify queries ``g`` by re-scoring candidates; write their top R; return the failures.

    ``cand``/``t32``: each query's candidates (−1: none) sorted by t32 descending; ``theta``:
    a bound on the t32 of every non-candidate. Only candidates with t32 ≥ T_k − 2·e32 are
    re-scored (T_k: the k-th best t32, k = R): any other has t64 < T_k − e32 ≤ the t64 of each
    of the k candidates with t32 ≥ T_k. Then the k-th best t64 must exceed θ + e32
    (``_knn_numpy``).
    """
    failed = [np.empty(0, np.int64)]
    step = max(1, _CHUNK_BYTES // (8 * max(1, cand.shape[1]) * f.x.shape[1]))
    for start in range(0, len(g), step):
        rows = slice(start, start + step)
        gq, k = g[rows], R[g[rows]]
        t_k = t32[rows][np.arange(len(gq)), k - 1]
        idx = np.where(t32[rows] >= (t_k - 2 * f.e32[gq])[:, None], cand[rows], -1)
        valid = idx >= 0
        s = f.score(f.rows(gq), np.where(valid, idx, gq[:, None]))
        s, idx = _sort_by_score_then_index(np.where(valid, s, -np.inf), idx, len(f.x))
        kth = s[np.arange(len(gq)), k - 1] - f.shift(gq)
        ok = kth > theta[rows] + f.e32[gq]
        w = min(idx.shape[1], nbr.shape[1])
        nbr[gq[ok], :w] = idx[ok, :w]
        failed.append(gq[~ok])
    return np.concatenate(failed)


def _rank_exactly(f: _Factors, queries: np.ndarray, R: np.ndarray, nbr: np.ndarray) -> None:
    """Exact top R of ``queries`` over all items, in chunks of 64 queries.

    Float64 GEMM scores find each query's k-th best g_k; every item with GEMM score
    ≥ g_k − 2·e64 is re-scored canonically and the best k are taken (ties to the lower index).
    Exact: a skipped item has canonical score < g_k − e64 ≤ the canonical score of each of the
    k items whose GEMM score is ≥ g_k, and those k are all re-scored.
    """
    n, d = f.x.shape
    for start in range(0, len(queries), 64):
        g = queries[start : start + 64]
        q_rows, k = f.rows(g), R[g]
        step = max(1, _CHUNK_BYTES // (8 * max(len(g), d)))
        best = np.full((len(g), int(k.max())), -np.inf)
        for lo in range(0, n, step):  # pass 1: k-th best GEMM score
            s = _gemm_without_self(f, q_rows, g, lo, min(lo + step, n))
            both = np.concatenate([best, s], axis=1)
            best = np.partition(both, both.shape[1] - best.shape[1], axis=1)[:, -best.shape[1] :]
        best = -np.sort(-best, axis=1)
        floor = best[np.arange(len(g)), k - 1] - 2 * f.e64[g]
        hits_q, hits_r = [], []
        for lo in range(0, n, step):  # pass 2: everything that can be in the top k
            s = _gemm_without_self(f, q_rows, g, lo, min(lo + step, n))
            i, j = np.nonzero(s >= floor[:, None])
            hits_q.append(i)
            hits_r.append(lo + j)
        _write_best(f, g, q_rows, np.concatenate(hits_q), np.concatenate(hits_r), k, nbr)


def _gemm_without_self(
    f: _Factors, q_rows: np.ndarray, g: np.ndarray, lo: int, hi: int
) -> np.ndarray:
    s = f.gemm_score(q_rows, lo, hi)
    own = (g >= lo) & (g < hi)
    s[np.flatnonzero(own), g[own] - lo] = -np.inf
    return s


def _write_best(
    f: _Factors,
    g: np.ndarray,
    q_rows: np.ndarray,
    i: np.ndarray,
    r: np.ndarray,
    k: np.ndarray,
    nbr: np.ndarray,
) -> None:
    """nbr[g[i]] ← the k best of the pairs (g[i], r) by canonical score, ties by index."""
    step = max(1, _CHUNK_BYTES // (8 * q_rows.shape[1]))
    s = np.concatenate(
        [
            f.score(q_rows[i[p : p + step]], r[p : p + step, None])[:, 0]
            for p in range(0, len(i), step)
        ]
    )
    order = np.lexsort((r, -s, i))
    i, r = i[order], r[order]
    rank = _rank_within_runs(i)
    top = rank < k[i]
    nbr[g[i[top]], rank[top]] = r[top]


_PAD = 8  # extra float32 candidates per query before the float64 re-ranking (torch path)


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
