"""Issue #22's CPU goals for the input pipeline, side by side: the fold's pipeline against a plain
PIL + torchvision chain of the same transforms, on CUB-sized JPEGs, identical pixels.

    .venv/bin/python bench/data.py            # 300 images, 10 s per loader measurement
    .venv/bin/python bench/data.py --quick    # 64 images, 3 s (a smoke run, noisy figures)

Generates CUB-like JPEGs in a temporary directory (500 × 375, 375 × 500 and 500 × 333 px, smooth
random colour fields plus fine grain, quality 90: about 50 KB each), 10 classes, and runs the
``reference`` preset's pipeline as a fold does (``mlrc.train.setup.fold_inputs`` and
``make_loaders``; the decoded cache and evaluation crops built first in that directory, as
``$MLRC_CACHE``, and timed), every class in both views.

1. **Per core** (the main process, 0 loader workers, torch limited to 1 thread), epochs
   alternating between the pipelines so machine load hits both alike, median of ``--rounds``:

   - training: the fold's (cached images + its training transform, uint8 batches: the device
     normalises them) vs the plain chain ``decode → Resize 256 → RandomResizedCrop 227 (scale
     0.16–1, ratio 0.75–1.33) → flip → ToTensor → ×255, BGR → Normalize`` (BN-Inception's
     input) on the JPEGs, the same m-per-class batches — goal ≥ 3×;
   - evaluation: the fold's validation view vs ``decode → Resize 256 → CenterCrop 227 → ToTensor
     → ×255, BGR → Normalize``, batches of ``eval_batch_size`` in order — goal ≥ 10×.

2. **With the preset's loader workers** (4; ``--workers``): ``mlrc data bench``'s measurement
   (``mlrc.train.throughput.measure``): img/s, per core, the time to the first batch of the
   fold's first epoch and of a later one — goal ≈ 0 for the later one (under 0.1 s here: a
   batch's worth of work of one worker at 320 img/s); then, for contrast, the later epoch's
   first batch with workers started at every epoch (``persistent_workers: false``, half the
   time).

3. **Identical pixels**: the first ``--check-batches`` batches of both training loaders from the
   same torch RNG state (and the same sampler seed), and of both evaluation loaders, compared
   bit for bit after the fold's uint8 batch is normalised as on the device
   (``to_trunk_input``).

The JPEGs are in the OS page cache (just written): reading them from a cold disk would favour
the cache more. Prints rich tables and writes ``bench/results/data.csv`` (one row per figure,
with the machine).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_csv  # noqa: E402

from mlrc.config import Preset, load_preset  # noqa: E402
from mlrc.data.base import ImageDataset  # noqa: E402
from mlrc.data.transforms import to_trunk_input  # noqa: E402
from mlrc.methods import samplers  # noqa: E402
from mlrc.train.embed import IndexedView, View  # noqa: E402
from mlrc.train.setup import fold_inputs, make_loaders  # noqa: E402
from mlrc.train.throughput import (  # noqa: E402
    Throughput,
    measure,
    plain_eval_transform,
    plain_train_transform,
    trunk_input_spec,
)

SIZES = [(500, 375), (375, 500), (500, 333)]  # (width, height); CUB photos are mostly these
CLASSES = 10
GOALS = {"training": 3.0, "evaluation": 10.0}  # × the plain chain, per core
LATER_FIRST_BATCH_GOAL_S = 0.1


def make_jpegs(folder: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` CUB-sized JPEGs (quality 90) of smooth colour fields with fine grain."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        field = np.zeros((h, w, 3), np.float32)
        for cells, amplitude in ((4, 90.0), (16, 45.0), (64, 20.0)):  # coarse → fine
            small = rng.normal(0, amplitude, (cells * h // w + 1, cells, 3)).astype(np.float32)
            for c in range(3):
                band = Image.fromarray(small[..., c], mode="F").resize((w, h), Image.BICUBIC)
                field[..., c] += np.asarray(band)
        field += rng.normal(0, 6.0, field.shape).astype(np.float32)  # sensor-like grain
        image = np.clip(field + 128 + rng.uniform(-40, 40, 3), 0, 255).astype(np.uint8)
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(image).save(path, quality=90)
        paths.append(str(path))
    return paths


# --- the two pipelines, built alike ------------------------------------------------------------


def sampler(p: Preset, labels: np.ndarray, iterations: int, seed: int = 0) -> object:
    """The protocol's m-per-class batches (pair losses), as ``build_fold`` makes them."""
    m = p.batch.images_per_class["pair"]
    return samplers.build("m_per_class", labels, p.batch.size, m, iterations, seed)


