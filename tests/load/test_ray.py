"""The Ray backend on a real local Ray: same rows and report as the worker pool, folds as
parallel Ray tasks, a scheduler-stopped trial recorded as pruned."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import yaml
from optuna.trial import TrialState
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from sqlalchemy import func, select

from mlrc import store
from mlrc.config import load_study
from mlrc.search import open_study
from mlrc.search.backends.ray import NUMBER, run_search_ray
from mlrc.store.engine import get_study, session
from mlrc.store.schema import EpochMetric, FoldRun, TestResult, Trial

FAST = {  # on 16-px crops, 2 folds: what is tested is where the folds run, not what they learn
    "iterations_per_epoch": 5,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "image": {"resize": 20, "crop": 16},
    "eval_batch_size": 256,
}


def write_study(
    tmp_path: Path, name: str, dataset: dict, trials: int, reps: int = 2, folds: int = 2
) -> Path:
    doc = {
        "name": name,
        "dataset": dataset,
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "gp", "seed": 11},
        "test": {"reproductions": reps},
        "overrides": {**FAST, "folds": folds},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def mlrc(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "mlrc.cli", *args], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def shape(url: str, name: str) -> dict:
    """What a study leaves in the store, without the numbers."""
    engine = store.connect(url)
    with session(engine) as s:
        sid = get_study(s, name).id
        trials = s.execute(select(Trial.state).filter_by(study_id=sid)).scalars().all()
        folds = s.execute(
            select(FoldRun.kind, FoldRun.reproduction, FoldRun.fold, FoldRun.status)
            .filter_by(study_id=sid)
            .order_by(FoldRun.kind, FoldRun.reproduction, FoldRun.fold)
        ).all()
        epochs = s.execute(
            select(func.count())
            .select_from(EpochMetric)
            .join(FoldRun, EpochMetric.fold_run_id == FoldRun.id)
            .filter(FoldRun.study_id == sid)
        ).scalar()
        tests = s.execute(
            select(TestResult.reproduction, TestResult.mode, TestResult.fold)
            .filter_by(study_id=sid)
            .order_by(TestResult.reproduction, TestResult.mode, TestResult.fold)
        ).all()
    return {
        "trials": sorted(trials),
        "folds": [tuple(f[1:]) for f in folds if f[0] == "test"],
        "search_folds": sorted(tuple(f[2:]) for f in folds if f[0] == "search"),
        "has_epochs": epochs > 0,
        "tests": [tuple(t) for t in tests],
    }


def test_ray_backend_gives_the_same_rows_and_report_as_the_pool(tmp_path, fresh_database):
    """The embedded glyphs (what a study trains on is not the point here, and they validate in
    a fraction of Omniglot's time; the real dataset is trained by tests/search)."""
    url = fresh_database
    ds = {"name": "glyphs"}
    art = str(tmp_path / "art")
    common = ["--storage", url, "--artifacts", art, "--quiet"]
    ray_study = write_study(tmp_path, "via-ray", ds, trials=2)
    pool_study = write_study(tmp_path, "via-pool", ds, trials=2)
    mlrc("study", "run", str(ray_study), "--backend", "ray", "--max-concurrent", "2", *common)
    mlrc("worker", str(pool_study), *common)
    tests = [  # the local test stage of both studies, side by side
        subprocess.Popen(
            [sys.executable, "-m", "mlrc.cli", "study", "test", str(path), *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},  # one core each, no oversubscription
        )
        for path in (ray_study, pool_study)
    ]
    for p in tests:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]

    ts = optuna.load_study(study_name="via-ray", storage=url).get_trials(deepcopy=False)
    assert [t.state for t in ts] == [TrialState.COMPLETE] * 2
    assert all(t.user_attrs["worker"].startswith("ray:") for t in ts)
    for t in ts:  # the running mean after each fold; after the last (2nd) it is the objective
        assert sorted(t.intermediate_values) == [1, 2]
        assert t.intermediate_values[2] == t.value
    a, b = shape(url, "via-ray"), shape(url, "via-pool")
    assert a == b and a["trials"] == ["complete", "complete"] and a["has_epochs"]
    assert len(a["tests"]) == 2 * (2 + 2)  # per reproduction: 2 folds + 2 aggregates

    csv = mlrc(
        "report", *common[:2], "--study", "via-ray", "--study", "via-pool", "--format", "csv"
    )
    table = pd.read_csv(io.StringIO(csv))
    ray_rows = table[table.study == "via-ray"].drop(columns=["study"]).reset_index(drop=True)
    pool_rows = table[table.study == "via-pool"].drop(columns=["study"]).reset_index(drop=True)
    assert len(ray_rows) == len(pool_rows) > 0
    cells = ["dataset", "loss", "mode", "metric", "n"]
    pd.testing.assert_frame_equal(ray_rows[cells], pool_rows[cells])


class StopTrialOneAfterItsFirstFold(FIFOScheduler):
    """A Tune scheduler that stops Optuna trial 1 as soon as it reports its first fold."""

    def on_trial_result(self, tune_controller, trial, result):
        if trial.config.get(NUMBER) == 1 and result.get("folds_done", 0) >= 1:
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE


def test_folds_as_parallel_ray_tasks_and_a_stopped_trial_is_pruned(tmp_path):
    path = write_study(tmp_path, "ray-prune", {"name": "glyphs"}, trials=2, folds=4)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with open_study(load_study(path), url, tmp_path / "art", progress=False) as ctx:
        run_search_ray(
            ctx,
            cpus_per_trial=2.0,
            fold_parallel=True,
            scheduler=StopTrialOneAfterItsFirstFold(),
        )
    ts = {t.number: t for t in optuna.load_study(study_name="ray-prune", storage=url).trials}
    assert ts[0].state == TrialState.COMPLETE
    assert ts[1].state == TrialState.PRUNED
    assert sorted(ts[1].intermediate_values) == [1]  # the result it was stopped on
    engine = store.connect(url)
    with session(engine) as s:
        rows = {t.number: t for t in s.execute(select(Trial)).scalars()}
        folds = s.execute(select(FoldRun).filter_by(trial_number=0, kind="search")).scalars().all()
    assert rows[0].state == "complete" and rows[1].state == "pruned"
    assert rows[1].reason == "stopped by the scheduler after 1 of 4 folds"
    assert rows[0].value == ts[0].value
    # the folds of trial 0 ran at the same time (as parallel Ray tasks): on a loaded 2-core
    # machine a task's worker may start after a tiny fold has ended, so: some pair overlapped
    spans = [(f.updated.timestamp() - f.wall_time_s, f.updated.timestamp()) for f in folds]
    overlapping = [(a, b) for a in spans for b in spans if a < b and b[0] < a[1] and a[0] < b[1]]
    assert len(folds) == 4 and overlapping
