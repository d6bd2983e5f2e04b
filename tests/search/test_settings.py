"""A study's settings — budgets, retention, torch threads per fold — set on the command line stay
the study's (a plain rerun keeps them), a new study's history starts at its own settings, and a
fold computes the same numbers alone and beside other mlrc processes: through the ``mlrc``
command on the embedded default dataset, checked against the files on disk and the store's rows."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.store.engine import session
from mlrc.store.schema import EpochMetric, FoldRun, Study, StudyHistory
from mlrc.train import threads

runner = CliRunner()
TINY = {  # 16-px crops: a quarter of the 32-px compute
    "iterations_per_epoch": 2,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "image": {"resize": 20, "crop": 16},
    "eval_batch_size": 256,
}


def study_file(tmp: Path, name: str = "s", trials: int = 2, **extra) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": TINY,
        **extra,
    }
    path = tmp / f"{name}-{trials}-{len(extra)}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def run(path: Path, url: str, art: Path, *more: object, code: int = 0):
    return cli("study", "run", path, "--storage", url, "--artifacts", art, "--quiet", *more,
               code=code)  # fmt: skip


def rows(url: str, model, **where) -> list:
    with session(store.connect(url)) as s:
        return list(s.execute(select(model).filter_by(**where)).scalars())


def history(url: str) -> list[tuple]:
    return [(h.field, h.old, h.new) for h in rows(url, StudyHistory)]


def files(root: Path) -> list[Path]:
    """The checkpoint files under ``root`` (not the stored test embeddings, which every policy
    keeps: tests/search/test_rescore.py)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.parent.name != "embeddings")


def test_keep_all_then_a_plain_rerun_keeps_everything(tmp_path):
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    path = study_file(tmp_path)
    run(path, url, art, "--keep", "all", "--trials", "1")
    kept = files(art)
    assert len(kept) == 8  # best.pt and last.pt of 4 folds
    run(path, url, art)  # as the interrupt message suggests: the same command, no flags
    assert files(art) == kept and history(url) == []
    run(path, url, art, "--trials", "2")  # one more trial, still under keep all
    assert set(kept) < set(files(art)) and len(files(art)) == 16
    status = cli("study", "status", "s", "--storage", url).output
    assert "budget: 2 trials, 2 reproductions; checkpoints kept: all" in status
    assert history(url) == [("search.trials", "1", "2")]


def test_a_file_that_lowers_retention_is_refused_and_the_flag_deletes(tmp_path):
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    run(study_file(tmp_path, trials=1, artifacts={"keep": "best"}), url, art, "--keep", "all")
    kept = files(art)
    size = sum(p.stat().st_size for p in kept)
    lowered = study_file(tmp_path, trials=1, artifacts={"keep": "resume"}, overrides=TINY)
    r = run(lowered, url, art, code=2)
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: study 's': the study file ")
    assert "lowers artifacts.keep all → resume, which would delete 8 kept checkpoint files " in (
        line
    )
    assert f"({size / 1e6:.1f} MB)" in line and "--keep resume" in line
    assert files(art) == kept and history(url) == []  # nothing deleted, nothing recorded
    run(lowered, url, art, "--keep", "resume", "--trials", "2")  # said on the command line
    assert files(art) == []  # every finished fold's files went
    assert history(url) == [("search.trials", "1", "2"), ("artifacts.keep", "all", "resume")]


def test_trials_then_a_plain_rerun_keeps_the_budget(tmp_path):
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    path = study_file(tmp_path, trials=1)
    run(path, url, art, "--trials", "2")
    assert history(url) == []  # a new study: its history starts at its own settings
    run(path, url, art)
    status = cli("study", "status", "s", "--storage", url).output
    assert "2 complete" in status and "budget: 2 trials" in status
    assert history(url) == []
    edited = study_file(tmp_path, trials=3)  # a file edit is deliberate: recorded
    run(edited, url, art)
    assert history(url) == [("search.trials", "2", "3")]
    assert len({f.params_hash for f in rows(url, FoldRun)}) == 3


