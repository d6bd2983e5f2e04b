"""Training input pipeline throughput: JPEG decoding at every step vs the decoded-image cache.

    .venv/bin/python bench/data.py            # 300 images, 3 epochs per configuration
    .venv/bin/python bench/data.py --quick    # 64 images, 2 epochs (a smoke run, noisy figures)

Generates CUB-like JPEGs in a temporary directory (500 × 375, 375 × 500 and 500 × 333 px, smooth
random colour fields plus fine grain, quality 90: about 50 KB each), wraps them in an
``ImageDataset`` and times the reference preset's training transform
(``mlrc.data.transforms.train_transform``: Resize 256 → RandomResizedCrop 227 (scale 0.16–1,
ratio 0.75–1.33) → flip → ToTensor → BN-Inception input (BGR, 0–255, mean subtracted)) through a
``DataLoader`` (batch 32, shuffled, default collate) with

- ``decode per step``: every sample read from its JPEG and decoded;
- ``decoded cache``: ``mlrc.data.cache.decoded_cache(ds, 256, dir)``, same transform;
- ``… + uint8 †``: what the fold trainer runs: the transform ends at uint8 CHW in the trunk's
  channel order (``train_transform(..., uint8=True)``) and ``to_trunk_input`` (float, /255,
  ×range, −mean, /std: bit-identical to the per-image float tail) runs on the batch on the
  training device — timed here on the CPU in the main process, after the batch arrives.
  Without ``†``: the float tail per image in the loader (the transform's default).

Each runs with ``num_workers`` 0 (torch limited to 1 thread: one core's throughput) and 2
(persistent workers). Epochs alternate between the pipelines, so machine load hits all alike.
Epoch 1 includes worker start; "later" is the median of the other epochs. The cache build (a
few threads, see ``decoded_cache``) and its re-open are timed separately. The JPEGs are in the
OS page cache (just written): reading them from a cold disk would favour the cache more.

A per-stage profile (one process, ms per image) shows where the time goes. Prints rich tables
and writes ``bench/results/data.csv`` (one row per measurement, with the machine).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader
from torchvision import transforms as T

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_csv  # noqa: E402

from mlrc.config import ImageSpec, load_preset  # noqa: E402
from mlrc.data.base import ImageDataset  # noqa: E402
from mlrc.data.cache import decoded_cache  # noqa: E402
from mlrc.data.transforms import to_trunk_input, train_transform  # noqa: E402
from mlrc.models.trunks import BNInception  # noqa: E402

SIZES = [(500, 375), (375, 500), (500, 333)]  # (width, height); CUB photos are mostly these
BATCH = 32
PLAIN, CACHED = "decode per step", "decoded cache"
U8 = " + uint8 †"


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


# --- the uint8 variant: what training does ---------------------------------------------------


def uint8_train_transform(im: ImageSpec, spec: dict) -> T.Compose:
    """The training transform as the fold trainer runs it: the same random steps, ending at
    uint8 CHW in the trunk's channel order; ``to_trunk_input`` finishes it on the batch."""
    return train_transform(im.resize, im.crop, im.scale, im.ratio, im.flip, spec, uint8=True)


def uint8_to_trunk_input(x: torch.Tensor, spec: dict) -> torch.Tensor:
    return to_trunk_input(x, spec)


# --- measurements --------------------------------------------------------------------------------


def epochs_images_per_s(
    datasets: dict[str, ImageDataset], workers: int, epochs: int, spec: dict
) -> dict[str, list[float]]:
    """Images/s of each epoch of each dataset (its transform applied) through a shuffled
    DataLoader. Epochs alternate between the datasets, so a busy machine slows all alike."""
    loaders = {
        name: DataLoader(
            ds,
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(0),
        )
        for name, ds in datasets.items()
    }
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():
            t0, n = time.perf_counter(), 0
            for x, _y in loader:
                if x.dtype == torch.uint8:
                    x = uint8_to_trunk_input(x, spec)
                n += len(x)
            rates[name].append(n / (time.perf_counter() - t0))
    return rates


def stage_profile(plain: ImageDataset, cached: ImageDataset, im: ImageSpec, spec: dict) -> dict:
    """Milliseconds per image of each step of the training transform, one process."""
    crop = T.RandomResizedCrop(im.crop, scale=im.scale, ratio=im.ratio)
    full = train_transform(im.resize, im.crop, im.scale, im.ratio, im.flip, spec)
    tail = full.transforms[-1]  # ToTrunkInput: uint8 → trunk range/order → Normalize
    u8_tail = uint8_train_transform(im, spec).transforms[-1]  # ToUint8Input: channel order
    resize, flip = T.Resize(im.resize), T.RandomHorizontalFlip(0.5)
    n = len(plain)
    decoded = [plain.load_image(i) for i in range(n)]
    resized = [resize(x) for x in decoded]
    cropped = [crop(x) for x in resized]
    stages: dict[str, Callable[[int], object]] = {
        "decode JPEG (open_image)": plain.load_image,
        "Resize 256": lambda i: resize(decoded[i]),
        "cache: array → PIL (open_image)": cached.load_image,
        "RandomResizedCrop 227": lambda i: crop(resized[i]),
        "flip": lambda i: flip(cropped[i]),
        "to float trunk input (per image)": lambda i: tail(cropped[i]),
        "† to uint8 CHW, BGR (per image)": lambda i: u8_tail(cropped[i]),
        "whole transform, decode per step": lambda i: full(plain.load_image(i)),
        "whole transform, decoded cache": lambda i: full(cached.load_image(i)),
    }
    return {name: _ms_per_call(fn, n) for name, fn in stages.items()}


