"""Watching a campaign: ``mlrc campaign status`` counts each study's trials and test folds done /
running / left and names the worker holding each running one; ``mlrc campaign plan --workers
N`` gives the wall-clock on N workers.

The stores are real: a tiny campaign run in a child process killed with SIGKILL while a test
fold runs (the rows a crashed worker leaves), and a running trial written as a worker writes
it (Optuna's ``worker`` attribute and heartbeat). Every count is checked against the store's
rows read here with SQLAlchemy; the wall-clock against a simulation of N workers."""

from __future__ import annotations

import heapq
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import typer
import yaml
from sqlalchemy import select, text
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli.campaign import campaign_app
from mlrc.search.campaign_runner import parse_campaign, register, resolve_campaign
from mlrc.search.plan import plan_campaign
from mlrc.store import trials
from mlrc.store.engine import session
from mlrc.store.schema import FoldRun, Study, TestResult, Trial

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
app = typer.Typer()
app.add_typer(campaign_app, name="campaign")
FOLDS, REPS = 2, 2
LOSSES = ["contrastive", "triplet"]
NAMES = [f"watch-glyphs-{loss}" for loss in LOSSES]


def doc(trials: int = 1) -> dict:
    return {
        "name": "watch",
        "datasets": [{"name": "glyphs"}],
        "losses": LOSSES,
        "preset": "cpu",
        "search": {"trials": trials, "seed": 3},
        "test": {"reproductions": REPS},
        "overrides": {"max_epochs": 1, "folds": FOLDS, "iterations_per_epoch": 2},
    }


def cli(*args, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def status_json(url: str) -> dict:
    out = json.loads(cli("campaign", "status", "watch", "--storage", url, "--json").output)
    return {s["study"]: s for s in out["studies"]} | {"": out}


def naive(url: str) -> dict[str, dict]:
    """Per study, from the rows: trials done/running, distinct test (rep, fold) complete or of
    a tested reproduction, and the running test folds with their provenance."""
    with session(store.connect(url, read_only=True)) as s:
        ids = dict(s.execute(select(Study.id, Study.name)).all())
        out = {}
        for sid, name in ids.items():
            states = s.execute(select(Trial.state).filter_by(study_id=sid)).scalars().all()
            folds = s.execute(select(FoldRun).filter_by(study_id=sid, kind="test")).scalars()
            folds = list(folds)
            reps = set(s.execute(select(TestResult.reproduction).filter_by(study_id=sid)).scalars())
            done = {(f.reproduction, f.fold) for f in folds if f.status == "complete"}
            done |= {(r, k) for r in reps for k in range(FOLDS)}
            running = {(f.reproduction, f.fold): f.provenance for f in folds
                       if f.status == "running"}  # fmt: skip
            out[name] = {
                "done": sum(st in ("complete", "failed", "pruned") for st in states),
                "running": sum(st == "running" for st in states),
                "test_done": len(done),
                "test_running": running,
            }
        return out


# --- a campaign whose worker was killed mid-test-fold ------------------------------------------


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """``mlrc campaign run`` in a child process, SIGKILLed once a test fold runs."""
    tmp = tmp_path_factory.mktemp("watch")
    path = tmp / "watch.yaml"
    path.write_text(yaml.safe_dump(doc()))
    url = f"sqlite:///{tmp / 'db.sqlite'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "mlrc.cli", "campaign", "run", str(path), "--storage", url,
           "--artifacts", str(tmp / "art"), "--quiet", "--threads", "1"]  # fmt: skip
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if (tmp / "db.sqlite").exists() and _test_fold_running(url):
                child.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if child.poll() is None:
            child.kill()
        _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err.decode()[-2000:]
    return path, url, child.pid


def _test_fold_running(url: str) -> bool:
    try:
        with session(store.connect(url, read_only=True)) as s:
            q = select(FoldRun.id).filter_by(kind="test", status="running").limit(1)
            return s.execute(q).first() is not None
    except Exception:  # noqa: BLE001 — the store may not hold its tables yet
        return False