def loaders(p: Preset, ds: ImageDataset, spec: dict, iterations: int) -> dict[str, Iterable]:
    """(fold | plain) × (training | evaluation) loaders in the main process, every class."""
    classes = list(range(CLASSES))
    p0 = p.model_copy(update={"num_workers": 0})
    _, train_set, val_set = fold_inputs(p0, ds, classes, classes, spec)
    fold_train, fold_eval = make_loaders(
        p0, train_set, val_set, sampler(p0, train_set.labels, iterations), "cpu"
    )
    plain_train_set = View(ds, classes, plain_train_transform(p, spec))
    plain_val_set = View(ds, classes, plain_eval_transform(p, spec))
    return {
        "fold training": fold_train,
        "plain training": DataLoader(
            IndexedView(plain_train_set),
            batch_sampler=sampler(p0, plain_train_set.labels, iterations),
        ),
        "fold evaluation": fold_eval,
        "plain evaluation": DataLoader(plain_val_set, batch_size=p.eval_batch_size),
    }


def per_core_rates(named: dict[str, Iterable], rounds: int) -> dict[str, float]:
    """Median images/s of each loader over ``rounds`` epochs, alternating between them."""
    rates: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(rounds):
        for name, loader in named.items():
            t0, n = time.perf_counter(), 0
            for batch in loader:
                n += len(batch[0])
            rates[name].append(n / (time.perf_counter() - t0))
    return {name: statistics.median(r) for name, r in rates.items()}


