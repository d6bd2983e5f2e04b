"""What opt-in pruning saves: fold trainings needed to reach the final best trial, with and
without ``search.pruner: median``, on a 24-trial cpu-preset study of the Omniglot subset.

    .venv/bin/python bench/study_cost.py [--trials 24] [--dataset PATH.zip] [--max-epochs N]

Without --dataset (or $MLRC_OMNIGLOT_ZIP) the studies' Omniglot has no root: mlrc downloads the
zip once into $MLRC_CACHE and checks its SHA-256.

Two studies that differ only in ``search.pruner`` (none | median, ``prune_startup`` 5) run with
``mlrc study run`` (two processes at once unless ``--sequential``; each with one thread) into
one SQLite store. Counted from the store: fold trainings (search-stage fold runs) in all trials
and in the trials up to and including the final best one; the best validation MAP@R and the
SEM over its 4 folds. Goal (issue #7): ≥ 40% fewer fold trainings to reach the best trial with
pruning, and its best within one fold-SEM of the unpruned study's. The reference preset never
prunes; report tables mark a pruned study with ‡. Writes bench/results/study_cost-seed<S>.csv.
"""

from __future__ import annotations

import argparse
import os
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
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_csv  # noqa: E402

from mlrc import store  # noqa: E402
from mlrc.store.engine import get_study, session  # noqa: E402
from mlrc.store.schema import FoldRun, Study, Trial  # noqa: E402


def study_file(tmp: Path, pruner: str, a: argparse.Namespace) -> Path:
    doc = {
        "name": f"cost-{pruner}",
        "dataset": {"name": "omniglot", **({"root": str(a.dataset)} if a.dataset else {})},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {
            "trials": a.trials,
            "sampler": a.sampler,
            "seed": a.seed,
            "pruner": pruner,
            "prune_startup": a.prune_startup,
        },
        "overrides": {"max_epochs": a.max_epochs} if a.max_epochs else {},
    }
    path = tmp / f"cost-{pruner}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_studies(files: list[Path], url: str, art: Path, sequential: bool) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mlrc.cli", "study", "run"]
    walls, procs = {}, []
    for f in files:
        args = [*cmd, str(f), "--storage", url, "--artifacts", str(art), "--quiet"]
        procs.append((f.stem, time.monotonic(), subprocess.Popen(args, env=env)))
        if sequential:
            name, t0, p = procs.pop()
            if p.wait() != 0:
                raise SystemExit(f"{name} failed")
            walls[name] = time.monotonic() - t0
    while procs:  # each study's own wall time, whichever ends first
        for name, t0, p in list(procs):
            if p.poll() is not None:
                if p.returncode != 0:
                    raise SystemExit(f"{name} failed")
                walls[name] = time.monotonic() - t0
                procs.remove((name, t0, p))
        time.sleep(1)
    return walls


def figures(url: str, name: str) -> dict:
    ostudy = optuna.load_study(study_name=name, storage=url)
    best = ostudy.best_trial
    engine = store.connect(url)
    with session(engine) as s:
        sid = get_study(s, name).id
        folds_by_trial = dict(
            s.execute(
                select(FoldRun.trial_number, func.count())
                .filter_by(study_id=sid, kind="search")
                .group_by(FoldRun.trial_number)
            ).all()
        )
        sem = s.execute(select(Trial.sem).filter_by(study_id=sid, number=best.number)).scalar_one()
        pruner = (s.get(Study, sid).config or {}).get("pruner", "none")
    states = [t.state for t in ostudy.trials]
    return {
        "study": name,
        "pruning": pruner,
        "trials": len(states),
        "complete": states.count(TrialState.COMPLETE),
        "pruned": states.count(TrialState.PRUNED),
        "fold_trainings": sum(folds_by_trial.values()),
        "best_trial": best.number,
        "folds_to_best": sum(n for t, n in folds_by_trial.items() if t <= best.number),
        "best_val_map_at_r": best.value,
        "best_fold_sem": sem,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--dataset", type=Path, default=os.environ.get("MLRC_OMNIGLOT_ZIP") or None)
    ap.add_argument("--max-epochs", type=int, default=None, help="override the cpu preset's 16")
    ap.add_argument("--sampler", default="gp", choices=["gp", "tpe"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prune-startup", type=int, default=5)
    ap.add_argument("--sequential", action="store_true", help="one study after the other")
    ap.add_argument("--keep", type=Path, default=None, help="keep the store and artifacts here")
    ap.add_argument("--quick", action="store_true", help="6 trials, 3 epochs (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.trials, a.max_epochs, a.prune_startup = 6, 3, 2
    if a.dataset is not None and not a.dataset.is_file():
        raise SystemExit(f"{a.dataset}: the Omniglot subset zip is missing (--dataset)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = a.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{tmp / 'cost.db'}"
        files = [study_file(tmp, p, a) for p in ("none", "median")]
        walls = run_studies(files, url, tmp / "artifacts", a.sequential)
        df = pd.DataFrame([figures(url, f.stem) for f in files])
    df["wall_s"] = df["study"].map(walls)
    base = df.iloc[0]
    df["folds_to_best_ratio"] = df["folds_to_best"] / base["folds_to_best"]
    df["fold_trainings_ratio"] = df["fold_trainings"] / base["fold_trainings"]
    df["best_minus_unpruned"] = df["best_val_map_at_r"] - base["best_val_map_at_r"]
    df["within_one_sem"] = df["best_minus_unpruned"] >= -base["best_fold_sem"]
    epochs = a.max_epochs or 16
    table = Table(title=f"{a.trials}-trial cpu-preset study on Omniglot ({epochs} max epochs)")
    cols = [
        ("pruning", "pruning"),
        ("trials (pruned)", None),
        ("fold trainings", "fold_trainings"),
        ("× none", "fold_trainings_ratio"),
        ("best trial", "best_trial"),
        ("folds to best", "folds_to_best"),
        ("× none ", "folds_to_best_ratio"),
        ("best val MAP@R ± fold-SEM", None),
        ("Δ vs none", "best_minus_unpruned"),
        ("wall s", "wall_s"),
    ]
    for title, _ in cols:
        table.add_column(title, justify="left" if title == "pruning" else "right")
    for r in df.to_dict("records"):
        table.add_row(
            r["pruning"],
            f"{r['trials']} ({r['pruned']})",
            str(r["fold_trainings"]),
            f"{r['fold_trainings_ratio']:.2f}",
            str(r["best_trial"]),
            str(r["folds_to_best"]),
            f"{r['folds_to_best_ratio']:.2f}",
            f"{r['best_val_map_at_r']:.4f} ± {r['best_fold_sem']:.4f}",
            f"{r['best_minus_unpruned']:+.4f}",
            f"{r['wall_s']:.0f}",
        )
    console = Console(width=max(Console().width, 150))
    console.print(table)
    saved = 1 - df.iloc[1]["folds_to_best_ratio"]
    total = 1 - df.iloc[1]["fold_trainings_ratio"]
    console.print(
        f"pruning: {saved:.0%} fewer fold trainings to reach the best trial, {total:.0%} fewer in "
        f"all (goal ≥ 40%); best {'within' if df.iloc[1]['within_one_sem'] else 'NOT within'} "
        "one fold-SEM of the unpruned study's"
    )
    console.print(f"machine: {machine()}", soft_wrap=True)
    console.print(
        f"wrote {write_csv(df.assign(max_epochs=epochs, sampler=a.sampler, seed=a.seed), f'study_cost-seed{a.seed}')}"
    )


if __name__ == "__main__":
    main()
