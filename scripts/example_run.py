"""What the example generators (modern_example.py, traditional_example.py) share: their
command line (the Omniglot zip, the page to write) and running ``mlrc`` as a user would."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ZIP = REPO.parent / "shared" / "datasets" / "omniglot" / "images_background_small1.zip"
SHOWN_ZIP = "../shared/datasets/omniglot/images_background_small1.zip"  # as the page shows it


def arguments(description: str, out: Path) -> argparse.Namespace:
    """``--zip`` (the Omniglot subset, checked) and ``--out`` (the page)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--zip", type=Path, default=Path(os.environ.get("MLRC_OMNIGLOT_ZIP", ZIP)))
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args()
    if not args.zip.is_file():
        sys.exit(f"--zip {args.zip}: no such file (the Omniglot subset of ../shared/datasets)")
    return args


def environment() -> dict[str, str]:
    """The environment of the runs: 2 torch threads unless MLRC_THREADS says otherwise."""
    return {**os.environ, "MLRC_THREADS": os.environ.get("MLRC_THREADS", "2")}


def mlrc(*args: str, env: dict[str, str]) -> str:
    """``python -m mlrc.cli ARGS`` from the repository; its stdout, or exit with its output."""
    cmd = [sys.executable, "-m", "mlrc.cli", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout
