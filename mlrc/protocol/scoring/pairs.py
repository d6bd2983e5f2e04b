"""Verification pairs: the similarity of every (query, reference) pair, split by label.

Similarity s(q, r) = −d̂(q, r), the squared Euclidean distance of the ranked vectors
(:func:`mlrc.protocol.knn.ranked_vectors`: L2-normalised with ``normalize``) negated, estimated
in float64 as 2·q·r − ‖q‖² − ‖r‖² (on unit vectors 2·cos − 2: the order of cosine similarity;
float64 rounding, ~1e-15, is not resolved further). A query's own row (``own``) is no pair.
Genuine pairs (same class) are all kept; of the impostor pairs only the ``keep`` largest
similarities, in blocks of queries of at most 64 MiB of scores.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from mlrc.protocol.knn import ranked_vectors
from mlrc.protocol.scoring.base import PairScores

_BLOCK_BYTES = 64 * 2**20


def pair_scores(
    query: torch.Tensor,
    reference: torch.Tensor,
    q_ids: np.ndarray,
    r_ids: np.ndarray,
    *,
    own: bool,
    keep: int,
    normalize: bool,
) -> PairScores:
    """Genuine similarities and the ``keep`` largest impostor ones (module docstring)."""
    vq = ranked_vectors(query, normalize=normalize)
    vr = ranked_vectors(reference, normalize=normalize)
    norm_r = vr.square().sum(1)
    r_lab = torch.from_numpy(r_ids).to(vr.device)
    genuine, top, num_impostor = [], np.empty(0), 0
    step = max(1, _BLOCK_BYTES // (8 * vr.shape[0]))
    for lo in range(0, vq.shape[0], step):
        rows = torch.arange(lo, min(vq.shape[0], lo + step), device=vr.device)
        q = vq[rows]
        s = 2.0 * (q @ vr.T) - q.square().sum(1)[:, None] - norm_r[None, :]
        same = torch.from_numpy(q_ids[lo : lo + len(rows)]).to(vr.device)[:, None] == r_lab
        pair = torch.ones_like(same)
        if own:
            pair[torch.arange(len(rows), device=rows.device), rows] = False
        genuine.append(s[same & pair].cpu().numpy())
        impostor = s[~same & pair].cpu().numpy()
        num_impostor += impostor.size
        top = _largest(np.concatenate([top, impostor]), keep)
    return PairScores(np.concatenate(genuine), np.sort(top)[::-1].copy(), num_impostor)


def _largest(a: np.ndarray, keep: int) -> np.ndarray:
    """The ``keep`` largest entries of ``a`` (any order)."""
    if a.size <= keep:
        return a
    return np.partition(a, a.size - keep)[a.size - keep :]


def allowed_false_matches(fraction: float, num_impostor: int) -> int:
    """⌊fraction · N⌋ in exact decimal arithmetic (0.001 · 1000 is 1, not 0.999…)."""
    return int(Fraction(repr(float(fraction))) * num_impostor)


def impostor_keep(fraction: float, num_impostor: int) -> int:
    """How many of the largest impostor scores a threshold at FMR ``fraction`` reads:
    ⌊fraction · N⌋ + 1, at most N."""
    return min(allowed_false_matches(fraction, num_impostor) + 1, num_impostor)
