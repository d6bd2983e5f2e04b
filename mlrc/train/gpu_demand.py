"""What a GPU takes: images/s a preset's trunk consumes at its training batch size, measured by
``bench/gpu_fold.py`` on a GPU (``bench/results/gpu_fold.csv``) or estimated
(:data:`GPU_ESTIMATES`) — the figure ``mlrc data bench`` compares its input pipeline with."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from mlrc.config import Preset

__all__ = ["GPU_CSV", "GPU_ESTIMATES", "GpuDemand", "gpu_demand"]

#: (trunk, training batch size) → (images/s one GPU takes, the GPU, how the figure was reasoned).
GPU_ESTIMATES: dict[tuple[str, int], tuple[float, str, str]] = {
    ("bninception", 32): (
        2500.0,
        "H100",
        "issue #22's estimate: a reference step at batch 32 is launch-bound, ≈ 1.3–1.45 s per "
        "100-iteration epoch",
    ),
    ("timm:vit_small_patch16_224", 256): (
        4000.0,
        "H100",
        "≈ 4.6 GMAC per 224-px image forward, ≈ 28 GFLOP per training image, at ≈ 110 TFLOP/s "
        "sustained TF32 (≈ 22 % of the H100's dense TF32 peak)",
    ),
}

GPU_CSV = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu_fold.csv"


@dataclass
class GpuDemand:
    """Images/s the preset's trunk takes on a GPU at the training batch size; ``source``:
    where the figure comes from (the CSV, or the estimate's reasoning)."""

    trunk: str
    batch: int
    img_per_s: float
    gpu: str
    estimate: bool
    source: str


def gpu_demand(preset: Preset, path: Path = GPU_CSV) -> GpuDemand | None:
    """Images/s the preset's trunk takes at its batch size: measured (``path``, written by
    ``bench/gpu_fold.py`` on a GPU) when a row fits, else :data:`GPU_ESTIMATES`, else ``None``.

    The row read is the synthetic-input upper bound (``section`` "upper bound", a ``measure``
    that says "synthetic", ``unit`` img/s: the trunk, embedder, loss and optimiser fed a batch
    already on the device — what the GPU can take), of a run on a GPU (``device`` not ``cpu``).
    Its trunk and batch are the row's ``trunk`` and ``batch`` columns where present, else the
    ``reference`` preset's (the fold ``bench/gpu_fold.py`` runs); a timm tag is ignored. The GPU's
    name comes from the ``machine`` column."""
    trunk, batch = _trunk_key(preset.trunk), preset.batch.size
    measured = _measured(path, trunk, batch)
    if measured is not None:
        rate, gpu = measured
        return GpuDemand(preset.trunk, batch, rate, gpu, False, f"measured ({path.name})")
    if (trunk, batch) in GPU_ESTIMATES:
        rate, gpu, why = GPU_ESTIMATES[trunk, batch]
        return GpuDemand(preset.trunk, batch, rate, gpu, True, why)
    return None


def _trunk_key(name: str) -> str:
    """A trunk's name without a timm pretrained tag (the tag changes weights, not speed)."""
    return name.split(".", 1)[0] if name.startswith("timm:") else name


def _measured(path: Path, trunk: str, batch: int) -> tuple[float, str] | None:
    """(img/s, GPU) of the last fitting row of ``path`` (see :func:`gpu_demand`), or None."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    found = None
    for row in rows:
        if not _upper_bound_on_gpu(row):
            continue
        try:
            rate = float(row.get("value") or "nan")
            size = int(float(row.get("batch") or _REFERENCE_BATCH))
        except ValueError:
            continue
        if rate > 0 and _trunk_key(row.get("trunk") or "bninception") == trunk and size == batch:
            found = rate, _gpu_name(row.get("machine") or "")
    return found


_REFERENCE_BATCH = 32  # the reference preset's batch: gpu_fold.py's fold when a row says none


def _upper_bound_on_gpu(row: dict[str, str]) -> bool:
    """Whether a ``gpu_fold.csv`` row is the synthetic-input upper bound of a run on a GPU."""
    return (
        (row.get("section") or "").strip() == "upper bound"
        and "synthetic" in (row.get("measure") or "")
        and (row.get("unit") or "").strip() == "img/s"
        and not (row.get("device") or "cpu").startswith("cpu")
        and (row.get("profile") or "") != "cpu"
    )


def _gpu_name(machine: str) -> str:
    """The GPU in ``bench.common.machine()``'s line (``… (N CPUs), <GPU>, Python …``)."""
    m = re.search(r"CPUs\), (.+?), Python", machine)
    return m.group(1) if m else "GPU"
