"""A no-op fold trainer for ``bench/orchestration.py``: every fold "trains" instantly and reports
a value drawn from its seed, so a trial costs exactly the orchestration around it (sampler,
database rows, locks, heartbeats, Ray scheduling). Imported into every process that runs folds:
pool workers (``python bench/noop.py worker …``) and Ray workers (``worker_process_setup_hook``).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import mlrc.search.folds as folds
from mlrc.train import FoldResult, FoldSpec


def noop_train_fold(spec: FoldSpec, on_validation=None) -> FoldResult:
    value = random.Random(spec.seed).random()
    return FoldResult(
        "complete",
        None,
        1,
        {"map_at_r": value, "precision_at_1": value, "r_precision": value},
        checkpoint=str(Path(spec.workdir) / "best.pt"),
        objective=value,
    )


def patch() -> None:
    folds.train_fold = noop_train_fold


if __name__ == "__main__":  # python bench/noop.py <mlrc arguments>
    patch()
    from mlrc.cli import app

    app(sys.argv[1:])
