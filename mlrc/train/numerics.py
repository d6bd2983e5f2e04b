"""A fold's numerics: the preset's ``tf32`` and ``deterministic`` applied to torch
(:func:`apply_numerics`), and what computed the fold, recorded with its result
(:func:`provenance`).

``tf32`` (``None``: torch's defaults, left alone — TF32 in cuDNN convolutions, full fp32 in CUDA
matmuls; ``False``: full fp32 in both, as the 2020 reference GPUs computed; ``True``: TF32 in
both, Ampere and later) is set through the legacy flags ``torch.backends.cuda.matmul.allow_tf32``
and ``torch.backends.cudnn.allow_tf32``, not the per-backend ``fp32_precision`` API that torch
2.9+ offers: setting that one per backend makes ``torch.get_float32_matmul_precision()`` raise
(a "mix of the legacy and new APIs") in the same process, where the legacy flags and
``torch.set_float32_matmul_precision`` stay interchangeable (checked with torch 2.14), and the
legacy flags exist in every torch a GPU machine may have.

``deterministic``: ``torch.use_deterministic_algorithms(True, warn_only=True)``, cuDNN's
deterministic algorithms, ``cudnn.benchmark`` off and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``.
``warn_only``: the trunks' own backward passes use CUDA kernels without a deterministic
implementation (``adaptive_avg_pool2d_backward_cuda`` in the trunks' global pooling), which
would otherwise raise in every fold; torch warns once per such kernel instead, and the fold's
other kernels are deterministic. ``CUBLAS_WORKSPACE_CONFIG`` is read by cuBLAS when it creates
its workspace, at the process's first cuBLAS call: it must be in the environment before that
(:func:`apply_numerics` is called before a fold builds its model; a value the user set is
kept). ``deterministic: false`` puts torch's defaults back (a process may run folds of several
presets).

On a CPU device TF32 does not exist: ``tf32: true`` there is a one-line warning, once per
process, not an error.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import subprocess
from typing import Any

from mlrc.config import Preset

__all__ = [
    "CUBLAS_WORKSPACE",
    "apply_numerics",
    "bind_device",
    "cudnn_text",
    "forget_warnings",
    "provenance",
]

log = logging.getLogger("mlrc")

CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's documented setting for deterministic results
_warned: list[bool] = []  # the CPU tf32 warning, once per process


def forget_warnings() -> None:
    """Warn again as a fresh process would (the CPU tf32 warning is said once per process)."""
    _warned.clear()


def _is_cuda(device: str) -> bool:
    return device.split(":", 1)[0] == "cuda"


def apply_numerics(preset: Preset, device: str) -> None:
    """Set torch's process-wide numerics for a fold of ``preset`` on ``device`` (``cpu``,
    ``cuda``, ``cuda:N``): the TF32 flags (unless ``preset.tf32`` is None) and the determinism
    settings (see the module docstring). Call it before the fold's first CUDA work."""
    import torch

    if preset.tf32 is not None:
        if preset.tf32 and not _is_cuda(device) and not _warned:
            _warned.append(True)
            log.warning("tf32: true has no effect on %s: TF32 exists on CUDA GPUs only", device)
        torch.backends.cuda.matmul.allow_tf32 = preset.tf32
        torch.backends.cudnn.allow_tf32 = preset.tf32
    det = preset.deterministic
    if det:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(det, warn_only=True)
    torch.backends.cudnn.deterministic = det
    if det:
        torch.backends.cudnn.benchmark = False
    elif _is_cuda(device):
        torch.backends.cudnn.benchmark = preset.cudnn_benchmark


def bind_device(device: str) -> None:
    """Make ``cuda:N`` this process's current CUDA device (nothing for ``cpu``, ``cuda``,
    ``mps``), before any CUDA work: otherwise every process opens a context on GPU 0 too
    (several hundred MB each), the first time anything uses the current device — the
    DataLoader's pin-memory thread, ``pin_memory()``, a ``torch.cuda`` call without a device.

    ``torch.cuda.set_device`` rather than ``CUDA_VISIBLE_DEVICES``: the device keeps its name
    (``cuda:3`` in the logs and the fold's provenance is GPU 3 of this machine), it works in a
    process already started (a single ``mlrc worker``, not only spawned children), and the
    children of ``--per-gpu`` under MPS see the GPUs as the MPS daemon does."""
    import torch

    d = torch.device(device)
    if d.type == "cuda" and d.index is not None:
        torch.cuda.set_device(d.index)


def provenance(device: str, preset: Preset | None = None) -> dict[str, Any]:
    """What computes a fold on ``device`` now, JSON-able: ``device``, ``device_name`` (the GPU's
    name, or the CPU model), ``torch``; on CUDA also ``cuda`` and ``cudnn`` (versions, as
    ``"13.0"``, ``"9.10.2"``), ``driver`` (the NVIDIA driver's version; None when neither pynvml
    nor ``nvidia-smi`` can tell), ``tf32_matmul``/``tf32_conv`` (the effective TF32 flags) and
    ``cudnn_benchmark``; ``deterministic`` (torch's deterministic algorithms on). ``preset`` is
    accepted for the caller's convenience: the settings recorded are torch's effective ones,
    not the preset's wishes."""
    import torch

    del preset  # the effective settings are read from torch
    out: dict[str, Any] = {
        "device": device,
        "device_name": _cpu_model(),
        "torch": str(torch.__version__),  # a TorchVersion: not loadable with weights_only
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
    }
    if _is_cuda(device) and torch.cuda.is_available():
        index = torch.device(device).index
        out["device_name"] = torch.cuda.get_device_name(index)
        out["cuda"] = torch.version.cuda
        out["cudnn"] = cudnn_text(torch.backends.cudnn.version())
        out["driver"] = _driver_version()
        out["tf32_matmul"], out["tf32_conv"] = _tf32_flags()
        out["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    return out


def cudnn_text(version: int | None) -> str | None:
    """cuDNN's version number as text: 91002 → ``"9.10.2"`` (cuDNN 9: major·10000 + minor·100
    + patch), 8907 → ``"8.9.7"`` (cuDNN ≤ 8: major·1000 + minor·100 + patch)."""
    if not version:
        return None
    if version >= 90000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def _tf32_flags() -> tuple[bool | None, bool | None]:
    """The effective (matmul, convolution) TF32 flags; None where torch cannot say (its legacy
    getters raise once someone mixed in the per-backend API)."""
    import torch

    flags: list[bool | None] = []
    for legacy, new in (
        (lambda: torch.backends.cuda.matmul.allow_tf32, "cuda.matmul"),
        (lambda: torch.backends.cudnn.allow_tf32, "cudnn.conv"),
    ):
        try:
            flags.append(bool(legacy()))
        except RuntimeError:
            backend: Any = torch.backends
            for part in new.split("."):
                backend = getattr(backend, part, None)
            precision = getattr(backend, "fp32_precision", None)
            flags.append(None if precision in (None, "none") else precision == "tf32")
    return flags[0], flags[1]


@functools.cache
def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``; else the platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.cache
def _driver_version() -> str | None:
    """The NVIDIA driver's version (pynvml if installed, else ``nvidia-smi``), None when
    neither answers. Read once per process."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001 — absent or unusable: try nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return lines[0] if out.returncode == 0 and lines else None
