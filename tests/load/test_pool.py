"""Worker pools on a real PostgreSQL: a global trial budget, dead workers, a restarted database.

Each test starts real `mlrc worker` processes against a fresh database on the throwaway server
(conftest.postgres_server) and checks the rows they leave behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy import func, select

from mlrc import store
from mlrc.store.engine import get_study, session
from mlrc.store.schema import EpochMetric, FoldRun, Trial

PASSWORD = "s3cret-Pw0rd"  # trust auth ignores it; it must never reach a log line
FAST = {  # cpu preset, shortened, on 16-px crops: a fold is a few seconds on one core
    "iterations_per_epoch": 6,
    "max_epochs": 3,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "image": {"resize": 20, "crop": 16},  # a quarter of the 32-px crops' compute
    "eval_batch_size": 256,
}


def pool_study(tmp_path: Path, omniglot_zip: Path, name: str, trials: int) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "omniglot", "root": str(omniglot_zip)},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "gp", "seed": 3},
        "test": {"reproductions": 2},
        "overrides": FAST,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def with_password(url: str) -> str:
    return url.replace("://mlrc@", f"://mlrc:{PASSWORD}@")


class Worker:
    def __init__(self, study: Path, url: str, art: Path, log: Path, *extra: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlrc.cli", "worker", str(study), "--storage", url]
            + ["--artifacts", str(art), "--quiet", *extra],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"worker {self.proc.pid} still running after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text()


def start_pool(n: int, study: Path, url: str, tmp_path: Path, *extra: str) -> list[Worker]:
    art = tmp_path / "shared-artifacts"
    return [Worker(study, url, art, tmp_path / f"worker{i}.log", *extra) for i in range(n)]


def finish(workers: list[Worker], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    for w in workers:
        if w.proc.returncode is not None and w.proc.returncode < 0:
            continue  # killed by the test
        rc = w.wait(max(1.0, deadline - time.monotonic()))
        assert rc == 0, w.output()
        assert PASSWORD not in w.output()


_STORAGES: dict[str, optuna.storages.RDBStorage] = {}


def optuna_trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    if url not in _STORAGES:
        _STORAGES[url] = optuna.storages.RDBStorage(url)
    storage = _STORAGES[url]
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def check_complete_study(url: str, name: str, trials: int, folds: int = 4) -> None:
    """Exactly ``trials`` COMPLETE, nothing RUNNING or WAITING, one fold row per (params, fold)."""
    ts = optuna_trials(url, name)
    states = [t.state for t in ts]
    assert states.count(TrialState.COMPLETE) == trials, states
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states, states
    with session(_engine(url)) as s:
        sid = get_study(s, name).id
        runs = s.execute(select(FoldRun).filter_by(study_id=sid, kind="search")).scalars().all()
        mlrc_trials = s.execute(select(Trial).filter_by(study_id=sid)).scalars().all()
        dup_epochs = s.execute(
            select(EpochMetric.fold_run_id, EpochMetric.epoch, func.count())
            .group_by(EpochMetric.fold_run_id, EpochMetric.epoch)
            .having(func.count() > 1)
        ).all()
    keys = [(r.params_hash, r.fold) for r in runs]
    assert len(keys) == len(set(keys)) == trials * folds
    assert all(r.status == "complete" for r in runs)
    assert not dup_epochs
    complete = {t.number: t for t in mlrc_trials if t.state == "complete"}
    assert sorted(complete) == sorted(t.number for t in ts if t.state == TrialState.COMPLETE)
    for t in ts:
        if t.state == TrialState.COMPLETE:
            assert complete[t.number].value == pytest.approx(t.value, abs=1e-12)


def test_three_workers_share_one_global_budget(tmp_path, fresh_database, omniglot_zip):
    url = with_password(fresh_database)
    study = pool_study(tmp_path, omniglot_zip, "pool-a", trials=6)
    # three processes: one plain worker and `--per-gpu 2` (two workers packed on one device)
    workers = start_pool(1, study, url, tmp_path)
    art = tmp_path / "shared-artifacts"
    packed = Worker(study, url, art, tmp_path / "packed.log", "--per-gpu", "2")
    workers.append(packed)
    finish(workers)
    check_complete_study(url, "pool-a", 6)
    ts = optuna_trials(url, "pool-a")
    assert len(ts) == 6  # the budget is global: no worker ran a seventh trial
    assert len({t.user_attrs["worker"] for t in ts}) >= 2  # trials really ran in parallel
    out = packed.output()
    pids = [int(p) for p in out.split("pids [", 1)[1].split("]", 1)[0].split(", ")]
    assert len(pids) == 2 and all(f"worker {p} " in out for p in pids)  # both children worked
    for w in workers:  # credentials masked in the worker's own lines too
        assert "mlrc:***@" in w.output()


_ENGINES: dict[str, object] = {}


def _engine(url: str):
    """One engine per database for the test's polling (an engine per poll would leak
    connections until PostgreSQL refuses new clients)."""
    if url not in _ENGINES:
        _ENGINES[url] = store.connect(url)
    return _ENGINES[url]


def _running_fold_with_a_checkpoint(url: str, name: str) -> FoldRun | None:
    with session(_engine(url)) as s:
        sid = get_study(s, name)
        if sid is None:
            return None
        return s.execute(
            select(FoldRun)
            .join(EpochMetric, EpochMetric.fold_run_id == FoldRun.id)
            .filter(FoldRun.study_id == sid.id, FoldRun.status == "running", EpochMetric.epoch >= 1)
            .limit(1)
        ).scalar_one_or_none()


def test_a_worker_killed_mid_fold_loses_nothing(tmp_path, fresh_database, omniglot_zip):
    url = fresh_database
    study = pool_study(tmp_path, omniglot_zip, "pool-b", trials=6)
    workers = start_pool(3, study, url, tmp_path, "--heartbeat", "1", "--grace", "4")
    by_pid = {w.proc.pid: w for w in workers}
    deadline = time.monotonic() + 300
    victim = None
    while victim is None and time.monotonic() < deadline:
        fold = _running_fold_with_a_checkpoint(url, "pool-b")
        if fold is not None:
            trial = next(t for t in optuna_trials(url, "pool-b") if t.number == fold.trial_number)
            if trial.state == TrialState.RUNNING:
                victim = (by_pid[int(trial.user_attrs["worker"].rsplit(":", 1)[1])], trial, fold)
        time.sleep(0.2)
    assert victim is not None, "no fold reached its second epoch"
    worker, killed, fold = victim
    engine = _engine(url)
    with session(engine) as s:  # folds of the killed trial finished before the kill
        done_before = {
            r.fold: r.updated
            for r in s.execute(
                select(FoldRun).filter_by(params_hash=fold.params_hash, status="complete")
            ).scalars()
        }
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait()
    finish([w for w in workers if w is not worker])
    check_complete_study(url, "pool-b", 6)
    ts = {t.number: t for t in optuna_trials(url, "pool-b")}
    assert ts[killed.number].state == TrialState.FAIL
    retries = [t for t in ts.values() if t.user_attrs.get("retry_of") == killed.number]
    assert [t.state for t in retries] == [TrialState.COMPLETE]
    assert retries[0].params == killed.params
    with session(engine) as s:
        row = s.execute(select(Trial).filter_by(number=killed.number)).scalar_one()
        assert row.state == "interrupted" and "no heartbeat for more than 4 s" in row.reason
        after = {
            r.fold: r.updated
            for r in s.execute(select(FoldRun).filter_by(params_hash=fold.params_hash)).scalars()
        }
    assert all(after[f] == t for f, t in done_before.items())  # reused, not retrained
    assert sorted(after) == [0, 1, 2, 3]


def test_workers_continue_through_a_database_restart(
    tmp_path, fresh_database, postgres_server, omniglot_zip
):
    url = with_password(fresh_database)
    study = pool_study(tmp_path, omniglot_zip, "pool-c", trials=4)
    workers = start_pool(2, study, url, tmp_path, "--heartbeat", "1", "--grace", "30")
    deadline = time.monotonic() + 300
    while _running_fold_with_a_checkpoint(url, "pool-c") is None:
        assert time.monotonic() < deadline, "no fold started"
        time.sleep(0.2)
    postgres_server.restart(down_s=3)
    finish(workers)
    check_complete_study(url, "pool-c", 4)
    assert any("unreachable" in w.output() or "retrying" in w.output() for w in workers)


def test_sqlite_refuses_a_second_worker(tmp_path, omniglot_zip):
    study = pool_study(tmp_path, omniglot_zip, "pool-sqlite", trials=2)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = Worker(study, url, tmp_path / "art", tmp_path / "w0.log")
    deadline = time.monotonic() + 120
    while not (tmp_path / "art" / "pool-sqlite").exists():  # the first holds the study's lock
        assert time.monotonic() < deadline and first.proc.poll() is None, first.output()
        time.sleep(0.2)
    second = Worker(study, url, tmp_path / "art", tmp_path / "w1.log")
    assert second.wait(120) == 2
    out = second.output()
    assert "allows one process per study" in out and "PostgreSQL" in out
    assert len(out.strip().splitlines()) == 1
    first.proc.kill()
    first.proc.wait()