@pytest.mark.slow
def test_status_counts_and_the_killed_workers_fold(killed):
    _, url, pid = killed
    rows, got = naive(url), status_json(url)
    worker = f"{socket.gethostname()}:{pid}"
    for name in NAMES:
        n, s = rows[name], got[name]
        assert s["trials"] == {"total": 1, "done": n["done"], "running": n["running"],
                               "left": 1 - n["done"] - n["running"]}  # fmt: skip
        total = REPS * FOLDS
        running = len(n["test_running"])
        assert s["test_folds"] == {"total": total, "done": n["test_done"], "running": running,
                                   "left": total - n["test_done"] - running}  # fmt: skip
        want = [f"rep {r} fold {k}" for r, k in sorted(n["test_running"])]
        assert [h["what"] for h in s["running"]] == want
        assert all(h["worker"] == worker and h["seen"] for h in s["running"])
        assert all(p == {"worker": worker} for p in n["test_running"].values())
    first, second = got[NAMES[0]], got[NAMES[1]]
    assert first["trials"]["done"] == 1 and first["test_folds"]["running"] == 1  # killed there
    assert second["trials"]["left"] == 1 and second["test_folds"]["left"] == REPS * FOLDS
    assert got[""]["total"]["workers"] == {
        worker: [f"{NAMES[0]} {want}" for want in [first["running"][0]["what"]]]
    }
    assert got[""]["total"]["test_folds"]["done"] == first["test_folds"]["done"]
    assert first["spent"]["fold_trainings"] >= FOLDS  # the search's folds ended
    out = cli("campaign", "status", "watch", "--storage", url).output
    held = first["running"][0]["what"]
    assert f"running: {NAMES[0]} {held} on {worker} (seen " in out
    assert "work (done / running / left of all)" in out
    assert "planned vs spent" in out and "2 studies:" in out  # what status showed before


@pytest.mark.slow
def test_the_killed_fold_resumes_and_status_says_done(killed, tmp_path):
    path, url, _ = killed
    copy = tmp_path / "db.sqlite"
    copy.write_bytes(Path(url.removeprefix("sqlite:///")).read_bytes())
    url2 = f"sqlite:///{copy}"
    cli("campaign", "run", path, "--storage", url2, "--artifacts", tmp_path / "art", "--quiet")
    got = status_json(url2)
    for name in NAMES:
        assert got[name]["trials"] == {"total": 1, "done": 1, "running": 0, "left": 0}
        assert got[name]["test_folds"] == {"total": 4, "done": 4, "running": 0, "left": 0}
        assert got[name]["running"] == [] and got[name]["state"] == "done"
    assert got[""]["total"]["workers"] == {}


