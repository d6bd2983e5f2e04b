"""What every bench script shares: the machine description and writing its CSV."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pandas as pd

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def machine() -> str:
    """One line: host, CPU model and count, GPU if any, Python/torch versions, OS."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.node()} {cpu} ({os.cpu_count()} CPUs), {gpu}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, {platform.platform()}"
    )


def write_csv(df: pd.DataFrame, name: str) -> Path:
    """``bench/results/<name>.csv`` with a ``machine`` column; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.csv"
    df.assign(machine=machine()).to_csv(path, index=False)
    return path
