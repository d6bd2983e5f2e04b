"""The float32 search space: factors a, b with a_q·b_r ≈ s(q, r) + offset, and the bound e32
on that error that every certificate rests on.

Scores, not distances: s = −d/2 (larger = nearer, :mod:`.ranking`), and the float32 score
t32 = a_q·b_r approximates s + offset within e32_q for every r. Two factorisations — the unit
one for normalised rows, the centred one (relative to the mean vector) otherwise or whenever it
is tighter — see :func:`build_space`. A :class:`Space` lives on one torch device and keeps a CPU
copy of what the exact fallback needs (the groups of identical rows, :mod:`.groups`);
:class:`Factors` is the numpy search's view of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mlrc.protocol.knn.arrays import (
    U32,
    ArrayLike,
    as_torch,
    backend_array,
    concat,
    float32,
    gamma,
    row_chunks,
)
from mlrc.protocol.knn.groups import Approx, Groups, approx, row_groups


@dataclass
class Space:
    """The ranked vectors and the float32 search factors over them (torch, one device).

    The float32 score t32 = a_q·b_r approximates s(q, r) + offset, s = −d(q, r)/2, within
    e32_q for every r (:func:`build_space`); a and b may be the same tensor. The exact ranking
    (:mod:`.fallback`) works on a CPU copy, in numpy.
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
    def groups(self) -> Groups:
        if "groups" not in self._cpu:
            self._cpu["groups"] = row_groups(self.v_np)
        return self._cpu["groups"]

    @property
    def distinct(self) -> int:
        """Number of distinct ranked vectors."""
        return len(self.groups.starts)

    @property
    def approx(self) -> Approx:
        if "approx" not in self._cpu:
            self._cpu["approx"] = approx(self.v_np[self.groups.reps])
        return self._cpu["approx"]


def build_space(v: torch.Tensor, normalize: bool, x32: torch.Tensor | None = None) -> Space:
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
    xv = backend_array(v)
    with np.errstate(over="ignore", invalid="ignore"):  # too large for float32: fits32 False
        mean = xv.mean(0)
        sq, w_sq = _squared_norms(xv, mean)
        w_norm = w_sq**0.5
        beta = (w_norm + w_norm.max()) ** 2 / 2
        if normalize and float(abs(sq - 1.0).max()) <= 2.0**-40 and float(beta.mean()) >= 1:
            a = b = backend_array(x32) if x32 is not None else float32(xv)
            beta, offset = sq * 0 + 1.0, 1.0
        else:
            a, b = _centred_factors(xv, mean, w_sq)
            offset = 0.0
        beta = beta * (1.0 + 2.0**-40)  # β itself computed in float64
        D = a.shape[1]
        e32 = 2 * (gamma(D, U32) + 3 * U32) * beta + D * 2.0**-125
        finite = np.isfinite if isinstance(a, np.ndarray) else torch.isfinite
        fits32 = bool(finite(a).all() and finite(b).all() and float(beta.max()) < 2.0**120)
    a_t = as_torch(a)
    b_t = a_t if b is a else as_torch(b)
    return Space(v, a_t, b_t, offset, as_torch(e32), fits32)


def _squared_norms(v: ArrayLike, mean: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """‖v‖² and ‖v − mean‖² of each row, float64 (for bounds only: any summation order)."""
    sq, w_sq = [], []
    for rows in row_chunks(v):
        w = v[rows] - mean
        sq.append((v[rows] * v[rows]).sum(1))
        w_sq.append((w * w).sum(1))
    return concat(sq), concat(w_sq)


def _centred_factors(v: ArrayLike, mean: ArrayLike, w_sq: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """Float32 a = [w, −‖w‖²/2, 1] and b = [w, 1, −‖w‖²/2], w = v − mean (n × (d + 2))."""
    n, d = v.shape
    if isinstance(v, np.ndarray):
        a, b = np.empty((n, d + 2), np.float32), np.empty((n, d + 2), np.float32)
    else:
        a = torch.empty((n, d + 2), dtype=torch.float32, device=v.device)
        b = torch.empty_like(a)
    for rows in row_chunks(v):
        a[rows, :d] = b[rows, :d] = v[rows] - mean
        a[rows, d] = b[rows, d + 1] = -w_sq[rows] / 2
        a[rows, d + 1] = b[rows, d] = 1.0
    return a, b


@dataclass(frozen=True)
class Factors:
    """The numpy search's view of a CPU :class:`Space` (same memory, :mod:`.numpy_search`)."""

    space: Space
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


def numpy_factors(space: Space) -> Factors:
    """The :class:`Factors` of a space on the CPU."""
    a, b = space.a.numpy(), space.b.numpy()
    return Factors(space, space.v_np, a, b, space.e32.numpy(), space.offset)