# --- a running trial as a worker leaves it ----------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request, tmp_path) -> str:
    """A new SQLite file, or a new database on a real throwaway PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return request.getfixturevalue("fresh_database")


def test_a_running_trial_names_its_worker_and_heartbeat(any_store):
    """Trial 0 complete, trial 1 running on ``node7:4242`` (Optuna's attribute, a heartbeat),
    its fold 0 running; a test fold of another study running with no worker recorded."""
    url = any_store
    engine = store.connect(url)
    cfg = parse_campaign(doc(trials=3))
    register(engine, cfg, resolve_campaign(cfg))
    ids = {s.name: s.id for s in store.studies.studies(engine)}
    storage = store.optuna_storage(url, heartbeat_interval=60)
    ostudy = optuna.create_study(study_name=NAMES[0], storage=storage)
    ostudy.tell(ostudy.ask(), 0.5)
    trials.start_trial(engine, ids[NAMES[0]], 0, {}, "h0")
    trials.finish_trial(engine, ids[NAMES[0]], 0, "complete", 0.5, 0.0, None)
    t = ostudy.ask()
    t.set_user_attr("worker", "node7:4242")
    storage.record_heartbeat(t._trial_id)
    trials.start_trial(engine, ids[NAMES[0]], 1, {}, "h1")
    key = {"study_id": ids[NAMES[0]], "kind": "search", "params_hash": "h1", "reproduction": 0}
    trials.start_fold(engine, key | {"fold": 0}, "f", trial_number=1, seed=0,
                      provenance={"worker": "node7:4242"})  # fmt: skip
    test = {"study_id": ids[NAMES[1]], "kind": "test", "params_hash": "h", "reproduction": 2}
    trials.start_fold(engine, test | {"fold": 1}, "f", trial_number=None, seed=0)
    got = status_json(url)
    first, second = got[NAMES[0]], got[NAMES[1]]
    assert first["trials"] == {"total": 3, "done": 1, "running": 1, "left": 1}
    assert first["test_folds"] == {"total": 4, "done": 0, "running": 0, "left": 4}
    (held,) = first["running"]
    with engine.connect() as c:
        (beat,) = c.execute(text("SELECT heartbeat FROM trial_heartbeats")).one()
    assert held["what"] == "trial 1" and held["worker"] == "node7:4242"
    assert held["seen"] == str(beat).replace("T", " ")[:19]  # SQLite: text, PostgreSQL: datetime
    assert second["test_folds"] == {"total": 4, "done": 0, "running": 1, "left": 3}
    assert [(h["what"], h["worker"]) for h in second["running"]] == [("rep 2 fold 1", None)]
    out = cli("campaign", "status", "watch", "--storage", url).output
    assert f"running: {NAMES[0]} trial 1 on node7:4242 (seen {held['seen']} UTC)" in out
    assert f"running: {NAMES[1]} rep 2 fold 1 on a worker not recorded (seen " in out
    assert "1 / 1 / 1 of 3" in out and "0 / 1 / 3 of 4" in out
    assert "in all: trials 1 / 1 / 4 of 6, test folds 0 / 1 / 7 of 8" in out


# --- plan --workers ---------------------------------------------------------------------------


def simulate(plan, workers: int) -> float:
    """Greedy list scheduling of the units left, in hours: N workers, each taking the next
    unit as it frees up (a study's trials first; its test folds once its last trial ended)."""
    free = [0.0] * workers
    heapq.heapify(free)
    end = 0.0
    for p in plan.studies:
        per = p.seconds_per_epoch.value / 3600
        trial = p.trial_folds * p.epochs_per_fold["search"].value * per
        fold = p.epochs_per_fold["test"].value * per
        searched = 0.0
        for _ in range(p.search_left // p.trial_folds):
            start = heapq.heappop(free)
            heapq.heappush(free, start + trial)
            searched = max(searched, start + trial)
        for _ in range(p.test_left):
            start = max(heapq.heappop(free), searched)
            heapq.heappush(free, start + fold)
            end = max(end, start + fold)
        end = max(end, searched)
    return end


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 3, 1000])
def test_plan_wall_clock_on_n_workers(killed, workers):
    path, url, _ = killed
    cfg = parse_campaign(doc())
    grid = [(c.row, r) for c, r in resolve_campaign(cfg)]
    plan = plan_campaign(store.connect(url, read_only=True), "watch", grid, "cpu", None, workers)
    total = sum(p.hours() for p in plan.studies)
    chains = [p.chain_hours() for p in plan.studies]
    per = [p.seconds_per_epoch.value / 3600 for p in plan.studies]
    for p, c, s in zip(plan.studies, chains, per, strict=True):  # a trial then a test fold
        trial = FOLDS * p.epochs_per_fold["search"].value if p.search_left else 0
        assert c == pytest.approx((trial + p.epochs_per_fold["test"].value) * s)
    w = plan.wall
    assert w.total_hours == pytest.approx(total) and w.chain_hours == pytest.approx(max(chains))
    assert w.hours == pytest.approx(max(total / workers, max(chains)))
    assert simulate(plan, workers) >= w.hours * (1 - 1e-9)  # a lower bound of any schedule
    if workers == 1:
        assert w.hours == pytest.approx(total) and simulate(plan, 1) == pytest.approx(total)
    if workers == 1000:  # every unit its own worker: the chain is the wall-clock
        assert w.bound == "longest chain" and simulate(plan, 1000) == pytest.approx(w.hours)
    js = json.loads(cli("campaign", "plan", path, "--storage", url, "--workers", workers,
                        "--json").output)  # fmt: skip
    assert js["total"]["wall_clock_hours"] == pytest.approx(w.hours)
    assert js["wall"]["workers"] == workers and js["wall"]["bound"] == w.bound
    out = cli("campaign", "plan", path, "--storage", url, "--workers", workers).output
    assert f"on {workers} workers:" in out and "wall-clock" in out


@pytest.mark.parametrize("bad", ["0", "-1", "-8"])
def test_bad_workers_is_one_line(tmp_path, bad):
    path = tmp_path / "watch.yaml"
    path.write_text(yaml.safe_dump(doc()))
    r = cli("campaign", "plan", path, "--workers", bad, code=2)
    assert r.output.strip() == f"error: --workers {bad}: the number of workers must be at least 1"


def test_plan_without_workers_has_no_wall_clock(tmp_path):
    path = tmp_path / "watch.yaml"
    path.write_text(yaml.safe_dump(doc()))
    js = json.loads(cli("campaign", "plan", path, "--storage",
                        f"sqlite:///{tmp_path / 'x.db'}", "--json").output)  # fmt: skip
    assert js["wall"] is None and js["total"]["wall_clock_hours"] is None
