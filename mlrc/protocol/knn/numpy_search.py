"""The numpy search (the CPU path): symmetric float32 GEMM tiles, candidate pools, certificates.

Float32 similarities t32 = a_q·b_r ≈ s + offset (larger = nearer, :mod:`.space`), computed with
numpy's BLAS (no TF32 or bfloat16 there) over the upper triangle of the score matrix; the pools
(:mod:`.pools`) keep each query's best candidates, the certificates (:mod:`.certify`) prove the
exact top k_q from them, and the queries left unproven go to the exact fallback
(:mod:`.fallback`). Result: each query's R nearest other items, by exact d ascending, ties to
the lower index, its own row excluded. Tile, strip and pool sizes: :mod:`.tuning`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mlrc.protocol.knn.certify import certified_top_k
from mlrc.protocol.knn.fallback import exact_top, rank_all_exactly
from mlrc.protocol.knn.pools import PAD_CPU, Pool
from mlrc.protocol.knn.space import Factors, Space, numpy_factors
from mlrc.protocol.knn.tuning import current_tuning


def blocks_numpy(space: Space, k: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``exact_neighbours`` on CPU: the top k_q of every query at once, then in row blocks."""
    nbr = knn_numpy(numpy_factors(space), k)
    step = max(1, 2**18 // nbr.shape[1])
    for lo in range(0, len(nbr), step):
        yield np.arange(lo, min(lo + step, len(nbr))), nbr[lo : lo + step]


def knn_numpy(f: Factors, R: np.ndarray) -> np.ndarray:
    """Each query's R nearest other items (n × max R int32, ranks > R unset), exact.

    Only ranks ≤ R enter MAP@R, R-Precision and P@1, so query q needs its top k_q = R_q.

    Search: float32 t32 = a_q·b_r (:mod:`.space`) with numpy BLAS over the upper triangle of
    tile × tile tiles: t is symmetric, so a tile (I, J) serves the queries of I and, read by
    columns, those of J (half the work of a full search). Each query q has a pool of candidates
    and a float32 threshold τ_q that only rises. The diagonal tile gives q the entries of its
    own block at or above its c-th best (c ≥ c_q = R_q + 4); the other tiles add the entries
    with t32 > τ_q; a pool that outgrows Σc_q + pool_slack, and each pool after its diagonal
    tile, is pruned to the best c_q per query and τ_q raised to the c_q-th kept t32. When the
    queries need many candidates relative to n (``_tile_width``) there is one tile of full rows
    and each strip of queries is finished at once. Every entry ever left out was at or below
    the τ_q of that moment, so each item r that is not a candidate of q has t32(q, r) ≤ θ_q,
    the final τ_q.

    Why this is exact: |t32 − (s + offset)| ≤ e32_q for every pair, s = −d/2 the exact
    ranking score (:mod:`.space`), so a non-candidate has s + offset ≤ θ_q + e32_q. If k_q
    candidates have s + offset > θ_q + e32_q, no non-candidate can be in the top k_q, and the
    candidates sorted by s (ties to the lower index) give the exact top k_q.
    ``certified_top_k`` proves this mostly from the float32 scores alone (computing s only
    for near-tied candidates), else from s of the near candidates (``certify``, then with 4×
    more candidates, ``certify_wider``). Queries still unproven (many exact copies, ties at
    the boundary) are ranked by the exact fallback; so are all queries when float32 could
    overflow, or when at most a quarter of the rows are distinct (identical or duplicated
    inputs: the float32 search could prove almost nothing).

    Memory: the float32 factors (4 bytes per entry, 8 centred), a GEMM buffer no larger than
    them (128 to 2048 rows), a mask of ≤ 512 × tile bytes, the pools (12 bytes per triple,
    about Σc_q + pool_slack per block) and the n × max R result.
    """
    n = len(R)
    nbr = np.full((n, int(R.max())), -1, np.int32)
    want = np.where(R > 0, np.minimum(R + PAD_CPU, n - 1), 0)
    if rank_all_exactly(f.space):
        _rank_exactly(f, np.flatnonzero(R > 0), R, nbr)
        return nbr
    tau = np.where(R > 0, -np.inf, np.inf).astype(np.float32)  # R = 0: never a candidate
    tile = _tile_width(n, want)
    blocks = [(lo, min(lo + tile, n)) for lo in range(0, n, tile)]
    search = _one_tile if len(blocks) == 1 else _upper_triangle
    failed = search(f, blocks, want, tau, R, nbr)
    _rank_exactly(f, failed, R, nbr)
    return nbr


def _rank_exactly(f: Factors, queries: np.ndarray, R: np.ndarray, nbr: np.ndarray) -> None:
    """nbr[q, :R_q] ← the exact top R_q of each query q in ``queries`` (the exact fallback)."""
    if len(queries):
        top = exact_top(f.space, queries.astype(np.int64), R[queries].astype(np.int64))
        nbr[queries, : top.shape[1]] = top


def _one_tile(
    f: Factors,
    blocks: list[tuple[int, int]],
    want: np.ndarray,
    tau: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """Full rows (one tile): each strip of queries is certified as soon as it is computed."""
    strip = current_tuning().strip
    step = _gemm_rows(f, f.n)
    mask = np.empty(min(step, strip) * f.n, np.bool_)
    jobs = [(0, 0, g0) for g0 in range(0, f.n, step)]
    failed = []
    for (_, _, g0), t in _gemm_stream(f, jobs, blocks, step):
        for s0 in range(0, len(t), strip):
            rows, pool = (g0 + s0, g0 + min(s0 + strip, len(t))), Pool(0)
            _diagonal_strip(rows, blocks[0], pool, want, tau, t[s0 : s0 + strip], mask)
            failed.append(certified_top_k(f, rows, pool, want, tau, R, nbr))
    return np.concatenate(failed)


def _upper_triangle(
    f: Factors,
    blocks: list[tuple[int, int]],
    want: np.ndarray,
    tau: np.ndarray,
    R: np.ndarray,
    nbr: np.ndarray,
) -> np.ndarray:
    """The tiles (I, J ≥ I), diagonal ones first; a block is certified once all its tiles are
    done. Returns the queries left unproven."""
    strip, slack = current_tuning().strip, current_tuning().pool_slack
    step = _gemm_rows(f, blocks[0][1])
    pools = [Pool(int(want[lo:hi].sum()) + slack) for lo, hi in blocks]
    jobs = [(i, i, g0) for i, (lo, hi) in enumerate(blocks) for g0 in range(lo, hi, step)]
    jobs += [
        (i, j, g0)
        for i, (lo, hi) in enumerate(blocks)
        for j in range(i + 1, len(blocks))
        for g0 in range(lo, hi, step)
    ]
    # tiles still to come that feed block b's pool (as rows or as columns)
    left = np.bincount([b for i, j, _ in jobs for b in {i, j}], minlength=len(blocks))
    mask = np.empty(min(step, strip) * blocks[0][1], np.bool_)
    failed = []
    for (i, j, g0), t in _gemm_stream(f, jobs, blocks, step):
        for s0 in range(0, len(t), strip):
            rows, part = (g0 + s0, g0 + min(s0 + strip, len(t))), t[s0 : s0 + strip]
            if i == j:
                _diagonal_strip(rows, blocks[i], pools[i], want, tau, part, mask)
            else:
                _off_diagonal_strip(rows, blocks[j], (pools[i], pools[j]), want, tau, part, mask)
        if i == j and g0 + len(t) == blocks[i][1]:  # the diagonal tile is done
            pools[i].prune(want, tau)
        for b in {i, j}:
            left[b] -= 1
            if left[b] == 0:  # block b has all its candidates
                failed.append(certified_top_k(f, blocks[b], pools[b], want, tau, R, nbr))
                pools[b] = Pool(0)  # free
    return np.concatenate(failed)


def _tile_width(n: int, want: np.ndarray) -> int:
    """The tile, or n (one tile: full rows, no pools to merge) when the queries need so many
    candidates that merging pools would cost more than the second half of the GEMM."""
    needed, tuning = want[want > 0], current_tuning()
    return n if n <= tuning.dense_per_candidate * needed.mean() else min(n, tuning.tile)


def _gemm_rows(f: Factors, width: int) -> int:
    """Rows per GEMM: as many as fit a buffer no larger than the float32 factors (one GEMM of
    2048 rows runs faster than four of 512), 128 to the tile, a multiple of 128."""
    rows = f.a.nbytes // (4 * width) // 128 * 128
    return min(len(f.a), max(128, min(current_tuning().tile, rows)))


def _gemm_stream(
    f: Factors, jobs: list[tuple[int, int, int]], blocks: list[tuple[int, int]], step: int
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
    pool: Pool,
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
    pools: tuple[Pool, Pool],
    want: np.ndarray,
    tau: np.ndarray,
    t: np.ndarray,
    mask_buf: np.ndarray,
) -> None:
    """t32 of queries rows × references cols: entries above τ go to both sides' pools.

    One comparison with a floor at or below both sides' thresholds (per group of ``strip``
    columns: the lowest τ of the strip's rows and of the group's columns, so one query with a
    low τ does not open the whole tile), then the few entries above it are split by each
    side's own threshold.
    """
    (r0, r1), (c0, c1) = rows, cols
    groups = np.arange(0, c1 - c0, current_tuning().strip)
    col_floor = np.minimum.reduceat(tau[c0:c1], groups)
    floor = np.repeat(np.minimum(col_floor, tau[r0:r1].min()), np.diff(groups, append=c1 - c0))
    i, j, ts = _above(t, floor[None, :], mask_buf)
    row = ts > tau[r0 + i]
    pools[0].add_and_prune(r0 + i[row], c0 + j[row], ts[row], want, tau)
    col = ts > tau[c0 + j]
    pools[1].add_and_prune(c0 + j[col], r0 + i[col], ts[col], want, tau)
