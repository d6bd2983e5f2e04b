"""Disk used by a study's checkpoints under each retention policy (issue #15), from the sizes of
real checkpoint files.

    .venv/bin/python bench/artifacts.py [--workers 8]

For each preset (``cpu``: tiny_cnn; ``reference``: BN-Inception, 512-D … its 128-D embedder,
RMSprop with momentum) one fold is trained for one iteration on ``glyphs`` (the reference trunk
from random weights: nothing is downloaded; weights and optimiser state have the same size
either way), and its ``best.pt`` and ``last.pt`` are measured with ``os.stat``. A study of the
preset's budget (T trials × 4 folds + R reproductions × 4 folds) then holds, once finished:

- ``all`` (mlrc ≤ 0.2): every fold's best.pt + last.pt;
- ``best``: best.pt of the best trial's 4 folds and of the R × 4 test folds;
- ``resume`` (default): nothing.

While it runs, each of ``--workers`` running folds holds last.pt + best.pt (+ a pending best and a
temp file at most for a moment): the peak above the finished figure. Writes
bench/results/artifacts.csv and .md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, write_csv  # noqa: E402

from mlrc import data  # noqa: E402
from mlrc.config import load_preset  # noqa: E402
from mlrc.protocol import mlrc_split  # noqa: E402
from mlrc.train import FoldSpec, train_fold  # noqa: E402

ONE_ITERATION = {
    "iterations_per_epoch": 1,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "patience": {"default": 1},
}
SMALL_IMAGES = {"image": {"resize": 72, "crop": 64}}  # sizes of weights do not depend on it
PRESETS = {
    "cpu": ONE_ITERATION,
    "reference": {**ONE_ITERATION, **SMALL_IMAGES, "pretrained": False, "num_workers": 0},
}
GRID = 30  # studies of the mean-field paper's grid: 10 losses × 3 datasets


def checkpoint_sizes(preset_name: str, workdir: Path) -> tuple[int, int, dict]:
    """(best.pt bytes, last.pt bytes, the preset's budgets) of one trained fold."""
    preset = load_preset(preset_name, PRESETS[preset_name])
    ds = data.build("glyphs")
    fold = mlrc_split(ds.labels, scheme="mlrc").folds[0]
    spec = FoldSpec(
        ds, "glyphs", fold.train_classes, fold.val_classes, "contrastive", {}, None, preset, 0,
        workdir, progress=False,
    )  # fmt: skip
    res = train_fold(spec)
    assert res.status == "complete", res.reason
    budgets = {"trials": preset.search.trials, "reproductions": preset.test.reproductions}
    return (workdir / "best.pt").stat().st_size, (workdir / "last.pt").stat().st_size, budgets


def study_bytes(best: int, last: int, trials: int, reps: int, folds: int = 4) -> dict[str, int]:
    """A finished study's checkpoint bytes under each policy."""
    return {
        "all": (trials + reps) * folds * (best + last),
        "best": (1 + reps) * folds * best,
        "resume": 0,
    }


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8, help="running folds at the peak")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in PRESETS:
            best, last, b = checkpoint_sizes(name, Path(tmp) / name)
            per = study_bytes(best, last, b["trials"], b["reproductions"])
            for policy, n in per.items():
                rows.append(
                    {
                        "preset": name,
                        "best_pt_bytes": best,
                        "last_pt_bytes": last,
                        "trials": b["trials"],
                        "reproductions": b["reproductions"],
                        "policy": policy,
                        "study_bytes": n,
                        "peak_bytes": n + args.workers * (best + last),
                        "grid_bytes": GRID * n,
                    }
                )
    df = pd.DataFrame(rows)
    write_csv(df, "artifacts")
    lines = [
        "# Checkpoint disk per study under each retention policy",
        "",
        f"Machine: {machine()}. `python bench/artifacts.py --workers {args.workers}`.",
        "",
        "| preset | best.pt | last.pt | budget (trials × 4 + reps × 4 folds) | policy | finished "
        f"study | peak while {args.workers} folds run | grid of {GRID} studies |",
        "|---|--:|--:|---|---|--:|--:|--:|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| {r.preset} | {gb(r.best_pt_bytes)} | {gb(r.last_pt_bytes)} | {r.trials} × 4 + "
            f"{r.reproductions} × 4 | {r.policy} | {gb(r.study_bytes)} | {gb(r.peak_bytes)} | "
            f"{gb(r.grid_bytes)} |"
        )
    lines += [
        "",
        "`all` is mlrc ≤ 0.2 (every fold kept both files); `resume` is the default now; `best` "
        "keeps what `mlrc study export-model` needs.",
    ]
    (RESULTS / "artifacts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
