"""What a study's pre-flight costs: cold (nothing checked before) and warm (every image
remembered), next to the demo-size study it precedes.

    .venv/bin/python bench/preflight.py                    # + the demo's whole study, timed
    .venv/bin/python bench/preflight.py --demo-seconds S   # S: a measured `mlrc demo` wall time
    .venv/bin/python bench/preflight.py --images 3000      # also a folder of N CUB-sized JPEGs

The pre-flight (:mod:`mlrc.train.preflight`) runs in-process on the demo's study (glyphs ×
contrastive, cpu preset) with ``$MLRC_CACHE`` in a fresh temporary folder: "cold" decodes every
image, "warm" (the same call again) decodes none. The glyphs are rendered once per process
(``data.build`` is cached) and the study opened after the pre-flight reuses them, so the demo
pays the pre-flight's decoding, class-size and weights checks, not the rendering: that is the
"added" row; the rendering is shown apart. The study is the demo's (search, then test stage,
``mlrc.search.open_study`` as ``mlrc demo`` runs it, without the pre-flight), timed in the same
process unless ``--demo-seconds`` gives a wall time measured elsewhere. With ``--images N``, a
folder of N CUB-sized JPEGs (500 × 375, quality 90) is checked too (cold and warm), to show the
cost per image on photos. Prints a rich table and writes ``bench/results/preflight.csv``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_csv  # noqa: E402


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def jpeg_folder(root: Path, n: int, classes: int = 50) -> Path:
    """``root/<class>/<k>.jpg``: n smooth-noise JPEGs of 500 × 375 in ``classes`` classes."""
    rng = np.random.default_rng(0)
    for i in range(n):
        small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((500, 375), Image.BICUBIC)
        folder = root / f"c{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:05d}.jpg", quality=90)
    return root


def folder_study(root: Path):
    from mlrc.config import StudyConfig, resolve, validate_model

    cfg = {
        "name": "bench-folder",
        "dataset": {"name": "image_folder", "root": str(root)},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
    }
    return resolve(validate_model(StudyConfig, cfg, "bench"), "bench")


def demo_seconds(tmp: Path) -> float:
    """The demo's study, search and test stage, as `mlrc demo` runs it (quiet)."""
    from mlrc.cli.demo import demo_study
    from mlrc.search import open_study, run_search, run_test

    def run() -> None:
        resolved = demo_study(None, None, None)
        url = f"sqlite:///{tmp / 'demo.db'}"
        with open_study(resolved, url, tmp / "artifacts", "cpu", progress=False) as ctx:
            run_search(ctx)
            run_test(ctx)

    return timed(run)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-seconds", type=float, help="a measured `mlrc demo` wall time")
    ap.add_argument("--images", type=int, default=0, help="also N CUB-sized JPEGs (0: none)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mlrc-bench-preflight-"))
    os.environ["MLRC_CACHE"] = str(tmp / "cache")  # nothing checked before

    from mlrc import data
    from mlrc.cli.demo import demo_study
    from mlrc.train.preflight import preflight

    resolved = demo_study(None, None, None)
    render, ds = timed(lambda: data.build("glyphs"))
    cold_s, cold = timed(lambda: preflight(resolved, progress=False))
    warm_s, warm = timed(lambda: preflight(resolved, progress=False))
    rows = [
        ("glyphs: rendering (shared with the study)", len(ds), render, None),
        ("glyphs: pre-flight, cold (added to the demo)", cold.decoded, cold_s, cold.line()),
        ("glyphs: pre-flight, warm (a rerun)", warm.decoded, warm_s, warm.line()),
    ]
    if a.images:
        root = jpeg_folder(tmp / "jpegs", a.images)
        study = folder_study(root)
        fcold_s, fcold = timed(lambda: preflight(study, progress=False))
        fwarm_s, fwarm = timed(lambda: preflight(study, progress=False))
        rows += [
            (f"{a.images} JPEGs 500×375: pre-flight, cold", fcold.decoded, fcold_s, fcold.line()),
            (f"{a.images} JPEGs 500×375: pre-flight, warm", fwarm.decoded, fwarm_s, fwarm.line()),
        ]
    measured = a.demo_seconds is None
    demo = demo_seconds(tmp) if measured else a.demo_seconds
    rows.append(("demo-size study (search + test stage)", len(ds), demo, None))

    table = Table(title="Pre-flight cost next to the demo's study")
    for col in ("what", "images decoded", "seconds", "% of the demo"):
        table.add_column(col, justify="left" if col == "what" else "right")
    for what, n, s, _ in rows:
        table.add_row(what, str(n), f"{s:.2f}", f"{100 * s / demo:.2f} %")
    console = Console()
    console.print(table)
    how = "timed here" if measured else "given by --demo-seconds"
    console.print(
        f"The demo's study: {demo:.0f} s ({how}). The pre-flight adds its cold time to a "
        f"first demo: {100 * cold_s / demo:.2f} % (goal: < 5 %).",
        soft_wrap=True,
    )
    console.print(f"machine: {machine()}", soft_wrap=True)
    df = pd.DataFrame(
        [{"what": w, "images_decoded": n, "seconds": s, "line": line} for w, n, s, line in rows]
    )
    console.print(f"wrote {write_csv(df, 'preflight')}")


if __name__ == "__main__":
    main()
