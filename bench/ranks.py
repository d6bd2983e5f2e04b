"""One fold as K processes of torch.distributed: img/s at K = 1, 2, 4 on the same global batch.

    python bench/ranks.py --device cuda           # every K ≤ the GPUs here (1, 2, 4)
    python bench/ranks.py --device cuda --quick   # shorter epochs
    python bench/ranks.py --device cpu            # gloo, K = 1 and 2 (a smoke run on 2 cores)

Each K trains the same fold (same seed, same global batch) through mlrc's own
``train_fold_ranks`` (K = 1: ``train_fold`` in this process): on CUDA the ``reference`` preset
(random BN-Inception weights, 227 px, global batch 128 = 32 classes × 4, decoded cache, 4
loader workers per rank) on synthetic CUB-sized JPEGs (``bench/gpu_fold.py``'s), validation on
4 held-out classes; on the CPU the ``cpu`` preset on the embedded ``glyphs``. img/s = training
images ÷ the fold's own wall time (rank 0, from its start to its result: validation included,
small by construction); the launch (forkserver, rendezvous, process group) is reported apart.
Writes ``bench/results/ranks_<device>.csv`` with the machine, and prints the table with the
ratio to K = 1.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
THREADS = torch.get_num_threads()  # this process's torch threads, before any K ran


def machine(device: str) -> str:
    """The machine in words (GPU model and count, or the CPU)."""
    if device == "cuda" and torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"{n} × {torch.cuda.get_device_name(0)}"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def dataset_and_preset(
    device: str, quick: bool, tmp: Path, iterations: int | None = None
) -> tuple[Any, Any]:
    """The fold's dataset and preset (see the module docstring); ``iterations`` per epoch
    overrides the preset's."""
    from mlrc import data
    from mlrc.config import load_preset

    fixed = {"validate_every": {"default": 1}, "patience": {"default": 10_000}, "max_epochs": 2}
    if device == "cpu":
        over = {**fixed, "iterations_per_epoch": iterations or (8 if quick else 25)}
        return data.build("glyphs"), load_preset("cpu", over)
    from gpu_fold import PROFILES, make_image_folder

    os.environ.setdefault("MLRC_CACHE", str(tmp / "cache"))
    make_image_folder(tmp / "images", PROFILES["quick" if quick else "full"])
    over = {
        **fixed,
        "pretrained": False,
        "iterations_per_epoch": iterations or (40 if quick else 150),
        "batch": {"size": 128},
    }
    return data.build("image_folder", root=tmp / "images"), load_preset("reference", over)


def run(ds: Any, preset: Any, k: int, device: str, tmp: Path) -> dict[str, Any]:
    """Train the fold as ``k`` ranks; its figures."""
    from mlrc.train import FoldSpec
    from mlrc.train.launch import rank_devices, train_fold_ranks

    classes = list(range(ds.num_classes))
    spec = FoldSpec(
        ds, ds.name, classes[:-4], classes[-4:], "contrastive", {}, None, preset, 0,
        tmp / f"k{k}", progress=False,
    )  # fmt: skip
    threads = max(1, THREADS // k)  # the host's cores shared between the ranks, as run_fold does
    start = time.monotonic()
    res = train_fold_ranks(spec, rank_devices(device, k), threads)
    wall = time.monotonic() - start
    if res.status != "complete":
        raise RuntimeError(f"K = {k}: the fold failed: {res.reason}")
    images = preset.batch.size * preset.iterations_per_epoch * preset.max_epochs
    return {
        "processes": k,
        "img_per_s": images / res.wall_time_s,
        "fold_s": res.wall_time_s,
        "launch_s": wall - res.wall_time_s,
        "map_at_r": res.best["map_at_r"] if res.best else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="shorter epochs")
    ap.add_argument("--procs", default=None, help="comma-separated K (default: 1,2,4 ≤ devices)")
    ap.add_argument("--iterations", type=int, help="iterations per epoch (default: by --quick)")
    ap.add_argument("--out", type=Path, help="the CSV (default bench/results/ranks_DEVICE.csv)")
    args = ap.parse_args(argv)
    available = torch.cuda.device_count() if args.device == "cuda" else 2
    ks = [int(k) for k in args.procs.split(",")] if args.procs else [1, 2, 4]
    ks = [k for k in ks if k <= available]
    if args.device == "cuda" and len(ks) < 2:
        print(f"ranks.py: {available} GPU(s) here: nothing to scale (needs 2)")
        return 0
    with tempfile.TemporaryDirectory(prefix="mlrc-ranks-") as t:
        tmp = Path(t)
        ds, preset = dataset_and_preset(args.device, args.quick, tmp, args.iterations)
        rows = [run(ds, preset, k, args.device, tmp) for k in ks]
    base = rows[0]["img_per_s"]
    where = machine(args.device)
    print(f"one fold as K processes, global batch {preset.batch.size}, {where}")
    print(f"{'K':>3} {'img/s':>9} {'× K=1':>7} {'fold s':>8} {'launch s':>9} {'val MAP@R':>10}")
    for r in rows:
        r["speedup"] = r["img_per_s"] / base
        print(
            f"{r['processes']:>3} {r['img_per_s']:>9.1f} {r['speedup']:>7.2f} "
            f"{r['fold_s']:>8.1f} {r['launch_s']:>9.1f} {r['map_at_r'] or 0:>10.4f}"
        )
    out = args.out or BENCH / "results" / f"ranks_{args.device}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, ["machine", "date", "batch", *rows[0]])
        w.writeheader()
        day = time.strftime("%Y-%m-%d")
        w.writerows({"machine": where, "date": day, "batch": preset.batch.size, **r} for r in rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
