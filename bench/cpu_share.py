"""Fair CPU shares (issue #15): aggregate search throughput of 1, 2 and 3 concurrent
``mlrc study run`` processes on this host, with the default (each takes its share of the cores)
and with the old behaviour (``--threads`` = all visible cores in every process).

    .venv/bin/python bench/cpu_share.py [--window 100] [--max-epochs 2]

Each process runs its own study (glyphs × contrastive, cpu preset, ``max_epochs`` small, a
budget of trials it cannot finish) into its own SQLite store in a temporary folder, for
``--window`` seconds, then is killed. Throughput = complete search folds of all processes ÷ 4
(folds per trial) ÷ window, in trials per hour. With 1 process both settings are the same run.
Goal: aggregate throughput of 3 workers ≥ 0.9 × that of 1. Writes bench/results/cpu_share.csv
and .md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, write_csv  # noqa: E402

from mlrc import store  # noqa: E402
from mlrc.store.schema import FoldRun  # noqa: E402
from mlrc.train.threads import visible_cores  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def study_file(tmp: Path, i: int, max_epochs: int) -> Path:
    """A study YAML of its own for process ``i`` (seed i: different trials)."""
    doc = {
        "name": f"share-{i}",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 200, "seed": i},
        "overrides": {"max_epochs": max_epochs},
    }
    path = tmp / f"share-{i}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def complete_folds(db: Path) -> int:
    """Complete search fold runs in one store."""
    engine = store.connect(f"sqlite:///{db}", read_only=True)
    with engine.connect() as c:
        q = select(func.count()).select_from(FoldRun)
        q = q.where(FoldRun.status == "complete", FoldRun.kind == "search")
        return int(c.execute(q).scalar_one())


def run_scenario(n: int, threads: int | None, a: argparse.Namespace) -> dict:
    """n concurrent processes for a.window seconds; their complete folds and trials/hour."""
    with tempfile.TemporaryDirectory(prefix="mlrc-share-") as d:
        tmp = Path(d)
        env = {**os.environ, "MLRC_CACHE": str(tmp / "cache")}  # a lock dir of this run only
        env.pop("MLRC_THREADS", None)
        procs = []
        for i in range(n):
            cmd = [
                sys.executable,
                "-m",
                "mlrc.cli",
                "study",
                "run",
                str(study_file(tmp, i, a.max_epochs)),
            ]
            cmd += ["--storage", f"sqlite:///{tmp / f's{i}.db'}", "--artifacts", str(tmp / f"a{i}")]
            cmd += ["--quiet"] + (["--threads", str(threads)] if threads else [])
            log = (tmp / f"log{i}.txt").open("w")
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(a.window)
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        folds = sum(complete_folds(tmp / f"s{i}.db") for i in range(n))
    return {
        "workers": n,
        "setting": "default (fair share)" if threads is None else f"--threads {threads} (old)",
        "window_s": a.window,
        "folds": folds,
        "trials_per_hour": folds / 4 / a.window * 3600,
    }


def markdown(df: pd.DataFrame, cores: int) -> str:
    """The table, with each row's throughput relative to 1 worker."""
    one = df.loc[df.workers == 1, "trials_per_hour"].iloc[0]
    lines = [
        f"# Fair CPU shares: aggregate throughput ({cores} visible cores)",
        "",
        f"Machine: {machine()}",
        "",
        "| workers | setting | complete folds | trials/hour | × 1 worker |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| {r.workers} | {r.setting} | {r.folds} | {r.trials_per_hour:.1f} | "
            f"{r.trials_per_hour / one:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=100.0, help="seconds per scenario")
    ap.add_argument("--max-epochs", type=int, default=2)
    a = ap.parse_args()
    cores = visible_cores()
    rows = [run_scenario(1, None, a)]
    for n in (2, 3):
        rows.append(run_scenario(n, None, a))
        rows.append(run_scenario(n, cores, a))
    for r in rows:
        print(r, flush=True)
    df = pd.DataFrame(rows)
    write_csv(df, "cpu_share")
    (RESULTS / "cpu_share.md").write_text(markdown(df, cores))
    print(markdown(df, cores))


if __name__ == "__main__":
    main()
