"""Exact k-nearest neighbours for the retrieval metrics: the ranking and its certified search.

Public API: :func:`exact_neighbours` (each query's k_q nearest other items, in blocks — what
:mod:`mlrc.protocol.metrics` reads), :func:`exact_knn` (k nearest of some queries, for
:mod:`mlrc.protocol.analysis`), :func:`ranked_vectors` (the vectors ranked), the input helpers
:func:`to_tensor`, :func:`check_embeddings`, :func:`is_finite`, :func:`full_fp32_matmul`
(the matmul precision every torch matmul here runs under), and two seams for tests and
benchmarks that change no result: :func:`tuned` and :func:`current_tuning` (:class:`Tuning`:
which backend ranks CPU tensors, block and tile sizes) and :func:`count_work` (:class:`Work`: exact distances,
certificates and fallbacks counted).

The query set *is* the reference set and each query's own row is excluded from its neighbours
(by index, so a duplicate embedding of another item still counts).

The ranking, identical on every device and in every code path (:mod:`.ranking`):

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
has; numpy's BLAS has none) (CPU: numpy BLAS over the upper triangle of the score matrix; other
devices: torch). The float32 scores are taken relative to the mean vector when that tightens
the bound, so collapsed embeddings are separated in float32 too. Queries still unproven are
ranked by the exact fallback: float64 scores of each distinct vector against the distinct
vectors (identical rows are scored once), the exact d where they cannot decide, then index
tie-breaks — vectorised and blocked.

The modules, in the order of that argument (the searches compare similarities, scores
s = −d/2 and their float32 estimates t32 ≈ s + offset, larger = nearer; the ranking is by d):

- :mod:`.ranking` — the ranked vectors and the exact distance d, scores s = −d/2;
- :mod:`.space` — the float32 factors a, b with a_q·b_r ≈ s + offset and the bound e32 on
  their error (the argument's first half);
- :mod:`.numpy_search` — the CPU path: symmetric GEMM tiles, with :mod:`.pools` (candidates
  and thresholds) and :mod:`.certify` (the certificates, the argument's second half);
- :mod:`.torch_search` — the other devices: blocks of queries, one certificate each;
- :mod:`.groups` and :mod:`.fallback` — identical rows grouped, and the exact ranking of what
  the float32 search cannot prove;
- :mod:`.arrays` — helpers shared by the numpy and torch code, and the input checks;
  :mod:`.tuning` and :mod:`.work` — the two seams.
"""

# Hand-written rather than faiss or PML's AccuracyCalculator: faiss (and so PML) ranks in float32,
# which orders near-ties differently (metrics off by ~1e-7 on clustered sets, up to ~7e-4 on
# collapsed ones), while this search is exact and measured faster at SOP size (60,502 × 128:
# 14.7 s vs PML's 77 s, 72 MB vs 6,571 MB peak; level at CUB size): docs/guide/performance.md.

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from mlrc.protocol.knn.arrays import (
    ArrayLike,
    check_embeddings,
    full_fp32_matmul,
    is_finite,
    to_tensor,
)
from mlrc.protocol.knn.numpy_search import blocks_numpy
from mlrc.protocol.knn.ranking import ranked_vectors
from mlrc.protocol.knn.space import build_space
from mlrc.protocol.knn.torch_search import blocks_torch, knn_block
from mlrc.protocol.knn.tuning import Tuning, current_tuning, tuned
from mlrc.protocol.knn.work import Work, count_work

__all__ = [
    "ArrayLike",
    "Tuning",
    "Work",
    "check_embeddings",
    "count_work",
    "current_tuning",
    "exact_knn",
    "exact_neighbours",
    "full_fp32_matmul",
    "is_finite",
    "ranked_vectors",
    "to_tensor",
    "tuned",
]


def exact_neighbours(
    x: torch.Tensor, k: np.ndarray, *, normalize: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each query's k_q nearest other items, exact (module docstring), in blocks of queries.

    ``x``: the embeddings (n × d, float32 or float64, finite), ranked on their device;
    ``k``: (n,) integers, k_q ≤ n − 1 neighbours needed by query q (0: q is not a query), at
    least one k_q > 0; ``normalize``: rank the L2-normalised rows (``ranked_vectors``).

    Yields ``(queries, nbr)``, numpy integer arrays covering every query once: ``nbr[i, j]`` is
    the (j + 1)-th nearest other item of query ``queries[i]`` for j < k_q, ties to the lower
    index; later columns are unspecified (−1 or further neighbours). CPU (numpy, unless
    :func:`tuned` says ``cpu_backend="torch"``): one search of every query's top k_q, yielded
    in blocks of ≤ 2¹⁸ entries; other devices (torch): blocks of ≤ 256 MiB of float32 scores,
    each ranked to max k_q + 1.
    """
    space = build_space(ranked_vectors(x, normalize=normalize), normalize)
    if x.device.type == "cpu" and current_tuning().cpu_backend == "numpy":
        yield from blocks_numpy(space, k)
    else:
        yield from blocks_torch(space, k)


def exact_knn(
    x32: torch.Tensor, x64: torch.Tensor, q: torch.Tensor, k: int, normalize: bool
) -> torch.Tensor:
    """Indices (len(q) × k) of each query's k nearest other items, exact, ties to lower index.

    ``x64``: the ranked vectors (n × d float64, e.g. ``ranked_vectors``; used as given),
    ``x32``: the same in float32, ``q``: query indices, all on one device. Ranking: ascending
    float64 squared distance Σ_k (x_qk − x_rk)² summed left to right (module docstring), the
    same quantity on every device. ``normalize``: the rows are unit vectors (a tighter
    float32 factorisation may be used); either value gives the same result. Builds the
    float32 factors each call (O(n·d)); the search is the torch one on every device.
    """
    return knn_block(build_space(x64, normalize, x32), q, k)