def same_pixels(named: dict[str, Iterable], spec: dict, batches: int) -> dict[str, bool]:
    """Whether the fold's first ``batches`` batches, normalised as on the device, equal the
    plain chain's bit for bit, from the same torch RNG state (training and evaluation)."""
    out = {}
    for what in ("training", "evaluation"):
        got = []
        for name in (f"fold {what}", f"plain {what}"):
            torch.manual_seed(1234)
            got.append([batch[0] for batch in itertools.islice(named[name], batches)])
        out[what] = all(torch.equal(to_trunk_input(a, spec), b) for a, b in zip(*got, strict=True))
    return out


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3, help="epochs per pipeline, per core")
    ap.add_argument("--seconds", type=float, default=10.0, help="per loader measurement (2.)")
    ap.add_argument("--workers", type=int, default=None, help="default: the preset's")
    ap.add_argument("--check-batches", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="64 images, 2 rounds, 3 s")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.rounds, args.seconds = 64, 2, 3.0
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "This DataLoader will create")  # 4 workers on 2 cores
    console = Console(width=None if sys.stdout.isatty() else 110)
    p = load_preset("reference")
    if args.workers is not None:
        p = p.model_copy(update={"num_workers": args.workers})
    spec = trunk_input_spec(p)
    with tempfile.TemporaryDirectory(prefix="mlrc-bench-data-") as tmp:
        os.environ["MLRC_CACHE"] = str(Path(tmp) / "cache")  # the fold's caches, built here
        (Path(tmp) / "jpegs").mkdir()
        with console.status(f"writing {args.images} JPEGs"):
            paths = make_jpegs(Path(tmp) / "jpegs", args.images)
        kb = np.mean([Path(q).stat().st_size for q in paths]) / 1e3
        labels = [i % CLASSES for i in range(len(paths))]
        ds = ImageDataset("bench", paths, labels, [str(c) for c in range(CLASSES)])
        classes = list(range(CLASSES))
        console.print(f"loader measurement, {p.num_workers} workers (mlrc data bench's)")
        fold = measure(p, ds, classes, classes, args.seconds, progress=True)
        console.print("the same, workers started at every epoch (persistent_workers: false)")
        per_epoch = p.model_copy(update={"persistent_workers": False})
        fresh = measure(per_epoch, ds, classes, classes, args.seconds / 2, progress=True)
        iterations = max(1, args.images // p.batch.size)
        named = loaders(p, ds, spec, iterations)
        with console.status(f"per core: {args.rounds} epochs of each pipeline"):
            rates = per_core_rates(named, args.rounds)
        with console.status("identical pixels"):
            same = same_pixels(named, spec, args.check_batches)
    rows = _rows(rates, fold, same, args) + _fresh_rows(fresh, args)
    df = pd.DataFrame(rows)
    _print(console, df, args, kb, fold)
    console.print(f"wrote {write_csv(df, 'data')}")


def _rows(
    rates: dict[str, float], fold: Throughput, same: dict[str, bool], args: argparse.Namespace
) -> list[dict]:
    """One row per figure: per core, identical pixels, with the workers, the cache."""
    rows = []
    for what, goal in GOALS.items():
        ratio = rates[f"fold {what}"] / rates[f"plain {what}"]
        for side in ("fold", "plain"):
            rows.append(_row("per core", f"{side} {what}", rates[f"{side} {what}"], "img/s"))
        rows.append(
            _row("per core", f"{what}: fold ÷ plain", ratio, "×", f"≥ {goal:g}×", ratio >= goal)
        )
        rows.append(_row("pixels", f"{what}: identical", float(same[what]), "", "yes", same[what]))
    for what, r in (("training", fold.train), ("evaluation", fold.eval)):
        rows += [
            _row(f"{fold.workers} workers", f"{what} img/s", r.img_per_s, "img/s"),
            _row(f"{fold.workers} workers", f"{what} per core", r.per_core, "img/s"),
            _row(
                f"{fold.workers} workers", f"{what} first batch, first epoch", r.first_batch_s, "s"
            ),
            _row(
                f"{fold.workers} workers",
                f"{what} first batch, later epoch",
                r.later_first_batch_s,
                "s",
                f"≈ 0 (< {LATER_FIRST_BATCH_GOAL_S} s)",
                r.later_first_batch_s < LATER_FIRST_BATCH_GOAL_S,
            ),
        ]
    rows.append(_row("cache", "build (decoded + evaluation crops)", fold.cache.build_s, "s"))
    rows.append(_row("cache", "bytes", float(fold.cache.bytes), "B"))
    return [dict(r, images=args.images) for r in rows]


def _fresh_rows(fresh: Throughput, args: argparse.Namespace) -> list[dict]:
    """The first batch of a later epoch with workers started at every epoch: what persistent
    workers save."""
    section = f"{fresh.workers} per-epoch workers"
    return [
        dict(
            _row(section, f"{what} first batch, later epoch", r.later_first_batch_s, "s"),
            images=args.images,
        )
        for what, r in (("training", fresh.train), ("evaluation", fresh.eval))
    ]


def _row(
    section: str, measure: str, value: float, unit: str, goal: str = "", met: bool | None = None
) -> dict:
    return {
        "section": section,
        "measure": measure,
        "value": round(float(value), 4),
        "unit": unit,
        "goal": goal,
        "met": "" if met is None else ("yes" if met else "no"),
    }


def _print(
    console: Console, df: pd.DataFrame, args: argparse.Namespace, kb: float, fold: Throughput
) -> None:
    console.print(machine(), soft_wrap=True)
    console.print(
        f"{args.images} JPEGs, {kb:.0f} KB on average; reference preset; per core: "
        f"{args.rounds} epochs per pipeline, median; loaders: {args.seconds:g} s per measurement"
    )
    table = Table(title="Issue #22's CPU goals: the fold's input pipeline vs a plain chain")
    for col in ("section", "measure", "value", "unit", "goal", "met"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for _, r in df.iterrows():
        value = r.value
        shown = f"{value:.3f}" if abs(value) < 10 else f"{value:,.0f}"
        if r.measure.endswith("identical"):
            shown = "yes" if value else "NO"
        table.add_row(r.section, r.measure, shown, r.unit, r.goal, r.met)
    console.print(table)
    console.print(fold.verdict(), highlight=False)


if __name__ == "__main__":
    main()
