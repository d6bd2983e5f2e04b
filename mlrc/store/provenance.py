"""What computed a study's folds, in words: the provenance each fold run records
(``mlrc_fold_run.provenance``, :func:`mlrc.train.numerics.provenance`) summarised for
``mlrc study status`` and the report's notes. Pure functions of the stored dicts (no SQL).

A provenance dict holds ``device`` (``cpu``, ``cuda:0``), ``device_name`` (GPU name or CPU model),
``torch``; on CUDA ``cuda``, ``cudnn``, ``driver``, ``tf32_matmul``, ``tf32_conv``,
``cudnn_benchmark``; and ``deterministic``. Fold runs recorded before schema 7 have none."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Compute", "compute_of", "describe", "tf32_text"]


def tf32_text(p: dict[str, Any]) -> str | None:
    """``TF32 off`` / ``TF32 on`` / ``TF32 conv only`` (torch's default: convolutions TF32,
    matmuls fp32) / ``TF32 matmul only``; None off CUDA or when unknown."""
    mm, conv = p.get("tf32_matmul"), p.get("tf32_conv")
    if mm is None or conv is None:
        return None
    return {
        (False, False): "TF32 off",
        (True, True): "TF32 on",
        (False, True): "TF32 conv only",
        (True, False): "TF32 matmul only",
    }[(bool(mm), bool(conv))]


def describe(p: dict[str, Any]) -> str:
    """One provenance in a few words: ``NVIDIA H100 80GB HBM3 (CUDA 13.0, cuDNN 9.10.2, driver
    570.86, torch 2.14.1, TF32 off, deterministic off)``; on a CPU ``Intel Xeon … (CPU, torch
    2.14.1, deterministic off)``; a fold trained as K > 1 ranks ``4 processes on NVIDIA …``."""
    name = p.get("device_name") or p.get("device") or "unknown device"
    on_cuda = str(p.get("device", "")).startswith("cuda")
    parts = [] if on_cuda else ["CPU"]
    for key, label in (("cuda", "CUDA"), ("cudnn", "cuDNN"), ("driver", "driver")):
        if on_cuda and p.get(key):
            parts.append(f"{label} {p[key]}")
    if p.get("torch"):
        parts.append(f"torch {p['torch']}")
    tf32 = tf32_text(p) if on_cuda else None
    if tf32:
        parts.append(tf32)
    if p.get("deterministic") is not None:
        parts.append(f"deterministic {'on' if p['deterministic'] else 'off'}")
    ranks = p.get("processes") or 1  # a fold trained as K ranks of torch.distributed
    return f"{f'{ranks} processes on ' if ranks > 1 else ''}{name} ({', '.join(parts)})"


@dataclass
class Compute:
    """What computed a set of fold runs: ``kinds`` (each distinct :func:`describe` text with its
    number of fold runs, most first), ``unknown`` (fold runs without a provenance) and
    ``mixed`` (what differs between them that may change float results: ``devices (CPU and
    GPU)``, ``GPU models``, ``CPU models`` (other SIMD kernels), ``CUDA/cuDNN versions``, ``TF32 settings``, ``deterministic settings``)."""

    kinds: list[tuple[str, int]]
    unknown: int
    mixed: list[str]

    def text(self) -> str:
        """``NVIDIA H100 … (…) ×12; 3 fold runs without a record`` ("" when nothing is known)."""
        parts = [f"{d} ×{n}" if len(self.kinds) > 1 else d for d, n in self.kinds]
        if self.unknown and self.kinds:
            runs = "fold run" if self.unknown == 1 else "fold runs"
            parts.append(f"{self.unknown} {runs} without a record")
        return "; ".join(parts)


def compute_of(provenances: Sequence[dict[str, Any] | None]) -> Compute:
    """The :class:`Compute` of fold runs with these provenances (None: not recorded)."""
    known = [p for p in provenances if isinstance(p, dict)]
    kinds = Counter(describe(p) for p in known).most_common()
    return Compute(kinds, len(provenances) - len(known), _mixed(known))


def _mixed(known: list[dict[str, Any]]) -> list[str]:
    """What differs among ``known`` provenances that changes float results."""
    cuda = [p for p in known if str(p.get("device", "")).startswith("cuda")]
    out = []
    if cuda and len(cuda) < len(known):
        out.append("devices (CPU and GPU)")

    def several(values: list[Any]) -> bool:
        return len({repr(v) for v in values}) > 1

    if several([p.get("device_name") for p in cuda]):
        out.append("GPU models")
    if several([p.get("device_name") for p in known if p not in cuda]):
        out.append("CPU models")
    if several([(p.get("cuda"), p.get("cudnn")) for p in cuda]):
        out.append("CUDA/cuDNN versions")
    if several([tf32_text(p) for p in cuda]):
        out.append("TF32 settings")
    if several([p.get("deterministic") for p in known]):
        out.append("deterministic settings")
    return out
