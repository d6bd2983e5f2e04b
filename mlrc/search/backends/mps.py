"""CUDA MPS (Multi-Process Service) for workers packed on one GPU (``mlrc worker --per-gpu N
--mps``, ``mlrc slurm submit --mps``).

Without MPS the processes sharing a GPU time-slice it: one process's kernels at a time. With
MPS their kernels run concurrently through one MPS server, which pays when each fold alone
leaves the GPU partly idle (small batches, launch-bound steps). The control daemon
(``nvidia-cuda-mps-control -d``, shipped with the NVIDIA driver) is started before the workers
and stopped after them (``echo quit | nvidia-cuda-mps-control``). Its pipe and log directories
(``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``) are private to the run, in a local
temporary folder (``$TMPDIR``, else ``/tmp``; a Slurm job's ``mlrc-mps-$SLURM_JOB_ID``):
NVIDIA recommends a node-local folder, not a shared home, and a private one keeps it apart from
any other MPS daemon of the node. The workers find the daemon through ``CUDA_MPS_PIPE_DIRECTORY``
in their environment. The daemon inherits ``CUDA_VISIBLE_DEVICES``, if set, and its server
renumbers those GPUs 0, 1, …; a client's own ``CUDA_VISIBLE_DEVICES`` would be read relative to
that numbering (NVIDIA's MPS guide: keeping "0,2" for the clients is an error), so the workers
run without it and see the GPUs numbered as they would have been with it (each binds its
``cuda:N`` with ``torch.cuda.set_device``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CONTROL", "MPSError", "control_path", "job_setup", "job_teardown", "mps_daemon"]

CONTROL = "nvidia-cuda-mps-control"
JOB_ROOT = '"${TMPDIR:-/tmp}/mlrc-mps-$SLURM_JOB_ID"'  # a Slurm job's MPS folder (shell text)


class MPSError(RuntimeError):
    """MPS cannot be used here: one line for the user."""


def control_path() -> str:
    """The path of ``nvidia-cuda-mps-control``; :class:`MPSError` when it is not on PATH."""
    path = shutil.which(CONTROL)
    if path is None:
        raise MPSError(
            f"--mps: {CONTROL} not found on PATH: CUDA MPS comes with the NVIDIA driver "
            "(its utilities package); install it or run without --mps"
        )
    return path


def _env(root: Path) -> dict[str, str]:
    """The MPS variables of a daemon whose folders are under ``root``."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }


@contextlib.contextmanager
def mps_daemon() -> Iterator[dict[str, str | None]]:
    """Start an MPS control daemon in a private temporary folder, yield the changes to the
    workers' environment (the MPS folders; ``CUDA_VISIBLE_DEVICES``: None, to be unset, see
    the module docstring), and stop it (then remove the folder) at the end. :class:`MPSError`
    (one line) when it is absent or does not start."""
    control = control_path()
    root = Path(tempfile.mkdtemp(prefix="mlrc-mps-"))
    mps = _env(root)
    for d in mps.values():
        Path(d).mkdir()
    env = {**os.environ, **mps}
    try:
        out = subprocess.run(
            [control, "-d"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if out.returncode != 0:
            said = (out.stderr or out.stdout).strip().splitlines()
            raise MPSError(
                f"--mps: {CONTROL} -d failed (exit {out.returncode}"
                + (f": {said[-1]}" if said else "")
                + f"); its log: {mps['CUDA_MPS_LOG_DIRECTORY']}"
            )
        try:
            yield {**mps, "CUDA_VISIBLE_DEVICES": None}
        finally:
            subprocess.run(
                [control], input="quit\n", env=env, capture_output=True, text=True, timeout=120
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def job_setup() -> list[str]:
    """The lines a Slurm job script runs before its workers: refuse (exit 2, one line) a node
    without MPS, export the MPS folders, start the daemon."""
    return [
        "# CUDA MPS for the job's packed workers (mlrc slurm submit --mps)",
        f"command -v {CONTROL} >/dev/null || "
        f'{{ echo "mlrc: --mps: {CONTROL} not found on $(hostname)" >&2; exit 2; }}',
        f"export CUDA_MPS_PIPE_DIRECTORY={JOB_ROOT}/pipe",
        f"export CUDA_MPS_LOG_DIRECTORY={JOB_ROOT}/log",
        'mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"',
        f"{CONTROL} -d",
    ]


def job_teardown() -> list[str]:
    """The lines a Slurm job script runs after its workers: stop the daemon, remove its folder
    (a cancelled job's daemon is ended by Slurm with the job's other processes)."""
    return [f"echo quit | {CONTROL}", f"rm -rf {JOB_ROOT}"]
