"""Per-trial overhead of the execution backends, with a no-op fold trainer (bench/noop.py).

    python bench/orchestration.py [--trials 40]

Backends: local (one process; SQLite and PostgreSQL), pool (1, 2, 4 `mlrc worker` processes on
PostgreSQL) and Ray (local Ray, 1 and 4 concurrent trials, PostgreSQL). Every trial is 4 folds
that train nothing, so the figures are the orchestration alone: sampler (TPE), store rows,
locks, heartbeats, process and Ray scheduling. PostgreSQL is a throwaway local server (initdb in
a temporary directory); without its binaries those rows are skipped with the reason.

Columns: median ms/trial = median over trials of (Optuna's datetime_complete − datetime_start);
trials/s = trials ÷ (last completion − first start); wall s = the whole command (process start,
dataset load, Ray start included). Writes bench/results/orchestration.csv with the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd
import yaml
from optuna.trial import TrialState
from rich.console import Console
from rich.table import Table

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def study_file(tmp: Path, name: str, trials: int) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def noop_mlrc(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(BENCH / "noop.py"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a benchmark process failed ({p.returncode}):\n{err[-2000:]}")


def figures(url: str, name: str) -> dict[str, float]:
    ts = optuna.load_study(study_name=name, storage=url).get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)
    )
    per = [(t.datetime_complete - t.datetime_start).total_seconds() for t in ts]
    span = (
        max(t.datetime_complete for t in ts) - min(t.datetime_start for t in ts)
    ).total_seconds()
    return {
        "trials": len(ts),
        "median_ms_per_trial": 1000 * statistics.median(per),
        "trials_per_s": len(ts) / span,
    }


def run_processes(tmp: Path, name: str, url: str, trials: int, workers: int | None) -> dict:
    path = study_file(tmp, name, trials)
    common = ["--storage", url, "--artifacts", str(tmp / "art"), "--quiet"]
    t0 = time.monotonic()
    if workers is None:
        wait_all([noop_mlrc("study", "run", str(path), *common)])
    else:
        wait_all([noop_mlrc("worker", str(path), *common) for _ in range(workers)])
    return {**figures(url, name), "wall_s": time.monotonic() - t0}


def run_ray(tmp: Path, name: str, url: str, trials: int, concurrent: int) -> dict:
    import ray

    from mlrc.config import load_study
    from mlrc.search import open_study
    from mlrc.search.backends.ray import run_search_ray

    path = study_file(tmp, name, trials)
    t0 = time.monotonic()
    ray.init(
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "noop.patch",
            "env_vars": {"PYTHONPATH": str(BENCH), "OMP_NUM_THREADS": "1"},
        },
    )
    try:
        with open_study(load_study(path), url, tmp / "art", progress=False) as ctx:
            run_search_ray(ctx, max_concurrent=concurrent, cpus_per_trial=0.5)
    finally:
        ray.shutdown()
    return {**figures(url, name), "wall_s": time.monotonic() - t0}


def machine() -> str:
    import torch

    return (
        f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}, optuna "
        f"{optuna.__version__}, {platform.platform()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40, help="trials per backend (4 folds each)")
    args = ap.parse_args()
    from mlrc.store.throwaway import PostgresUnavailable, throwaway_postgres

    console = Console()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mlrc-bench-") as d:
        tmp = Path(d)
        sqlite = f"sqlite:///{tmp / 'bench.db'}"
        console.print("local (SQLite) …")
        rows.append(
            {
                "backend": "local",
                "store": "sqlite",
                "workers": 1,
                **run_processes(tmp, "local-sqlite", sqlite, args.trials, None),
            }
        )
        try:
            with throwaway_postgres() as pg:
                console.print("local (PostgreSQL) …")
                url = pg.new_database()
                rows.append(
                    {
                        "backend": "local",
                        "store": "postgresql",
                        "workers": 1,
                        **run_processes(tmp, "local-pg", url, args.trials, None),
                    }
                )
                for n in (1, 2, 4):
                    console.print(f"pool × {n} …")
                    url = pg.new_database()
                    rows.append(
                        {
                            "backend": "pool",
                            "store": "postgresql",
                            "workers": n,
                            **run_processes(tmp, f"pool-{n}", url, args.trials, n),
                        }
                    )
                for n in (1, 4):
                    console.print(f"ray, {n} concurrent …")
                    url = pg.new_database()
                    rows.append(
                        {
                            "backend": "ray",
                            "store": "postgresql",
                            "workers": n,
                            **run_ray(tmp, f"ray-{n}", url, args.trials, n),
                        }
                    )
        except PostgresUnavailable as e:
            console.print(f"[yellow]skipped the PostgreSQL rows:[/yellow] {e}")
    df = pd.DataFrame(rows)
    base = df.iloc[0]["median_ms_per_trial"]
    df["ms_vs_local_sqlite"] = df["median_ms_per_trial"] / base
    table = Table(title=f"Orchestration overhead, no-op folds, {args.trials} trials × 4 folds")
    for col in ("backend", "store", "workers", "median ms/trial", "× local", "trials/s", "wall s"):
        table.add_column(col, justify="left" if col in ("backend", "store") else "right")
    for r in df.itertuples():
        table.add_row(
            r.backend,
            r.store,
            str(r.workers),
            f"{r.median_ms_per_trial:.0f}",
            f"{r.ms_vs_local_sqlite:.2f}",
            f"{r.trials_per_s:.2f}",
            f"{r.wall_s:.0f}",
        )
    console.print(table)
    console.print(f"machine: {machine()}", soft_wrap=True)
    RESULTS.mkdir(exist_ok=True)
    df.assign(machine=machine()).to_csv(RESULTS / "orchestration.csv", index=False)
    console.print(f"wrote {RESULTS / 'orchestration.csv'}")


if __name__ == "__main__":
    main()