def test_a_new_study_history_starts_at_its_own_settings(tmp_path):
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    run(study_file(tmp_path, trials=1, artifacts={"keep": "all"}), url, art, "--threads", "1")
    assert history(url) == []
    [st] = rows(url, Study)
    assert st.settings["artifacts.keep"] == "all" and st.settings["threads"] == 1
    status = cli("study", "status", "s", "--storage", url).output
    assert "checkpoints kept: all; threads per fold: 1" in status


def test_threads_are_the_study_s_and_a_change_is_recorded(tmp_path):
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    path = study_file(tmp_path, trials=1)
    run(path, url, art, "--threads", "1")
    run(path, url, art, "--trials", "2")  # no --threads: the study's 1
    run(path, url, art, "--trials", "3", "--threads", "2")
    assert history(url) == [
        ("search.trials", "1", "2"),
        ("search.trials", "2", "3"),
        ("threads", "1", "2"),
    ]
    by_trial = {}
    for f in rows(url, FoldRun):
        by_trial.setdefault(f.trial_number, set()).add(f.threads)
    assert by_trial == {0: {1}, 1: {1}, 2: {2}}
    status = cli("study", "status", "s", "--storage", url).output
    assert "threads per fold: 2" in status and "threads 1 → 2" in status
    cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet")
    assert {f.threads for f in rows(url, FoldRun, kind="test")} == {2}
    report = cli("report", "--storage", url).output
    assert "contrastive (glyphs): its folds ran with different torch thread counts (1, 2)" in (
        report
    )


HOLDER = """
import sys, time
from pathlib import Path
from mlrc.train import threads
threads.configure(None, Path(sys.argv[1]))
if sys.argv[2] == "fold":
    with threads.fold_slot(int(sys.argv[3])):
        print("ready", flush=True)
        time.sleep(120)
print("ready", flush=True)
time.sleep(120)
"""


def _helpers(d: Path, n: int, *how: str) -> list[subprocess.Popen]:
    """n live mlrc processes registered in ``d`` (idle, or holding a fold slot)."""
    args = list(how) or ["idle"]
    cmd = [sys.executable, "-c", HOLDER, str(d), *args]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return ps


def _stop(ps: list[subprocess.Popen]) -> None:
    for p in ps:
        p.kill()
        p.wait()


def epochs(url: str) -> list[tuple]:
    with session(store.connect(url)) as s:
        q = select(FoldRun.fold, EpochMetric.epoch, EpochMetric.train_loss, EpochMetric.map_at_r,
                   EpochMetric.precision_at_1, EpochMetric.r_precision).join(
            EpochMetric, EpochMetric.fold_run_id == FoldRun.id)  # fmt: skip
        return sorted(s.execute(q).all())


def test_a_fold_computes_the_same_alone_and_beside_other_mlrc_processes(tmp_path, monkeypatch):
    # torch's default here (the suite runs on one thread per process): every visible core
    monkeypatch.setattr(threads, "initial_threads", threads.visible_cores)
    path = study_file(tmp_path, trials=1)
    alone = f"sqlite:///{tmp_path / 'alone.sqlite'}"
    run(path, alone, tmp_path / "a")
    [study_alone] = rows(alone, Study)
    beside = f"sqlite:///{tmp_path / 'beside.sqlite'}"
    d = threads.lock_dir()
    helpers = _helpers(d, 2)  # two more mlrc processes on this host, the study created beside
    try:
        assert threads.count_workers(d) >= 2
        fair_now = threads.share(threads.count_workers(d) + 1, threads.visible_cores())
        run(path, beside, tmp_path / "b")
    finally:
        _stop(helpers)
    n = study_alone.settings["threads"]
    assert {f.threads for f in rows(alone, FoldRun)} == {f.threads for f in rows(beside, FoldRun)}
    assert {f.threads for f in rows(beside, FoldRun)} == {n}
    if threads.visible_cores() > 1 and n > 1:  # the share under load would have differed
        assert fair_now < n
    assert epochs(alone) == epochs(beside) and len(epochs(alone)) == 4 * 2  # bit for bit


