"""Array helpers shared by the numpy (CPU) and torch code paths, and the input checks.

Every helper here takes a numpy array or a torch tensor (:data:`ArrayLike`) and answers in the
same kind, with the same numbers either way (where a kernel differs, as torch's CPU square
root, the helper says how it is avoided): on CPU the elementwise work runs in numpy
(:func:`backend_array`), elsewhere in torch on the tensor's device. Also here: the float32 and
float64 unit roundoffs and Higham's γ used by the rounding bounds (:mod:`.space`,
:mod:`.groups`), the chunk size of float64 temporaries, and :func:`full_fp32_matmul`, the
matmul precision every torch matmul of the search runs under. Nothing here ranks: the ranking
(distances, ties) is :mod:`.ranking`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor

CHUNK_BYTES = 4 * 2**20  # bytes of one chunk of float64 temporaries (they stay in cache)

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53  # unit roundoff of float64


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
    """True if no entry of ``x`` is NaN or ±inf (CPU tensors are checked in numpy)."""
    xb = backend_array(x)
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


def backend_array(t: torch.Tensor) -> ArrayLike:
    """A CPU tensor as a numpy array (same memory), any other as it is.

    On CPU the elementwise work runs in numpy: each small torch op is a parallel region, and on
    a busy machine one of them can wait tens of milliseconds for a thread.
    """
    return t.numpy() if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t


def as_torch(a: ArrayLike) -> torch.Tensor:
    """A numpy array as a tensor (same memory), a tensor as it is."""
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def row_chunks(a: ArrayLike) -> Iterator[slice]:
    """Row slices of a numpy array with about CHUNK_BYTES of float64 each (temporaries stay
    in cache); a tensor (GPU) in one piece."""
    n = a.shape[0]
    step = max(1, CHUNK_BYTES // (8 * a.shape[1])) if isinstance(a, np.ndarray) else max(n, 1)
    return (slice(lo, lo + step) for lo in range(0, n, step))


def row_exponents(v: ArrayLike) -> ArrayLike:
    """int64 e per row with max_k |v_k| = m·2^e, m in [0.5, 1) (e = 0 for zero rows)."""
    if isinstance(v, np.ndarray):
        return np.frexp(np.abs(v).max(1))[1].astype(np.int64)
    return torch.frexp(v.abs().amax(1))[1].long()


def float32(a: ArrayLike) -> ArrayLike:
    """``a`` rounded to float32 (a copy)."""
    return a.astype(np.float32) if isinstance(a, np.ndarray) else a.float()


def where(condition: ArrayLike, a: ArrayLike, b: float) -> ArrayLike:
    """a where ``condition`` holds, else the scalar b."""
    return np.where(condition, a, b) if isinstance(a, np.ndarray) else torch.where(condition, a, b)


def concat(parts: list[ArrayLike]) -> ArrayLike:
    """The parts (all numpy or all torch) concatenated along their first axis."""
    return np.concatenate(parts) if isinstance(parts[0], np.ndarray) else torch.cat(parts)


def correct_sqrt(a: ArrayLike) -> ArrayLike:
    """Correctly rounded √a: numpy's and CUDA's double sqrt are, torch's CPU kernel can be
    1 ulp off (so CPU tensors never reach it here)."""
    return np.sqrt(a) if isinstance(a, np.ndarray) else a.sqrt()


def power_of_two(e: ArrayLike) -> ArrayLike:
    """2.0**e exactly (float64, e clamped to the normal range): built from its bits, since
    ``pow`` and ``ldexp`` need not be exact on every device."""
    bits = (e.clip(-1022, 1023) + 1023) << 52
    return bits.view(np.float64) if isinstance(bits, np.ndarray) else bits.view(torch.float64)


def gamma(m: int, u: float) -> float:
    """Higham's γ_m = m·u/(1 − m·u): relative error bound of an m-term dot product."""
    return m * u / (1 - m * u)


def rank_within_runs(q: np.ndarray) -> np.ndarray:
    """Position of each entry of the sorted ``q`` within its run of equal values (0, 1, …)."""
    position = np.arange(len(q))
    starts = np.ones(len(q), bool)
    starts[1:] = q[1:] != q[:-1]
    return position - np.maximum.accumulate(np.where(starts, position, 0))
