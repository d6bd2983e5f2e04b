"""Two-rank studies (``--procs-per-trial 2``, gloo on the CPU) where users run them: a pool
worker on a real PostgreSQL, the Ray backend on a real local Ray, and a rank killed mid-fold.

Each fold trains as 2 processes (``mlrc.train.launch``); the tests check the rows those studies
leave (the same tables, one row per fold, every fold's provenance naming its 2 processes) and
that a rank killed with SIGKILL interrupts its trial with the reason while the worker goes on,
the retry resuming from the fold's ``last.pt``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import yaml
from conftest import rank_pids
from optuna.trial import TrialState
from sqlalchemy import select
from test_pool import (
    FAST,
    _engine,
    _running_fold_with_a_checkpoint,
    check_complete_study,
    finish,
    optuna_trials,
    pool_study,
    start_pool,
    with_password,
)

from mlrc import store
from mlrc.store.engine import get_study, session
from mlrc.store.schema import FoldRun, Trial


def ranked_study(tmp_path: Path, omniglot_zip: Path, name: str) -> Path:
    """A 1-trial pool study whose file says ``processes_per_trial: 2``: its crops are random,
    so K is part of its identity and ``--procs-per-trial 2`` must match the file (#37)."""
    path = pool_study(tmp_path, omniglot_zip, name, trials=1)
    doc = yaml.safe_load(path.read_text())
    doc["overrides"] = {**doc["overrides"], "processes_per_trial": 2}
    path.write_text(yaml.safe_dump(doc))
    return path


def fold_rows(url: str, name: str) -> list[FoldRun]:
    with session(_engine(url)) as s:
        sid = get_study(s, name).id
        return list(s.execute(select(FoldRun).filter_by(study_id=sid)).scalars())


def worker_mid_fold(tmp_path: Path, omniglot_zip: Path, url: str, name: str):
    """A pool worker of a 1-trial study with ``--procs-per-trial 2``, once one of its folds has
    a checkpoint (epoch ≥ 1 stored) and both ranks run: (worker, that fold's row, rank pids)."""
    study = ranked_study(tmp_path, omniglot_zip, name)
    (worker,) = start_pool(1, study, url, tmp_path, "--procs-per-trial", "2")
    deadline = time.monotonic() + 300
    fold, ranks = None, []
    while time.monotonic() < deadline and not (fold and len(ranks) == 2):
        fold = _running_fold_with_a_checkpoint(url, name)
        ranks = rank_pids(worker.proc.pid) if fold else []
        time.sleep(0.1)
    assert fold is not None and len(ranks) == 2, f"no 2-rank fold reached epoch 1: {ranks}"
    return worker, fold, ranks


def test_a_killed_rank_interrupts_its_trial_and_the_worker_goes_on(
    tmp_path, fresh_database, omniglot_zip
):
    url = with_password(fresh_database)
    worker, fold, ranks = worker_mid_fold(tmp_path, omniglot_zip, url, "ranks-b")
    os.kill(ranks[1], signal.SIGKILL)
    finish([worker])
    out = worker.output()
    assert f"trial {fold.trial_number} interrupted" in out and "SIGKILL" in out, out[-3000:]
    check_complete_study(url, "ranks-b", 1)  # the retry is the one complete trial
    ts = {t.number: t for t in optuna_trials(url, "ranks-b")}
    killed = ts[fold.trial_number]
    assert killed.state == TrialState.FAIL and "SIGKILL" in killed.user_attrs["reason"]
    retries = [t for t in ts.values() if t.user_attrs.get("retry_of") == killed.number]
    assert [t.state for t in retries] == [TrialState.COMPLETE]
    with session(_engine(url)) as s:
        row = s.execute(select(Trial).filter_by(number=killed.number)).scalar_one()
    assert row.state == "interrupted" and row.reason.startswith("interrupted: rank ")
    assert "of 2 ended by SIGKILL" in row.reason
    # the killed fold resumed from its last.pt: its epochs before the kill were not retrained;
    # the pool worker trained every fold as 2 ranks, one row per fold
    rows = fold_rows(url, "ranks-b")
    (resumed,) = [r for r in rows if r.id == fold.id]
    assert resumed.status == "complete" and resumed.provenance["processes"] == 2
    assert len(rows) == 4 and all(r.provenance["processes"] == 2 for r in rows)


def test_ray_trials_train_their_folds_as_two_ranks(tmp_path, omniglot_zip):
    import yaml

    url = f"sqlite:///{tmp_path / 'ray.db'}"
    doc = {
        "name": "ranks-ray",
        "dataset": {"name": "omniglot", "root": str(omniglot_zip)},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 1, "sampler": "gp", "seed": 5},
        # a Ray Train run per fold: ~10 s; 2 processes, as the flag says (random crops)
        "overrides": {**FAST, "max_epochs": 1, "folds": 2, "processes_per_trial": 2},
    }
    study = tmp_path / "ranks-ray.yaml"
    study.write_text(yaml.safe_dump(doc))
    r = subprocess.run(
        [sys.executable, "-m", "mlrc.cli", "study", "run", str(study), "--backend", "ray"]
        + ["--procs-per-trial", "2", "--cpus-per-trial", "2", "--storage", url, "--quiet"]
        + ["--artifacts", str(tmp_path / "art")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ts = optuna.load_study(study_name="ranks-ray", storage=url).get_trials(deepcopy=False)
    assert [t.state for t in ts] == [TrialState.COMPLETE]
    assert ts[0].user_attrs["worker"].startswith("ray:")
    engine = store.connect(url)
    with session(engine) as s:
        rows = s.execute(select(FoldRun)).scalars().all()
    assert len(rows) == 2 and all(r.provenance["processes"] == 2 for r in rows)


def test_study_run_trains_two_rank_folds_into_the_usual_tables(tmp_path, omniglot_zip):
    """The local backend (``mlrc study run --procs-per-trial 2``) on SQLite: a complete study,
    one row per fold, each fold's provenance naming its 2 processes, the status line saying so."""
    url = f"sqlite:///{tmp_path / 'local.db'}"
    study = ranked_study(tmp_path, omniglot_zip, "ranks-local")
    r = subprocess.run(
        [sys.executable, "-m", "mlrc.cli", "study", "run", str(study), "--storage", url]
        + ["--artifacts", str(tmp_path / "art"), "--procs-per-trial", "2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "computed on: 2 processes on " in r.stdout, r.stdout[-2000:]
    ts = optuna.load_study(study_name="ranks-local", storage=url).get_trials(deepcopy=False)
    assert [t.state for t in ts] == [TrialState.COMPLETE]
    with session(store.connect(url)) as s:
        rows = s.execute(select(FoldRun)).scalars().all()
    assert len(rows) == 4 and all(r.status == "complete" for r in rows)
    assert all(r.provenance["processes"] == 2 for r in rows)


def test_sigterm_interrupts_a_two_rank_trial_and_leaves_no_rank(
    tmp_path, fresh_database, omniglot_zip
):
    """Slurm's scancel (SIGTERM) reaches a worker while its ranks train: the trial is recorded
    interrupted (retried by the next worker), the worker exits 143, no rank is left running."""
    url = fresh_database
    worker, fold, ranks = worker_mid_fold(tmp_path, omniglot_zip, url, "ranks-c")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(120) == 143, worker.output()[-3000:]
    time.sleep(1)
    assert not [p for p in ranks if Path(f"/proc/{p}").exists()], "a rank outlived its worker"
    with session(_engine(url)) as s:
        row = s.execute(select(Trial).filter_by(number=fold.trial_number)).scalar_one()
    assert row.state == "interrupted", (row.state, row.reason)
