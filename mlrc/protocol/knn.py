"""Exact k-nearest neighbours for the retrieval metrics: the ranking and its certified search.

Public API: :func:`exact_neighbours` (each query's k_q nearest other items, in blocks — what
:mod:`mlrc.protocol.metrics` reads), :func:`exact_knn` (k nearest of some queries, for
:mod:`mlrc.protocol.analysis`), :func:`ranked_vectors` (the vectors ranked), the input helpers
:func:`to_tensor`, :func:`check_embeddings`, :func:`is_finite`, and :func:`full_fp32_matmul`
(the matmul precision every torch matmul here runs under). Everything else is private.

The query set *is* the reference set and each query's own row is excluded from its neighbours
(by index, so a duplicate embedding of another item still counts).

The ranking, identical on every device and in every code path (``ranked_vectors``,
``_sq_dist``):

- the ranked vectors v are the rows in float64, with ``normalize`` divided by their norm
  √(Σ_k x_k²), the sum taken left to right after an exact power-of-two scaling of the row (so
  no square overflows or underflows; for rows of ordinary size this is bit for bit the plain
  ``x / sqrt(sum)``). A zero row stays zero: it is at distance ‖v_r‖ from every r;
- reference r comes before r' for query q if d(q, r) < d(q, r'), or if they are equal and
  r < r' (ties to the lower index), where d(q, r) = Σ_k (v_qk − v_rk)² is evaluated as a plain
  float64 loop: each difference, square and partial sum rounded once, k = 1, 2, … in order,
  no fused multiply-add. On unit vectors this is the order of cosine similarity.

So every tie — collinear vectors of different norms, duplicates, integer embeddings, a
collapsed model — is broken the same way on CPU and GPU. Why the distance and not the dot
product (the same order in exact arithmetic): on collapsed embeddings 1 − v_q·v_r is ~1e-12,
where float64 dot products near 1 keep a few bits and their order depends on the summation
order; differences of nearby coordinates are exact, so d keeps its full relative precision.

How (both paths): a float32 search proposes candidates, d is evaluated exactly as above only
where a rounding bound cannot prove the order (the bound assumes IEEE float32 products and sums:
torch matmuls run under :func:`full_fp32_matmul`, whatever TF32 or bfloat16 setting the process
has; numpy's BLAS has none) (CPU: ``_knn_numpy``, numpy BLAS over the upper
triangle of the score matrix; other devices: ``_knn_block`` with torch). The float32 scores are
taken relative to the mean vector when that tightens the bound, so collapsed embeddings are
separated in float32 too. Queries still unproven are ranked by ``_exact_top``: float64 scores
of each distinct vector against the distinct vectors (identical rows are scored once), the
exact d where they cannot decide, then index tie-breaks — vectorised and blocked. The argument
for exactness is in ``_space`` (the bound), ``_knn_numpy`` and ``_certified_top_k`` (the
certificates) and ``_group_lists`` (the fallback).
"""

# Hand-written rather than faiss or PML's AccuracyCalculator: faiss (and so PML) ranks in float32,
# which orders near-ties differently (metrics off by ~1e-7 on clustered sets, up to ~7e-4 on
# collapsed ones), while this search is exact and measured faster at SOP size (60,502 × 128:
# 14.7 s vs PML's 77 s, 72 MB vs 6,571 MB peak; level at CUB size): docs/guide/performance.md.

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

# Bytes of one float32 score block (queries × references) computed at a time (torch path and
# the exact ranking).
_BLOCK_BYTES = 256 * 2**20

# CPU path: rows (= columns) of one float32 similarity tile, candidates kept per query beyond
# its R, and bytes of the float64 temporaries of the re-ranking.
_TILE = 2048
_STRIP = 512  # rows of a tile compared with the thresholds at a time (and GEMM rows, small n)
_PAD_CPU = 4
_POOL_SLACK = 2**15  # triples a pool may hold beyond Σc_q before it is pruned
_DENSE_PER_CANDIDATE = 100  # one full-width tile if n ≤ this × mean c_q (see _tile_width)
_CHUNK_BYTES = 4 * 2**20
_PAIR_BYTES = 16 * 2**20  # float64 temporaries of one chunk of exact distances
_DISTINCT_SHARE = 0.25  # at most this share of distinct rows: rank all queries exactly at once
_NUMPY_ON_CPU = True  # False: the torch path also on CPU (tests)
_PAD = 8  # extra float32 candidates per query before the exact re-ranking (torch)

