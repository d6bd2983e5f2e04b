"""Fold-trainer overhead: ``train_fold`` iterations/s vs a bare PyTorch loop doing the same work.

    .venv/bin/python bench/trainer.py [--iterations 50 --epochs 6 --repeats 3 --threads 1]

Both sides train the same model (the cpu preset's trunk + 128-D embedder, built from the same
seed), on the same batches (the preset's m-per-class sampler over the embedded ``glyphs``
images, which live in memory, uint8 batches normalised after the copy to the device), with the
same loss (contrastive), optimiser (RMSprop) and batch size (32). The bare loop is
``loss(model(x), y).backward(); opt.step()`` over the DataLoader and nothing else. The trainer
adds what the protocol needs: an atomic, fsynced ``last.pt`` per epoch, the progress bar, the
non-finite loss check, and a validation after every epoch — kept tiny here (2 validation
classes, 32 images) and counted as overhead. Its epoch is the time between two validation
callbacks. Steady state, set-up excluded on both sides: epochs 2..E (epoch 1 warms up) of all
repeats, sides interleaved; the ratio is given for the fastest epoch of each side (the least
disturbed by other load on a shared machine) and for the median epoch. Torch runs ``--threads``
intra-op threads (default 1: on a shared 2-core machine two spinning OpenMP threads per process
make every figure 10× slower and meaningless).
Writes bench/results/trainer.csv. Goal (issue #7): trainer ≥ 0.95 × bare iterations/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_csv  # noqa: E402

from mlrc import data  # noqa: E402
from mlrc.config import load_preset  # noqa: E402
from mlrc.data.transforms import to_trunk_input, train_transform  # noqa: E402
from mlrc.methods import losses, samplers  # noqa: E402
from mlrc.protocol import mlrc_split  # noqa: E402
from mlrc.train import FoldSpec, IndexedView, View, build_model, train_fold  # noqa: E402

LOSS = "contrastive"
SEED = 0


def setup(iterations: int, epochs: int):
    ds = data.build("glyphs")
    fold = mlrc_split(ds.labels, scheme="mlrc").folds[0]
    preset = load_preset(
        "cpu",
        {
            "iterations_per_epoch": iterations,
            "max_epochs": epochs,
            "validate_every": {"default": 1},
            "patience": {"default": epochs},
        },
    )
    return ds, fold, preset


def bare_loop(ds, fold, preset, device: str) -> list[float]:
    """Seconds of each of epochs 2..max_epochs of plain training steps (epoch 1 warms up)."""
    torch.manual_seed(SEED)
    model = build_model(preset).to(device)
    im = model.trunk.input_spec
    p = preset.image
    t = train_transform(p.resize, p.crop, p.scale, p.ratio, p.flip, im, uint8=True)
    view = View(ds, fold.train_classes, t)  # uint8 batches, normalised below: as train_fold
    sampler = samplers.build(
        "m_per_class",
        labels=view.labels,
        batch_size=preset.batch.size,
        m=preset.batch.images_per_class["pair"],
        iterations=preset.iterations_per_epoch,
        seed=SEED,
    )
    loss_fn = losses.build(LOSS, num_classes=len(fold.train_classes), embedding_size=128)
    o = preset.optimizer
    opt = torch.optim.RMSprop(
        model.parameters(), lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum
    )
    loader = DataLoader(IndexedView(view), batch_sampler=sampler)
    ends = [time.perf_counter()]
    for _ in range(preset.max_epochs):
        model.train()
        for x, y, _idx in loader:
            loss = loss_fn(model(to_trunk_input(x.to(device), im)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        ends.append(time.perf_counter())
    return [b - a for a, b in zip(ends[1:-1], ends[2:], strict=True)]


def trainer(ds, fold, preset, device: str) -> list[float]:
    """Seconds of each of epochs 2..max_epochs of ``train_fold`` (between validation calls)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = FoldSpec(
            ds,
            "glyphs",
            fold.train_classes,
            fold.val_classes[:2],
            LOSS,
            {},
            None,
            preset,
            SEED,
            Path(tmp),
            device=device,
            progress=True,  # the bar is part of the trainer's cost (drawn to stderr)
        )
        ends: list[float] = []
        res = train_fold(spec, on_validation=lambda _rec: ends.append(time.perf_counter()))
    assert res.status == "complete", res.reason
    return [b - a for a, b in zip(ends[1:-1], ends[2:], strict=True)]  # ends[0]: epoch 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=50, help="iterations per epoch")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="10 iterations × 3 epochs, 1 repeat")
    a = ap.parse_args()
    if a.quick:
        a.iterations, a.epochs, a.repeats = 10, 3, 1
    torch.set_num_threads(a.threads)
    ds, fold, preset = setup(a.iterations, a.epochs)
    times: dict[str, list[float]] = {"bare loop": [], "train_fold": []}
    for _ in range(a.repeats):  # interleaved, so load changes hit both sides alike
        times["bare loop"] += bare_loop(ds, fold, preset, a.device)
        times["train_fold"] += trainer(ds, fold, preset, a.device)
    rows = [
        {
            "side": side,
            "epochs_timed": len(t),
            "min_epoch_s": min(t),
            "median_epoch_s": statistics.median(t),
            "it_per_s": a.iterations / min(t),
            "it_per_s_median": a.iterations / statistics.median(t),
            "all_s": " ".join(f"{x:.2f}" for x in t),
        }
        for side, t in times.items()
    ]
    df = pd.DataFrame(rows)
    df["ratio_to_bare"] = df["it_per_s"] / df.loc[0, "it_per_s"]
    df["ratio_to_bare_median"] = df["it_per_s_median"] / df.loc[0, "it_per_s_median"]
    title = (
        f"fold trainer vs bare loop ({a.device}, {a.threads} thread(s), batch 32, cpu preset, "
        f"{LOSS}, {a.iterations} it/epoch)"
    )
    table = Table(title=title)
    cols = ("side", "epochs", "fastest s", "it/s", "× bare", "median s", "× bare (median)")
    for col in (*cols, "epochs (s)"):
        table.add_column(col, justify="left" if col in ("side", "epochs (s)") else "right")
    for r in df.itertuples():
        table.add_row(
            r.side,
            str(r.epochs_timed),
            f"{r.min_epoch_s:.3f}",
            f"{r.it_per_s:.1f}",
            f"{r.ratio_to_bare:.3f}",
            f"{r.median_epoch_s:.3f}",
            f"{r.ratio_to_bare_median:.3f}",
            r.all_s,
        )
    console = Console(width=max(Console().width, 140))
    console.print(table)
    console.print(f"machine: {machine()}", soft_wrap=True)
    out = df.assign(device=a.device, threads=a.threads, iterations_per_epoch=a.iterations)
    console.print(f"wrote {write_csv(out, 'trainer')}")


if __name__ == "__main__":
    main()
