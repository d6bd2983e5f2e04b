"""Fair CPU shares (mlrc.train.threads): visible cores, host-local worker discovery through a
lock directory, the share, and the --threads option of the commands that train."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mlrc.cli import app
from mlrc.store.engine import session
from mlrc.train import threads

runner = CliRunner()

HOLDER = """
import sys, time
from pathlib import Path
from mlrc.train.threads import register_worker
register_worker(Path(sys.argv[1]))
print("ready", flush=True)
time.sleep(60)
"""


def _affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_visible_cores_without_cgroup_files_is_the_affinity(tmp_path):
    assert threads.visible_cores(tmp_path) == _affinity()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max 100000", None), ("100000 100000", 1), ("150000 100000", 2), ("50000 100000", 1)],
)
def test_cgroup_v2_quota_rounds_up(tmp_path, text, expected):
    (tmp_path / "cpu.max").write_text(text + "\n")
    assert threads.cgroup_cores(tmp_path) == expected
    assert threads.visible_cores(tmp_path) == min(_affinity(), expected or _affinity())


def test_cgroup_v1_quota(tmp_path):
    d = tmp_path / "cpu,cpuacct"
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("100000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cores(tmp_path) == 1
    assert threads.visible_cores(tmp_path) == 1
    (d / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert threads.cgroup_cores(tmp_path) is None


@pytest.mark.parametrize(
    ("workers", "cores", "expected"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (0, 8, 8), (3, 8, 2)]
)
def test_share_is_the_floor_and_at_least_one(workers, cores, expected):
    assert threads.share(workers, cores) == expected


def _holders(lock_dir: Path, n: int = 1) -> list[subprocess.Popen]:
    """n processes that registered themselves in lock_dir (started at once, ready on return)."""
    cmd = [sys.executable, "-c", HOLDER, str(lock_dir)]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return ps


def test_count_workers_sees_live_processes_and_forgets_killed_ones(tmp_path):
    d = tmp_path / "workers"
    assert threads.count_workers(d) == 0
    holders = _holders(d, 3)
    try:
        assert threads.count_workers(d) == 3
        holders[0].send_signal(signal.SIGKILL)
        holders[0].wait()
        assert threads.count_workers(d) == 2
        assert len(list(d.glob("*.lock"))) == 2  # the dead one's file is removed
        threads.register_worker(d)  # this process too
        assert threads.count_workers(d) == 3
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert threads.count_workers(d) == 1


def test_a_fold_slot_waits_for_nothing_unless_configured(tmp_path):
    with threads.fold_slot(99):  # a library call: no slots, no lock directory
        pass
    assert not (tmp_path / "workers").exists()


def test_the_fair_share_counts_other_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "visible_cores", lambda *_: 4)
    monkeypatch.setattr(threads, "initial_threads", lambda: 4)
    d = tmp_path / "workers"
    threads.configure(None, d)
    assert threads.fair_threads() == 4
    (h,) = _holders(d)
    try:  # a second worker appeared: a study created now takes half
        assert threads.fair_threads() == 2
        assert threads.study_threads() == 4  # a study created now: not divided (they take turns)
        assert "4 threads of 4 cores (2 mlrc workers on this host, taking turns)" in (
            threads.share_line()
        )
    finally:
        h.kill()
        h.wait()
    assert threads.fair_threads() == 4  # it left


def test_threads_option_fixes_the_number(tmp_path):
    threads.configure(1, tmp_path / "workers")
    assert threads.requested_threads() == 1
    assert threads.apply_threads(1) == 1 and torch.get_num_threads() == 1
    assert (
        threads.share_line()
        == f"cpu share: 1 thread of {threads.visible_cores()} cores (--threads)"
    )


@pytest.mark.parametrize("value", ["0", "abc"])
@pytest.mark.parametrize("command", [["worker", "s.yaml"], ["demo"], ["study", "run", "s.yaml"]])
def test_bad_threads_are_refused(command, value):
    r = runner.invoke(app, [*command, "--threads", value])
    assert r.exit_code == 2 and "Invalid value for '--threads'" in r.output


def test_the_commands_take_threads_and_register(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    r = runner.invoke(
        app, ["study", "test", str(tmp_path / "missing.yaml"), "--threads", "1"], env={}
    )
    assert "cpu share" not in r.output  # logged at debug level: one-line errors stay one line
    assert r.output.strip().startswith("error:") and len(r.output.strip().splitlines()) == 1
    assert threads.requested_threads() == 1
    assert len(list((tmp_path / "cache" / "workers").glob("*.lock"))) == 1


def test_an_unwritable_lock_directory_still_shares(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    threads.configure(None, blocker / "workers")  # cannot be created: warned, not fatal
    assert threads.fair_threads() == min(threads.visible_cores(), threads.initial_threads())
    with threads.fold_slot(1):  # no slots there either: the fold runs
        pass


def test_the_share_never_exceeds_torchs_own_default(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "visible_cores", lambda *_: 64)
    monkeypatch.setattr(threads, "initial_threads", lambda: 2)  # e.g. physical cores
    threads.configure(None, tmp_path / "workers")
    assert threads.fair_threads() == 2  # a single process: the threads it used before


def test_a_fold_run_records_its_thread_count(tmp_path, monkeypatch):
    """The thread count changes torch's sums: each fold run row keeps the one it ran with."""
    import yaml

    from mlrc import store
    from mlrc.store.schema import FoldRun

    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    doc = {
        "name": "t",
        "dataset": {"name": "glyphs"},
        "loss": {"name": "contrastive"},
        "search": {"trials": 1},
        "overrides": {"iterations_per_epoch": 1, "max_epochs": 1},
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    r = runner.invoke(
        app,
        [
            "study",
            "run",
            str(tmp_path / "t.yaml"),
            "--storage",
            url,
            "--artifacts",
            str(tmp_path / "art"),
            "--quiet",
            "--threads",
            "1",
        ],  # fmt: skip
    )
    assert r.exit_code == 0, r.output
    with session(store.connect(url)) as s:
        assert [f.threads for f in s.query(FoldRun)] == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("threads_", "loaders", "device", "expected"),
    [(2, 0, "cpu", 2), (2, 4, "cpu", 6), (8, 4, "cuda:3", 5), (8, 0, "cuda", 1), (1, 2, "mps", 3)],
)
def test_a_fold_keeps_its_loader_processes_cores_busy(threads_, loaders, device, expected):
    assert threads.fold_cores(threads_, loaders, device) == expected