_U32 = 2.0**-24  # unit roundoff of float32
_U64 = 2.0**-53  # unit roundoff of float64

ArrayLike = np.ndarray | torch.Tensor


@contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """Torch float32 matmuls in full IEEE fp32 inside the block — no TF32 on CUDA, no TF32 or
    bfloat16 passes in oneDNN on CPU (``torch.set_float32_matmul_precision("highest")``) — and
    the caller's settings restored after it, whichever API set them (the legacy
    ``set_float32_matmul_precision``/``allow_tf32`` or the per-backend ``fp32_precision``).
    Process-wide while it lasts (torch has no per-thread switch); convolutions (cuDNN) are not
    involved: the k-NN has none."""
    cuda = torch.backends.cuda.matmul.fp32_precision  # these two getters never raise
    mkldnn = torch.backends.mkldnn.matmul.fp32_precision
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # the caller mixed the two APIs: match the legacy value to CUDA's
        legacy = "high" if cuda == "tf32" else "highest"
    torch.set_float32_matmul_precision("highest")  # legacy and both backends, consistently
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(legacy)
        torch.backends.cuda.matmul.fp32_precision = cuda
        torch.backends.mkldnn.matmul.fp32_precision = mkldnn


def to_tensor(a: ArrayLike, device: str | torch.device | None) -> torch.Tensor:
    """``a`` as a tensor (numpy arrays share memory, made contiguous; tensors detached), moved
    to ``device`` if one is given. Dtype unchanged."""
    t = a.detach() if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device) if device is not None else t


def is_finite(x: torch.Tensor) -> bool:
    """True if no entry of ``x`` is NaN or ±inf (CPU tensors are checked in numpy, ``_backend``)."""
    xb = _backend(x)
    return bool((np.isfinite(xb) if isinstance(xb, np.ndarray) else torch.isfinite(xb)).all())


def check_embeddings(x: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``x`` is n × d and finite and ``labels`` has n entries."""
    if x.ndim != 2 or x.shape[0] != labels.shape[0]:
        raise ValueError(
            f"need embeddings (n, d) and labels (n,), got {tuple(x.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if not is_finite(x):
        raise ValueError("embeddings contain NaN or infinite values")


def exact_neighbours(
    x: torch.Tensor, k: np.ndarray, *, normalize: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each query's k_q nearest other items, exact (module docstring), in blocks of queries.

    ``x``: the embeddings (n × d, float32 or float64, finite), ranked on their device;
    ``k``: (n,) integers, k_q ≤ n − 1 neighbours needed by query q (0: q is not a query), at
    least one k_q > 0; ``normalize``: rank the L2-normalised rows (``ranked_vectors``).

    Yields ``(queries, nbr)``, numpy integer arrays covering every query once: ``nbr[i, j]`` is
    the (j + 1)-th nearest other item of query ``queries[i]`` for j < k_q, ties to the lower
    index; later columns are unspecified (−1 or further neighbours). CPU (numpy): one search of
    every query's top k_q (``_knn_numpy``), yielded in blocks of ≤ 2¹⁸ entries; other devices
    (torch): blocks of ≤ 256 MiB of float32 scores, each ranked to max k_q + 1.
    """
    space = _space(ranked_vectors(x, normalize=normalize), normalize)
    if x.device.type == "cpu" and _NUMPY_ON_CPU:
        yield from _blocks_numpy(space, k)
    else:
        yield from _blocks_torch(space, k)


def exact_knn(
    x32: torch.Tensor, x64: torch.Tensor, q: torch.Tensor, k: int, normalize: bool
) -> torch.Tensor:
    """Indices (len(q) × k) of each query's k nearest other items, exact, ties to lower index.

    ``x64``: the ranked vectors (n × d float64, e.g. ``ranked_vectors``; used as given),
    ``x32``: the same in float32, ``q``: query indices, all on one device. Ranking: ascending
    float64 squared distance Σ_k (x_qk − x_rk)² summed left to right (module docstring), the
    same quantity on every device. ``normalize``: the rows are unit vectors (a tighter
    float32 factorisation may be used); either value gives the same result. Builds the
    float32 factors each call (O(n·d)); see ``_knn_block``.
    """
    return _knn_block(_space(x64, normalize, x32), q, k)


def ranked_vectors(x: torch.Tensor, *, normalize: bool = True) -> torch.Tensor:
    """The vectors neighbours are ranked by: float64 rows (n × d), L2-normalised if asked.

    Normalising: row / √(Σ_k row_k²) with the sum taken left to right, each term rounded once,
    after scaling the row by the power of two that brings its largest |entry| into [0.5, 1)
    (exact, so for rows whose squares neither overflow nor underflow the result is bit for bit
    ``row / sqrt(sum)`` unscaled). Zero rows stay zero; −0.0 becomes +0.0. Same device as x.
    """
    x64 = x.double()
    v = _backend(x64)
    if not normalize:
        return _as_torch(v + 0.0)
    out = v * 1.0 if x64 is x else v  # written chunk by chunk (never into the caller's x)
    for rows in _row_chunks(v):
        y = v[rows] * _power_of_two(-_row_exponents(v[rows]))[:, None]
        norm = _correct_sqrt(_sum_rows_left_to_right(y * y))  # ≥ 0.5 unless the row is 0
        out[rows] = y / _where(norm > 0, norm, 1.0)[:, None] + 0.0
    return _as_torch(out)


def _blocks_numpy(space: _Space, k: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``exact_neighbours`` on CPU: the top k_q of every query at once, then in row blocks."""
    nbr = _knn_numpy(_factors(space), k)
    step = max(1, 2**18 // nbr.shape[1])
    for lo in range(0, len(nbr), step):
        yield np.arange(lo, min(lo + step, len(nbr))), nbr[lo : lo + step]


def _blocks_torch(space: _Space, k: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``exact_neighbours`` with torch on the space's device, every query to max k_q + 1
    (PML's k = the largest class size when k_q = R_q), blocks of _BLOCK_BYTES of scores."""
    n, device = space.n, space.v.device
    k_all = int(min(int(k.max()) + 1, n - 1))
    block = max(1, _BLOCK_BYTES // (4 * n))
    # few distinct rows, or float32 could overflow: all exactly at once
    at_once = not space.fits32 or space.distinct <= _DISTINCT_SHARE * n
    for start in range(0, n, block):
        q = torch.arange(start, min(start + block, n), device=device)
        nn_idx = _exact_top_torch(space, q, k_all) if at_once else _knn_block(space, q, k_all)
        yield q.cpu().numpy(), nn_idx.cpu().numpy()


def _row_chunks(a: ArrayLike) -> Iterator[slice]:
    """Row slices of a numpy array with about _CHUNK_BYTES of float64 each (temporaries stay
    in cache); a tensor (GPU) in one piece."""
    n = a.shape[0]
    step = max(1, _CHUNK_BYTES // (8 * a.shape[1])) if isinstance(a, np.ndarray) else max(n, 1)
    return (slice(lo, lo + step) for lo in range(0, n, step))


def _backend(t: torch.Tensor) -> ArrayLike:
    """A CPU tensor as a numpy array (same memory), any other as it is.

    On CPU the elementwise work runs in numpy: each small torch op is a parallel region, and on
    a busy machine one of them can wait tens of milliseconds for a thread.
    """
    return t.numpy() if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t


def _as_torch(a: ArrayLike) -> torch.Tensor:
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def _row_exponents(v: ArrayLike) -> ArrayLike:
    """int64 e per row with max_k |v_k| = m·2^e, m in [0.5, 1) (e = 0 for zero rows)."""
    if isinstance(v, np.ndarray):
        return np.frexp(np.abs(v).max(1))[1].astype(np.int64)
    return torch.frexp(v.abs().amax(1))[1].long()


def _float32(a: ArrayLike) -> ArrayLike:
    return a.astype(np.float32) if isinstance(a, np.ndarray) else a.float()


def _contiguous(a: ArrayLike) -> ArrayLike:
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a.contiguous()


def _where(condition: ArrayLike, a: ArrayLike, b: float) -> ArrayLike:
    return np.where(condition, a, b) if isinstance(a, np.ndarray) else torch.where(condition, a, b)


def _concat(parts: list[ArrayLike]) -> ArrayLike:
    return np.concatenate(parts) if isinstance(parts[0], np.ndarray) else torch.cat(parts)


def _correct_sqrt(a: ArrayLike) -> ArrayLike:
    """Correctly rounded √a: numpy's and CUDA's double sqrt are, torch's CPU kernel can be
    1 ulp off (so CPU tensors never reach it here)."""
    return np.sqrt(a) if isinstance(a, np.ndarray) else a.sqrt()


def _power_of_two(e: ArrayLike) -> ArrayLike:
    """2.0**e exactly (float64, e clamped to the normal range): built from its bits, since
    ``pow`` and ``ldexp`` need not be exact on every device."""
    bits = (e.clip(-1022, 1023) + 1023) << 52
    return bits.view(np.float64) if isinstance(bits, np.ndarray) else bits.view(torch.float64)


def _sum_rows_left_to_right(a: ArrayLike) -> ArrayLike:
    """Σ_k a[i, k] of each row (m × d numpy array or tensor; a may be overwritten), k = 0, 1, …
    in order, one rounding per addition.

    Hand-written: numpy's pairwise sum, BLAS and torch's reductions each use their own order.
    numpy's ``add.accumulate`` is this recurrence by definition; torch's ``cumsum`` is a
    parallel scan on CUDA, so there the columns are added one by one.
    """
    if isinstance(a, np.ndarray):
        return np.add.accumulate(a, axis=1, out=a)[:, -1].copy()
    columns = a.T.contiguous()
    acc = columns[0] + 0.0
    for column in columns[1:]:
        acc += column
    return acc


def _sq_dist(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """Exact ranking distances Σ_k (a_k − b_k)² of the rows of a and b (m × d, float64).

    Left to right in k, each operation rounded once (no FMA): what a plain float64 loop gives,
    on numpy and on torch alike.
    """
    diff = a - b
    diff *= diff
    return _sum_rows_left_to_right(diff)


def _pair_scores(v: ArrayLike, q: ArrayLike, r: ArrayLike) -> ArrayLike:
    """Exact scores s = −d(q_i, r_i)/2 of the pairs of 1-D indices (q_i, r_i), float64.

    ``v``: the ranked vectors (n × d), numpy or torch like the indices.
    """
    step = max(1, _PAIR_BYTES // (24 * v.shape[1]))
    parts = [
        -0.5 * _sq_dist(v[q[p : p + step]], v[r[p : p + step]]) for p in range(0, len(q), step)
    ]
    if isinstance(v, torch.Tensor):
        return torch.cat(parts) if parts else v.new_empty(0)
    return np.concatenate(parts) if parts else np.empty(0)


def _gamma(m: int, u: float) -> float:
    """Higham's γ_m = m·u/(1 − m·u): relative error bound of an m-term dot product."""
    return m * u / (1 - m * u)


@dataclass
class _Groups:
    """Items grouped by identical ranked vector (numpy int64): identical rows tie with everyone
    alike, so the exact ranking scores each distinct vector once."""

    group: np.ndarray  # (n,) group of each item
    members: np.ndarray  # (n,) items sorted by (group, index)
    starts: np.ndarray  # (U,) where each group's members begin in ``members``
    counts: np.ndarray  # (U,) items per group

    @property
    def reps(self) -> np.ndarray:
        """(U,) each group's lowest item."""
        return self.members[self.starts]


@dataclass
class _Approx:
    """Float64 scores of the distinct vectors relative to their mean, for ``_exact_top``.

    t(g, h) = w_g·w_h − ‖w_g‖²/2 − ‖w_h‖²/2 with w = v − mean (rounded), computed by matrix
    products: |t − s| ≤ e64_g for the exact score s = −d/2 (bound in ``_approx``).
    """

    w: np.ndarray  # U × d float64
    half_sq: np.ndarray  # (U,) ‖w‖²/2
    e64: np.ndarray  # (U,) bound per query group


@dataclass
class _Space:
    """The ranked vectors and the float32 search factors over them (torch, one device).

    The float32 score t32 = a_q·b_r approximates s(q, r) + offset, s = −d(q, r)/2, within
    e32_q for every r (``_space``); a and b may be the same tensor. The exact ranking
    (``_exact_top``) works on a CPU copy, in numpy.
    """

    v: torch.Tensor  # n × d float64: the ranked vectors
    a: torch.Tensor  # n × D float32
    b: torch.Tensor  # n × D float32
    offset: float
    e32: torch.Tensor  # (n,) float64
    fits32: bool  # float32 scores cannot overflow
    _cpu: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return self.v.shape[0]

    @property
    def v_np(self) -> np.ndarray:
        """v as a numpy array (the same memory on CPU)."""
        if "v" not in self._cpu:
            self._cpu["v"] = self.v.cpu().numpy()
        return self._cpu["v"]

    @property
    def groups(self) -> _Groups:
        if "groups" not in self._cpu:
            self._cpu["groups"] = _row_groups(self.v_np)
        return self._cpu["groups"]

    @property
    def distinct(self) -> int:
        """Number of distinct ranked vectors."""
        return len(self.groups.starts)

    @property
    def approx(self) -> _Approx:
        if "approx" not in self._cpu:
            self._cpu["approx"] = _approx(self.v_np[self.groups.reps])
        return self._cpu["approx"]


def _space(v: torch.Tensor, normalize: bool, x32: torch.Tensor | None = None) -> _Space:
    """The float32 factors of the ranked vectors v (n × d float64), and their error bounds.

    Two factorisations of t32 ≈ s + offset, s = −d(q, r)/2, the one with the smaller mean β_q
    (β_q ≥ Σ_k |a_qk||b_rk| for every r; the error grows with it):

    - unit (normalised rows, all of norm 1 ± 2⁻⁴⁰): a = b = v, t = v_q·v_r = s + 1 + O(2⁻⁴⁰),
      β = 1;
    - centred: w = v − mean(v), a = [w, −‖w‖²/2, 1], b = [w, 1, −‖w‖²/2], t = −‖w_q − w_r‖²/2
      = s (offset 0), β_q = (‖w_q‖ + max‖w‖)²/2 — tiny for collapsed embeddings, whose float32
      scores then still separate them.

    Bound (u = 2⁻²⁴, Higham, Accuracy and Stability, §3.1, any summation order, FMA or not):
    rounding the factors to float32 moves t by ≤ (2u + u²)β and the float32 dot product adds
    ≤ γ_D(1 + u)²β, D = number of factor columns; everything float64 (w, ‖w‖², the exact d,
    the 2⁻⁴⁰ of the unit rows) adds < 4γ_{d+2}(2⁻⁵³)β + 2⁻³⁸β, far below the slack of
    e32 = 2(γ_D + 3u)β (plus D·2⁻¹²⁵ for flushed subnormals). ``x32``: v in float32, if the
    caller already has it.
    """
    xv = _backend(v)
    with np.errstate(over="ignore", invalid="ignore"):  # too large for float32: fits32 False
        mean = xv.mean(0)
        sq, w_sq = _squared_norms(xv, mean)
        w_norm = w_sq**0.5
        beta = (w_norm + w_norm.max()) ** 2 / 2
        if normalize and float(abs(sq - 1.0).max()) <= 2.0**-40 and float(beta.mean()) >= 1:
            a = b = _backend(x32) if x32 is not None else _float32(xv)
            beta, offset = sq * 0 + 1.0, 1.0
        else:
            a, b = _centred_factors(xv, mean, w_sq)
            offset = 0.0
        beta = beta * (1.0 + 2.0**-40)  # β itself computed in float64
        D = a.shape[1]
        e32 = 2 * (_gamma(D, _U32) + 3 * _U32) * beta + D * 2.0**-125
        finite = np.isfinite if isinstance(a, np.ndarray) else torch.isfinite
        fits32 = bool(finite(a).all() and finite(b).all() and float(beta.max()) < 2.0**120)
    a_t = _as_torch(a)
    b_t = a_t if b is a else _as_torch(b)
    return _Space(v, a_t, b_t, offset, _as_torch(e32), fits32)


def _squared_norms(v: ArrayLike, mean: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """‖v‖² and ‖v − mean‖² of each row, float64 (for bounds only: any summation order)."""
    sq, w_sq = [], []
    for rows in _row_chunks(v):
        w = v[rows] - mean
        sq.append((v[rows] * v[rows]).sum(1))
        w_sq.append((w * w).sum(1))
    return _concat(sq), _concat(w_sq)


def _centred_factors(v: ArrayLike, mean: ArrayLike, w_sq: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """Float32 a = [w, −‖w‖²/2, 1] and b = [w, 1, −‖w‖²/2], w = v − mean (n × (d + 2))."""
    n, d = v.shape
    if isinstance(v, np.ndarray):
        a, b = np.empty((n, d + 2), np.float32), np.empty((n, d + 2), np.float32)
    else:
        a = torch.empty((n, d + 2), dtype=torch.float32, device=v.device)
        b = torch.empty_like(a)
    for rows in _row_chunks(v):
        a[rows, :d] = b[rows, :d] = v[rows] - mean
        a[rows, d] = b[rows, d + 1] = -w_sq[rows] / 2
        a[rows, d + 1] = b[rows, d] = 1.0
    return a, b


def _row_groups(v: np.ndarray) -> _Groups:
    """Groups of identical rows of v (the ranked vectors, n × d): a 64-bit hash of each
    vector's bits, checked against the vectors (a collision falls back to comparing bytes)."""
    n, d = v.shape
    v = np.ascontiguousarray(v)
    keys = np.random.default_rng(0).integers(0, 2**63, d, dtype=np.uint64) * 2 + 1
    step = max(1, _CHUNK_BYTES // (8 * d))
    h = np.concatenate(  # Σ_k bits_k·key_k modulo 2⁶⁴ (uint64 arithmetic wraps)
        [(v[lo : lo + step].view(np.uint64) * keys).sum(1) for lo in range(0, n, step)]
    )
    _, group = np.unique(h, return_inverse=True)
    counts = np.bincount(group)
    members = np.argsort(group, kind="stable")
    starts = np.cumsum(counts) - counts
    shared = np.flatnonzero(counts[group] > 1)  # rows whose hash another row has
    if not np.array_equal(v[shared], v[members[starts][group[shared]]]):  # a hash collision
        rows = v.view(np.dtype((np.void, 8 * d))).reshape(n)
        _, group = np.unique(rows, return_inverse=True)
        counts = np.bincount(group)
        members = np.argsort(group, kind="stable")
        starts = np.cumsum(counts) - counts
    return _Groups(group.reshape(n).astype(np.int64), members, starts, counts)


def _approx(w_rows: np.ndarray) -> _Approx:
    """``_Approx`` of the distinct vectors ``w_rows`` (U × d, before centring).

    Bound: with β_g = (‖w_g‖ + max‖w‖)²/2, the matrix product errs by ≤ γ_d·2β, each ‖w‖²/2
    by ≤ γ_d·β, the two subtractions and the rounding of w by ≤ 8·2⁻⁵³β, the exact d by
    ≤ γ_{d+2}·β: all below e64 = 16γ_{d+3}(2⁻⁵³)β (+ d·2⁻¹⁰⁰⁰ for subnormals).
    """
    d = w_rows.shape[1]
    w = w_rows - w_rows.mean(0)
    half_sq = (w * w).sum(1) / 2
    norm = np.sqrt(2 * half_sq)
    beta = (norm + norm.max()) ** 2 / 2 * (1.0 + 2.0**-40)
    return _Approx(w, half_sq, 16 * _gamma(d + 3, _U64) * beta + d * 2.0**-1000)


@dataclass(frozen=True)
class _Factors:
    """The CPU path's numpy view of a ``_Space`` (same memory), see ``_knn_numpy``."""

    space: _Space
    v: np.ndarray  # n × d float64 ranked vectors
    a: np.ndarray  # n × D float32
    b: np.ndarray  # n × D float32
    e32: np.ndarray  # per query: bound on |t32 − (s + offset)|
    offset: float

    @property
    def n(self) -> int:
        return self.v.shape[0]

    @property
    def d(self) -> int:
        return self.v.shape[1]


def _factors(space: _Space) -> _Factors:
    a, b = space.a.numpy(), space.b.numpy()
    return _Factors(space, space.v_np, a, b, space.e32.numpy(), space.offset)


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
    """Each query's R nearest other items (n × max R int32, ranks > R unset), exact.

    Only ranks ≤ R enter MAP@R, R-Precision and P@1, so query q needs its top k_q = R_q.

    Search: float32 t32 = a_q·b_r (``_space``) with numpy BLAS over the upper triangle of
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

    Why this is exact: |t32 − (s + offset)| ≤ e32_q for every pair, s = −d/2 the exact
    ranking score (``_space``), so a non-candidate has s + offset ≤ θ_q + e32_q. If k_q
    candidates have s + offset > θ_q + e32_q, no non-candidate can be in the top k_q, and the
    candidates sorted by s (ties to the lower index) give the exact top k_q.
    ``_certified_top_k`` proves this mostly from the float32 scores alone (computing s only
    for near-tied candidates), else from s of the near candidates (``_certify``, then with 4×
    more candidates, ``_certify_wider``). Queries still unproven (many exact copies, ties at
    the boundary) are ranked by ``_rank_exactly``; so are all queries when float32 could
    overflow, or when at most a quarter of the rows are distinct (identical or duplicated
    inputs: the float32 search could prove almost nothing).

    Memory: the float32 factors (4 bytes per entry, 8 centred), a GEMM buffer no larger than
    them (128 to 2048 rows), a mask of ≤ 512 × tile bytes, the pools (12 bytes per triple,
    about Σc_q + _POOL_SLACK per block) and the n × max R result.
    """
    n = len(R)
    nbr = np.full((n, int(R.max())), -1, np.int32)
    want = np.where(R > 0, np.minimum(R + _PAD_CPU, n - 1), 0)
    if not f.space.fits32 or f.space.distinct <= _DISTINCT_SHARE * n:
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
    step = _gemm_rows(f, f.n)
    mask = np.empty(min(step, _STRIP) * f.n, np.bool_)
    jobs = [(0, 0, g0) for g0 in range(0, f.n, step)]
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

    c = the strip's largest c_q and v ≤ each row's c-th largest t32 (``_at_least_c_above``);
    the entries with t32 ≥ v are kept — at least c per row — so the pruning after the diagonal
    tile raises τ to ≥ v above every entry left out.
    """
    (r0, r1), (lo, hi) = rows, block
    c, m = int(want[r0:r1].max()), hi - lo
    if c == 0:
        return
    t[np.arange(r1 - r0), np.arange(r0 - lo, r1 - lo)] = -np.inf  # self
    floor = tau[r0:r1, None]
    if c < m - 1:
        v = _at_least_c_above(t, c)
        floor = np.maximum(floor, np.nextafter(v, np.float32(-np.inf)))  # t ≥ v
    i, j, ts = _above(t, floor, mask_buf)
    pool.add(r0 + i, lo + j, ts)


def _at_least_c_above(t: np.ndarray, c: int) -> np.ndarray:
    """Per row of t (m × w, c < w), a value v with at least c entries ≥ v, close to the c-th
    largest: the c-th largest of the maxima of 4c disjoint sets of columns (c distinct entries
    are ≥ it; set j = the columns ≡ j mod 4c). Hand-written: this max-reduction is ~10× cheaper
    than ``np.partition`` of every row, which dominated the search at CUB size."""
    blocks = min(4 * c, t.shape[1])
    width = t.shape[1] // blocks
    maxima = t[:, : blocks * width].reshape(len(t), width, blocks).max(1)
    return np.partition(maxima, blocks - c, axis=1)[:, blocks - c : blocks - c + 1]


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
    run holding rank k. With t64 = s + offset (s the exact score), items of different runs are
    ordered alike in t32 and t64 (they differ by > 2e); items after that run have
    t64 < t_end − e, and if t_end > θ_q + 2e every item up to t_end has t64 > θ_q + e ≥ any
    non-candidate. Then the top k is the t32 order with each run of ≥ 2 items re-sorted by s
    (ties to the lower index): only those get s. Queries where t_end ≤ θ_q + 2e take
    ``_certify`` (s of all near candidates).
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
        s = _pair_scores(f.v, lo + i, C[i, j])
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
    n = f.n
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


def _certify(
    f: _Factors,
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
    θ + e32 (``_knn_numpy``).
    """
    failed = [np.empty(0, np.int64)]
    step = max(1, _CHUNK_BYTES // (8 * max(1, cand.shape[1]) * f.d))
    for start in range(0, len(g), step):
        rows = slice(start, start + step)
        gq, k = g[rows], R[g[rows]]
        t_k = t32[rows][np.arange(len(gq)), k - 1]
        idx = np.where(t32[rows] >= (t_k - 2 * f.e32[gq])[:, None], cand[rows], -1)
        valid = idx >= 0
        s = np.full(idx.shape, -np.inf)
        s[valid] = _pair_scores(f.v, np.broadcast_to(gq[:, None], idx.shape)[valid], idx[valid])
        s, idx = _sort_by_score_then_index(s, idx, f.n)
        kth = s[np.arange(len(gq)), k - 1] + f.offset
        ok = kth > theta[rows] + f.e32[gq]
        w = min(idx.shape[1], nbr.shape[1])
        nbr[gq[ok], :w] = idx[ok, :w]
        failed.append(gq[~ok])
    return np.concatenate(failed)


def _rank_exactly(f: _Factors, queries: np.ndarray, R: np.ndarray, nbr: np.ndarray) -> None:
    """nbr[q, :R_q] ← the exact top R_q of each query q in ``queries`` (``_exact_top``)."""
    if len(queries):
        top = _exact_top(f.space, queries.astype(np.int64), R[queries].astype(np.int64))
        nbr[queries, : top.shape[1]] = top


def _exact_top_torch(space: _Space, q: torch.Tensor, k: int) -> torch.Tensor:
    """``_exact_top`` of queries q (a tensor), each its top k, on q's device."""
    top = _exact_top(space, q.cpu().numpy(), np.full(len(q), k, np.int64))
    return torch.from_numpy(top).to(q.device)


def _exact_top(space: _Space, queries: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Exact top k[i] of each query (len(queries) × max k int64, −1 beyond k[i]), ties to the
    lower index. Numpy, on the CPU copy of the ranked vectors.

    Queries with the same ranked vector share one ranking of all items (their own included):
    ``_group_lists`` gives each such group its best max k + 1, and each query takes them in
    order, skipping itself. Blocks of at most _BLOCK_BYTES / 48 bytes per item of groups.
    """
    groups = space.groups
    out = np.full((len(queries), int(k.max())), -1, np.int64)
    query_groups, inv = np.unique(groups.group[queries], return_inverse=True)
    inv = inv.reshape(-1)
    K = np.zeros(len(query_groups), np.int64)
    np.maximum.at(K, inv, k + 1)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(query_groups) + 1))
    block = max(1, _BLOCK_BYTES // (48 * space.n))
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


def _group_lists(space: _Space, gid: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Best K[i] items of the ranking from group gid[i]'s vector (m × max K, −1 padded).

    Float64 scores t of the group against every distinct vector (``_Approx``, |t − s| ≤ e64)
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
    s = _pair_scores(space.v_np, reps[gid[i]], reps[h])
    take = np.minimum(groups.counts[h], K[i])  # a group's lowest-index items come first
    pair = np.repeat(np.arange(len(i)), take)
    within = np.arange(len(pair)) - np.repeat(np.cumsum(take) - take, take)
    r = groups.members[groups.starts[h][pair] + within]
    row = i[pair]
    order = np.lexsort((r, -s[pair], row))  # by row, s descending, index
    row, r = row[order], r[order]
    rank = _rank_within_runs(row)
    keep = rank < K[row]
    lists = np.full((len(gid), int(K.max())), -1, np.int64)
    lists[row[keep], rank[keep]] = r[keep]
    return lists


def _knn_block(space: _Space, q: torch.Tensor, k: int) -> torch.Tensor:
    """``exact_knn`` of queries ``q`` (len(q) × k) in a prepared space.

    A float32 pass keeps the top c = k + 8 candidates and θ, the best float32 score left out;
    the candidates get their exact score s and are sorted (ties by index). Exact if the k-th
    best s + offset exceeds θ + e32_q: every non-candidate has s + offset ≤ θ + e32_q
    (``_space``). Queries where this fails retry once with 4× more candidates, then take
    ``_exact_top``.
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
        s = _pair_scores(space.v, qs.reshape(-1), cand.reshape(-1)).reshape(cand.shape)
        s, order = s.sort(dim=1, descending=True, stable=True)  # ties: index order
        sure = s[:, k - 1] + space.offset > theta + space.e32[q[todo]]
        best[todo[sure]] = cand.gather(1, order)[sure, :k]
        todo, c = todo[~sure], min(4 * c, n - 1)
        if len(todo) == 0:
            return best
    best[todo] = _exact_top_torch(space, q[todo], k)
    return best
