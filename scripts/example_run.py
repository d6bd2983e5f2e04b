"""What the example generators (modern_example.py, traditional_example.py) share: their
command line (the Omniglot zip, the page to write) and running ``mlrc`` as a user would.

The pages show the Omniglot dataset without a root, as a user writes it: mlrc downloads the
zip once into $MLRC_CACHE and checks its SHA-256. ``--zip`` (or $MLRC_OMNIGLOT_ZIP) runs the
examples on a copy you already have instead (the same file: the download is checked against
its SHA-256)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def arguments(description: str, out: Path) -> argparse.Namespace:
    """``--zip`` (a copy of the Omniglot subset, checked; default $MLRC_OMNIGLOT_ZIP, else none:
    mlrc downloads it) and ``--out`` (the page)."""
    ap = argparse.ArgumentParser(description=description)
    zip_default = os.environ.get("MLRC_OMNIGLOT_ZIP") or None
    ap.add_argument("--zip", type=Path, default=zip_default, help="default: the download")
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args()
    if args.zip is not None and not args.zip.is_file():
        sys.exit(f"--zip {args.zip}: no such file (the Omniglot 'background small 1' zip)")
    return args


def root(args: argparse.Namespace) -> str | None:
    """The dataset root the runs use: the ``--zip`` given, or None (mlrc downloads it)."""
    return str(args.zip.resolve()) if args.zip is not None else None


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