GPU_FOLD = """
import sys, time
from pathlib import Path
from mlrc.train import threads
threads.configure(None, Path(sys.argv[1]))
with threads.fold_slot(threads.fold_cores(8, int(sys.argv[2]), "cuda:0"), wait=False):
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_gpu_folds_loader_processes_make_cpu_folds_wait_and_it_never_waits(tmp_path):
    import threading
    import time

    d = tmp_path / "workers"
    cores = threads.visible_cores()
    cmd = [sys.executable, "-c", GPU_FOLD, str(d), str(cores)]  # 1 + cores loader processes
    gpu = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert gpu.stdout is not None and gpu.stdout.readline().strip() == "ready"
        assert [p.name.split(".", 1)[1] for p in d.glob("*.slot")] == [f"run-{cores + 1}.slot"]
        threads.configure(None, d)
        with threads.fold_slot(threads.fold_cores(1, 2, "cuda:1"), wait=False):
            pass  # another GPU fold: at once, though every core is taken
        entered: list[float] = []

        def cpu_fold() -> None:
            with threads.fold_slot(threads.fold_cores(1, 0, "cpu")):
                entered.append(time.monotonic())

        t = threading.Thread(target=cpu_fold)
        t.start()
        time.sleep(1.0)
        assert entered == []  # the GPU fold's loader processes hold the host's cores
        ended = time.monotonic()
    finally:
        gpu.kill()
        gpu.wait()
    t.join(timeout=30)
    threads.reset()
    assert entered and entered[0] >= ended