def _ms_per_call(fn: Callable[[int], object], n: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / n * 1e3)
    return best


def timed_cache(plain: ImageDataset, resize: int, folder: Path) -> tuple[ImageDataset, list]:
    """The decoded cache of ``plain``, and rows timing its build and its re-open."""
    rows = []
    for measure in ("cache build", "cache reopen"):
        t0 = time.perf_counter()
        cached = decoded_cache(plain, resize, folder, progress=False)
        s = time.perf_counter() - t0
        rows.append(_row(measure, CACHED, None, len(plain) / s, s))
    return cached, rows


def pipelines(plain: ImageDataset, cached: ImageDataset, im: ImageSpec, spec: dict) -> dict:
    """The four datasets to time, by name: (decode per step | cache) × (float | uint8 batches)."""
    current = train_transform(im.resize, im.crop, im.scale, im.ratio, im.flip, spec)
    proposed = uint8_train_transform(im, spec)
    out = {}
    for name, ds in ((PLAIN, plain), (CACHED, cached)):
        for suffix, transform in (("", current), (U8, proposed)):
            out[name + suffix] = copy.copy(ds)
            out[name + suffix].transform = transform
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--quick", action="store_true", help="64 images, 2 epochs")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.epochs = 64, 2
    torch.set_num_threads(1)
    console = Console()
    im, spec = load_preset("reference").image, BNInception.input_spec
    with tempfile.TemporaryDirectory(prefix="mlrc-bench-data-") as tmp:
        with console.status(f"writing {args.images} JPEGs"):
            paths = make_jpegs(Path(tmp), args.images)
        kb = np.mean([Path(p).stat().st_size for p in paths]) / 1e3
        labels = [i % 10 for i in range(len(paths))]
        plain = ImageDataset("bench", paths, labels, [str(c) for c in range(10)])
        cached, rows = timed_cache(plain, im.resize, Path(tmp) / "cache")
        cache_mb = sum(a.nbytes for a in cached.sources) / 1e6
        timed = pipelines(plain, cached, im, spec)
        for workers in args.workers:
            with console.status(f"{args.epochs} epochs each, num_workers={workers}"):
                by_name = epochs_images_per_s(timed, workers, args.epochs, spec)
            for name, rates in by_name.items():
                later = statistics.median(rates[1:]) if len(rates) > 1 else rates[0]
                rows.append(_row("epoch 1", name, workers, rates[0], len(plain) / rates[0]))
                rows.append(_row("later epochs", name, workers, later, len(plain) / later))
        with console.status("per-stage profile"):
            n = min(64, args.images)
            stages = stage_profile(_head(plain, n), _head(cached, n), im, spec)
    for stage, ms in stages.items():
        rows.append(_row("stage", stage, 0, 1e3 / ms, ms / 1e3))
    df = pd.DataFrame(rows).astype({"num_workers": "Int64"})
    _print(console, df, args, kb, cache_mb)
    console.print(f"wrote {write_csv(df, 'data')}")


def _head(ds: ImageDataset, n: int) -> ImageDataset:
    return ImageDataset(ds.name, ds.sources[:n], list(range(n)), [str(i) for i in range(n)])


def _row(measure: str, pipeline: str, workers: int | None, rate: float, seconds: float) -> dict:
    return {
        "measure": measure,
        "pipeline": pipeline,
        "num_workers": workers,
        "images_per_s": round(rate, 1),
        "seconds": round(seconds, 6),
    }


def _print(console: Console, df: pd.DataFrame, args, kb: float, cache_mb: float) -> None:
    console.print(machine())
    console.print(
        f"{args.images} JPEGs, {kb:.0f} KB on average; decoded cache {cache_mb:.0f} MB; "
        f"batch {BATCH}, {args.epochs} epochs per configuration"
    )
    table = Table(title="Training input pipeline, images/s (higher is better)")
    for col in ("num_workers", "pipeline", "epoch 1", "later epochs", f"× {PLAIN}"):
        table.add_column(col, justify="left" if col == "pipeline" else "right")
    epochs = df[df.measure.isin(["epoch 1", "later epochs"])]
    for workers, group in epochs.groupby("num_workers", sort=True):
        rate = group.set_index(["pipeline", "measure"]).images_per_s
        for pipeline in group.pipeline.unique():
            ratio = rate[pipeline, "later epochs"] / rate[PLAIN, "later epochs"]
            table.add_row(
                str(int(workers)),
                pipeline,
                f"{rate[pipeline, 'epoch 1']:.0f}",
                f"{rate[pipeline, 'later epochs']:.0f}",
                f"{ratio:.2f}",
            )
    console.print(table)
    console.print("† what training does: uint8 batches, normalised on the device after collation")
    for measure in ("cache build", "cache reopen"):
        row = df[df.measure == measure].iloc[0]
        console.print(f"{measure}: {row.seconds:.2f} s ({row.images_per_s:.0f} images/s)")
    stages = Table(title="Per-stage cost, one process (ms per image)")
    stages.add_column("stage")
    stages.add_column("ms/image", justify="right")
    for _, row in df[df.measure == "stage"].iterrows():
        stages.add_row(row.pipeline, f"{row.seconds * 1e3:.3f}")
    console.print(stages)


if __name__ == "__main__":
    main()
