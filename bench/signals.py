"""Time from a stop signal to the stopped line (issue #38).

    .venv/bin/python bench/signals.py [--signals 20] [--preset cpu] [--dataset glyphs]

Runs ``mlrc study run`` (a real process: ``python -m mlrc.cli``) on one SQLite study, glyphs ×
contrastive, a budget it cannot finish, and sends it SIGTERM at a random moment (0.5 to 4 s)
after a fold has started to train; every other run starts with SIGTERM blocked, as a launcher
may leave it. The run must print ``interrupted (SIGTERM): … run the same command to resume``
and exit 143; the next round is the same command, which resumes. The figure is the time from
the signal to that line: its maximum over ``--signals`` signals, beside the step time (a
completed fold's wall time ÷ its training steps: an upper estimate, validation included) and
the bound the issue sets (one step + the checkpoint write + 2 s; ``nan`` when no fold completed,
as when every signal lands in a study's first fold). Writes
``bench/results/signals.csv`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_csv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STOPPED = "run the same command to resume"


def study_file(tmp: Path, preset: str, dataset: str) -> Path:
    doc = {
        "name": "signals",
        "dataset": {"name": dataset},
        "preset": preset,
        "loss": {"name": "contrastive"},
        "search": {"trials": 1000, "sampler": "tpe", "seed": 0},
        "overrides": {"max_epochs": 3},
    }
    path = tmp / "signals.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def training(db: Path) -> bool:
    """A fold of the study is training: its row is running."""
    try:
        with closing(sqlite3.connect(db, timeout=30)) as c:
            return bool(
                c.execute("select 1 from mlrc_fold_run where status = 'running'").fetchall()
            )
    except sqlite3.OperationalError:  # not created yet
        return False


def one_signal(cmd: list[str], db: Path, blocked: bool, rng: random.Random) -> dict:
    """One run stopped by SIGTERM: seconds from the signal to the stopped line, exit code."""
    lines: list[tuple[float, str]] = []
    mask = {signal.SIGTERM} if blocked else set()
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, mask),  # noqa: PLW1509
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 600
    while not training(db):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"mlrc ended before training: {lines}")
        time.sleep(0.05)
    time.sleep(rng.uniform(0.5, 4.0))
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=600)
    reader.join(timeout=10)
    stopped = [t for t, line in lines if STOPPED in line]
    return {
        "blocked_at_start": blocked,
        "exit_code": code,
        "to_line_s": stopped[0] - sent if stopped else float("nan"),
        "to_exit_s": time.monotonic() - sent,
        "line": next((line for _, line in lines if STOPPED in line), ""),
    }


def step_seconds(db: Path, iterations: int) -> float:
    """The longest completed fold's wall time ÷ its training steps (validations included)."""
    with closing(sqlite3.connect(db)) as c:
        rows = c.execute(
            "select f.wall_time_s, max(e.epoch) from mlrc_fold_run f join mlrc_epoch_metric e "
            "on e.fold_run_id = f.id where f.status = 'complete' and f.wall_time_s is not null "
            "group by f.id"
        ).fetchall()
    per_step = [w / (epochs * iterations) for w, epochs in rows if epochs]
    return max(per_step) if per_step else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signals", type=int, default=20)
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--dataset", default="glyphs")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    from mlrc.config import load_study

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path, db = study_file(tmp, a.preset, a.dataset), tmp / "db.sqlite"
        iterations = load_study(path).preset.iterations_per_epoch
        cmd = [sys.executable, "-m", "mlrc.cli", "study", "run", str(path), "--storage",
               f"sqlite:///{db}", "--artifacts", str(tmp / "art"), "--quiet"]  # fmt: skip
        rows = []
        for i in range(a.signals):
            rows.append({"signal": i, **one_signal(cmd, db, i % 2 == 1, rng)})
            print(f"{i}: {rows[-1]}", flush=True)
        step = step_seconds(db, iterations)
    df = pd.DataFrame(rows).assign(preset=a.preset, step_s=step)
    write_csv(df, "signals")
    bad = df[df.exit_code != 143]
    print(f"\n{machine()}\n")
    print(
        "| preset | signals | blocked at start | exit 143 | max to line (s) | median (s) | step (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {a.preset} | {len(df)} | {int(df.blocked_at_start.sum())} | {len(df) - len(bad)} "
        f"| {df.to_line_s.max():.2f} | {df.to_line_s.median():.2f} | {step:.3f} |"
    )


if __name__ == "__main__":
    main()
