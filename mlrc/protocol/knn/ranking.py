"""The ranking itself: the ranked vectors and the exact distance between two of them.

Conventions, those of the whole search (:mod:`mlrc.protocol.knn`):

- the ranked vectors v are the rows in float64, with ``normalize`` divided by their norm
  (:func:`ranked_vectors`); without it the rows as they are;
- the distance is d(q, r) = Σ_k (v_qk − v_rk)² (:func:`sq_dist`), a plain float64 loop:
  each difference, square and partial sum rounded once, k = 1, 2, … in order, no fused
  multiply-add; nearer = smaller d. On unit vectors this is the order of cosine similarity;
- the searches compare scores s = −d/2 (:func:`pair_scores`): nearer = larger s;
- ties (equal d) go to the lower index.

Everything here runs in numpy on CPU and in torch elsewhere, with the same bits.
"""

from __future__ import annotations

import numpy as np
import torch

from mlrc.protocol.knn.arrays import (
    ArrayLike,
    as_torch,
    backend_array,
    correct_sqrt,
    power_of_two,
    row_chunks,
    row_exponents,
    where,
)
from mlrc.protocol.knn.work import add_work

_PAIR_BYTES = 16 * 2**20  # float64 temporaries of one chunk of exact distances


def ranked_vectors(x: torch.Tensor, *, normalize: bool = True) -> torch.Tensor:
    """The vectors neighbours are ranked by: float64 rows (n × d), L2-normalised if asked.

    Normalising: row / √(Σ_k row_k²) with the sum taken left to right, each term rounded once,
    after scaling the row by the power of two that brings its largest |entry| into [0.5, 1)
    (exact, so for rows whose squares neither overflow nor underflow the result is bit for bit
    ``row / sqrt(sum)`` unscaled). Zero rows stay zero; −0.0 becomes +0.0. Same device as x.
    """
    x64 = x.double()
    v = backend_array(x64)
    if not normalize:
        return as_torch(v + 0.0)
    out = v * 1.0 if x64 is x else v  # written chunk by chunk (never into the caller's x)
    for rows in row_chunks(v):
        y = v[rows] * power_of_two(-row_exponents(v[rows]))[:, None]
        norm = correct_sqrt(sum_rows_left_to_right(y * y))  # ≥ 0.5 unless the row is 0
        out[rows] = y / where(norm > 0, norm, 1.0)[:, None] + 0.0
    return as_torch(out)


def sum_rows_left_to_right(a: ArrayLike) -> ArrayLike:
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


def sq_dist(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """Exact ranking distances Σ_k (a_k − b_k)² of the rows of a and b (m × d, float64).

    Left to right in k, each operation rounded once (no FMA): what a plain float64 loop gives,
    on numpy and on torch alike.
    """
    diff = a - b
    diff *= diff
    return sum_rows_left_to_right(diff)


def pair_scores(v: ArrayLike, q: ArrayLike, r: ArrayLike) -> ArrayLike:
    """Exact scores s = −d(q_i, r_i)/2 of the pairs of 1-D indices (q_i, r_i), float64.

    ``v``: the ranked vectors (n × d), numpy or torch like the indices. Counted as
    ``exact_pairs`` (:mod:`.work`).
    """
    add_work("exact_pairs", len(q))
    step = max(1, _PAIR_BYTES // (24 * v.shape[1]))
    parts = [-0.5 * sq_dist(v[q[p : p + step]], v[r[p : p + step]]) for p in range(0, len(q), step)]
    if isinstance(v, torch.Tensor):
        return torch.cat(parts) if parts else v.new_empty(0)
    return np.concatenate(parts) if parts else np.empty(0)