def test_a_fold_waits_for_a_slot_only_while_its_holder_lives(tmp_path, caplog):
    d = tmp_path / "workers"
    cores = threads.visible_cores()
    [holder] = _helpers(d, 1, "fold", str(cores))  # takes every core
    threads.configure(None, d)
    entered: list[float] = []

    def fold() -> None:
        with threads.fold_slot(1):
            entered.append(time.monotonic())

    with caplog.at_level(logging.WARNING, logger="mlrc"):
        t = threading.Thread(target=fold)
        t.start()
        time.sleep(1.5)
        assert entered == []  # waiting: the host's cores are taken
        killed = time.monotonic()
        _stop([holder])  # a dead holder's slot is free
        t.join(timeout=30)
    assert entered and entered[0] >= killed
    waits = [r.getMessage() for r in caplog.records if "waiting for a free slot" in r.getMessage()]
    assert len(waits) == 1 and f"{cores} of {cores} cores busy" in waits[0]
    assert not list(d.glob("*.slot"))  # nothing left behind


def test_a_fold_behind_another_waiter_says_so(tmp_path, caplog):
    """#37: "waiting for a free slot (0 of 2 cores busy …)" while it waited behind another
    waiting process; the line now names the processes that wait first."""
    d = tmp_path / "workers"
    cores = threads.visible_cores()
    [holder] = _helpers(d, 1, "fold", str(cores))  # takes every core
    cmd = [sys.executable, "-c", HOLDER, str(d), "fold", "1"]
    waiter = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # waits for the holder
    threads.configure(None, d)
    leave = threading.Event()

    def fold() -> None:
        with threads.fold_slot(1):
            leave.wait(30)

    try:
        deadline = time.monotonic() + 30
        while not list(d.glob("*.wait-*.slot")) and time.monotonic() < deadline:
            time.sleep(0.1)
        with caplog.at_level(logging.WARNING, logger="mlrc"):
            t = threading.Thread(target=fold)
            t.start()
            time.sleep(1.0)
    finally:
        _stop([holder, waiter])
        leave.set()
    t.join(timeout=30)
    threads.reset()
    waits = [r.getMessage() for r in caplog.records if "cpu share: waiting" in r.getMessage()]
    assert (
        waits[:1] == [threads.waiting_line(cores, cores, 1, 1)]
        and "waiting behind 1 other mlrc process that started waiting first" in waits[0]
    )
    assert threads.waiting_line(0, 2, 2, 1).startswith(
        "cpu share: waiting behind 1 other mlrc process that started waiting first (0 of 2 "
    )


def test_a_single_process_never_waits(tmp_path):
    threads.configure(None, tmp_path / "workers")
    start = time.monotonic()
    with threads.fold_slot(threads.visible_cores() + 8):  # more than the host has: still runs
        pass
    assert time.monotonic() - start < threads.POLL_S
    assert os.listdir(tmp_path / "workers")  # registered


WAITER = """
import signal, sys
from pathlib import Path
# Ctrl-C as a shell delivers it, whatever the test runner's process left ignored or blocked
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
from mlrc.train import threads
threads.configure(None, Path(sys.argv[1]))
with threads.fold_slot(1):
    print("ran", flush=True)
"""


def test_a_process_stopped_while_it_waits_leaves_no_wait_behind(tmp_path):
    import signal

    d = tmp_path / "workers"
    [holder] = _helpers(d, 1, "fold", str(threads.visible_cores()))
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(d)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(d.glob("*.wait-*.slot")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(d.glob("*.wait-*.slot")), "the waiter never waited"
        waiter.send_signal(signal.SIGINT)  # Ctrl-C while it waits
        try:
            out, err = waiter.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # say what the waiter was doing, for the next reader
            status = Path(f"/proc/{waiter.pid}/status").read_text().splitlines()
            state = [line for line in status if line.startswith(("State", "Sig", "Threads"))]
            raise AssertionError(f"the waiter ignored Ctrl-C for 30 s: {state}") from None
        assert "ran" not in out and "waiting for a free slot" in err
        assert not list(d.glob("*.wait-*.slot"))  # its wait ended with it
    finally:
        _stop([holder, waiter])
