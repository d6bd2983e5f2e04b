"""Stop signals as data: the command line's handlers only record a signal, and mlrc raises the
stop at its own safe points — each pass of a wait, poll or backoff loop, each training step.

Each test forces the condition that used to lose a stop: a KeyboardInterrupt dropped where the
signal landed (CPython drops one raised in a weakref callback: filelock has some), a process
started with the signal blocked, a database outage whose retry backs off for minutes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError

from mlrc import store
from mlrc.cli.interrupts import interrupts
from mlrc.errors import forget_stop_signals, note_stop_signal, sleep_or_stop, stop_signal
from mlrc.train import threads

HOLDER = """
import sys, time
from pathlib import Path
from mlrc.train import threads
threads.configure(None, Path(sys.argv[1]))
with threads.fold_slot(int(sys.argv[2])):
    print("ready", flush=True)
    time.sleep(120)
"""

# Ctrl-C under mlrc's handlers, the KeyboardInterrupt a handler may raise dropped as CPython
# drops one raised in a weakref callback: only mlrc's own checks can stop the wait.
WAITER = """
import signal, sys
from pathlib import Path
import typer
from mlrc.cli.interrupts import interrupts
from mlrc.train import threads
threads.configure(None, Path(sys.argv[1]))
try:
    with interrupts():
        installed = signal.getsignal(signal.SIGINT)

        def dropped(signum, frame):
            try:
                installed(signum, frame)
            except KeyboardInterrupt:  # as CPython reports one it drops
                print("Exception ignored in:", repr(dropped), file=sys.stderr)
                print("KeyboardInterrupt", file=sys.stderr)

        signal.signal(signal.SIGINT, dropped)
        with threads.fold_slot(1):
            print("ran", flush=True)
except typer.Exit as e:
    sys.exit(e.exit_code)
"""


def _proc_signals(pid: int) -> list[str]:
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return []
    return [ln for ln in status if ln.startswith(("State", "Sig", "ShdPnd"))]


def _line_within(proc: subprocess.Popen, start: str, seconds: float) -> tuple[str, float | None]:
    """Read ``proc``'s stderr until a line starting with ``start`` (stderr read so far, when it
    came by ``time.monotonic()``), or ``seconds`` pass (then None)."""
    import selectors

    sel, text, deadline = selectors.DefaultSelector(), "", time.monotonic() + seconds
    sel.register(proc.stderr, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stderr.readline()
        if not line:
            break
        text += line
        if line.startswith(start):
            return text, time.monotonic()
    return text, None


def test_ctrl_c_during_a_slot_wait_stops_at_once(tmp_path):
    d = tmp_path / "workers"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(d), str(threads.visible_cores())],
                              stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(d)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
        deadline = time.monotonic() + 60
        while not list(d.glob("*.wait-*.slot")) and time.monotonic() < deadline:
            assert waiter.poll() is None, waiter.communicate()
            time.sleep(0.05)
        assert list(d.glob("*.wait-*.slot")), "the waiter never waited"
        state = _proc_signals(waiter.pid)
        sent = time.monotonic()
        waiter.send_signal(signal.SIGINT)
        told, took = _line_within(waiter, "interrupted (SIGINT)", 20)
        if took is None:
            state += _proc_signals(waiter.pid)
            waiter.kill()
            pytest.fail(f"the waiter ignored Ctrl-C for 20 s: {state}\n{told}")
        took -= sent  # to the stop's message: the interpreter's exit after it is not the wait
        out, err = waiter.communicate(timeout=60)
        err = told + err
        assert waiter.returncode == 130, (err, state)
        assert err.splitlines()[-1] == "interrupted (SIGINT): run the same command to resume"
        assert "ran" not in out and took < 5, (took, state)  # POLL_S passes, and the message
        assert not list(d.glob("*.wait-*.slot"))  # its wait ended with it
    finally:
        for p in (holder, waiter):
            if p is not None:
                p.kill()
                p.wait()


def test_a_stop_ends_the_database_retry_backoff_at_once(monkeypatch):
    """A lost connection is retried with backoff up to 30 s for ``MLRC_DB_RETRY_S``; a stop
    signal received meanwhile ends the wait within a slice, not at the window's end."""
    monkeypatch.setenv("MLRC_DB_RETRY_S", "5")
    engine = create_engine("sqlite://")
    calls = []

    def lost() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            note_stop_signal(signal.SIGTERM)  # as the handler does, during the outage
        raise OperationalError("SELECT 1", {}, ConnectionError("gone"), connection_invalidated=True)

    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            store.retry(lost, engine, "testing")
    finally:
        forget_stop_signals()
    assert len(calls) == 1 and time.monotonic() - start < 0.5
    assert stopped.value.signum == signal.SIGTERM


def test_sleep_or_stop_looks_for_a_stop_between_slices():
    try:
        start = time.monotonic()
        sleep_or_stop(0.25)
        assert 0.25 <= time.monotonic() - start < 1
        note_stop_signal(signal.SIGINT)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            sleep_or_stop(30)
        assert time.monotonic() - start < 0.1
    finally:
        forget_stop_signals()


def test_interrupts_unblocks_the_stop_signals_and_restores_the_callers_mask():
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with pytest.raises(typer.Exit) as ended, interrupts():
            assert not stops & signal.pthread_sigmask(signal.SIG_BLOCK, set())
            os.kill(os.getpid(), signal.SIGTERM)  # delivered now, to the recording handler
            deadline = time.monotonic() + 5
            while stop_signal() is None and time.monotonic() < deadline:
                time.sleep(0.01)  # the handler runs in this (main) thread between bytecodes
            assert stop_signal() == signal.SIGTERM  # recorded, nothing raised here
        assert ended.value.exit_code == 143
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # restored
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def test_a_stop_signal_ignored_at_start_is_handled_with_a_warning(capsys):
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with interrupts():
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # the caller's, restored
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err.splitlines() == [
        "warning: SIGTERM was ignored when mlrc started (inherited); mlrc stops on it all the same"
    ]


def test_loader_workers_leave_stop_signals_to_their_parent():
    import torch
    from torch.utils.data import Dataset

    from mlrc.train.loaders import FoldLoader

    class Dispositions(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> torch.Tensor:
            ignored = [
                signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)
            ]
            return torch.tensor(ignored)

    loader = FoldLoader(Dispositions(), batch_size=2, num_workers=1)
    [batch] = list(loader)
    assert batch.all().item()
    del loader


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.is_file() else []


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "fold-long"])
def test_a_loader_process_killed_from_outside_interrupts_and_retries_its_trial(
    tmp_path, caplog, persistent
):
    """The OOM killer (or a kill) ends a DataLoader process mid-fold: not a failure of the
    trial's parameters — interrupted and retried, as a lost rank — and the run goes on."""
    import logging
    import threading

    import optuna
    import yaml

    from mlrc import search as S
    from mlrc.config import load_study

    doc = {
        "name": "loader",
        "dataset": {"name": "glyphs", "params": {"size": 24}},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 2, "sampler": "tpe", "seed": 3},
        "overrides": {
            **{"max_epochs": 1, "iterations_per_epoch": 100, "folds": 2, "num_workers": 1},
            **{"patience": {"default": 1}, "image": {"resize": 18, "crop": 16}},
            "persistent_workers": persistent,
        },
    }
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(doc))
    killed: list[int] = []

    def kill_the_first_loader() -> None:  # a forked child of this process (not a git call)
        me = Path("/proc/self/cmdline").read_bytes()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for c in set(_children(os.getpid())) - earlier:  # not an earlier test's
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{c}/cmdline").read_bytes() == me:
                        time.sleep(0.3)  # mid-fold
                        os.kill(c, signal.SIGKILL)
                        killed.append(c)
                        return
            time.sleep(0.01)

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    earlier = set(_children(os.getpid()))
    thread = threading.Thread(target=kill_the_first_loader, daemon=True)
    with (
        S.open_study(load_study(path), url, tmp_path / "a", progress=False) as ctx,
        caplog.at_level(logging.WARNING, logger="mlrc"),
    ):
        thread.start()
        S.run_search(ctx)
    thread.join()
    assert killed
    trials = optuna.load_study(study_name="loader", storage=url).get_trials()
    [lost] = [t for t in trials if t.state.name == "FAIL"]
    reason = f"interrupted: data loader process {killed[0]} ended by SIGKILL"
    assert lost.user_attrs["reason"] == reason, caplog.text
    assert f"trial {lost.number} interrupted (data loader process {killed[0]}" in caplog.text
    [retry] = [t for t in trials if t.user_attrs.get("retry_of") == lost.number]
    assert retry.state.name == "COMPLETE" and retry.params == lost.params
    assert sum(t.state.name == "COMPLETE" for t in trials) == 2


class _Stalled:
    """A dataset whose first sample, the ``stall_at``-th time a loader process reads it, takes
    20 s (a read stuck on a network file system): torch waits for it in slices of 5 s for as
    long as the loader lives."""

    def __init__(self, stall_at: int) -> None:
        self.stall_at, self.reads = stall_at, 0

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        from torch.utils.data import get_worker_info

        if i == 0 and get_worker_info() is not None:
            self.reads += 1
            if self.reads == self.stall_at:
                time.sleep(20)
        return i


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "fold-long"])
def test_a_stop_while_a_batch_is_awaited_from_a_stalled_loader_stops_at_once(persistent):
    """SIGTERM while the main process waits for a loader's batch: the stop is raised inside
    the wait, not at the next step's check after the batch came (here 20 s later). Also the
    case of a whole-group SIGTERM that ends a loader before it ignores the signal: torch finds
    the dead loader only at its next 5-s look."""
    import threading

    from mlrc.errors import raise_if_stopped
    from mlrc.train.loaders import CheckedLoader

    earlier = set(_children(os.getpid()))
    stalled = _Stalled(stall_at=2 if persistent else 1)
    loader = CheckedLoader(stalled, batch_size=2, num_workers=1, persistent_workers=persistent)
    if persistent:
        assert len(list(loader)) == 2  # its loader process lives on into the next epoch
    sent: list[float] = []

    def terminate_soon() -> None:
        time.sleep(0.5)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_soon, daemon=True).start()
    with pytest.raises(typer.Exit) as ended, interrupts():
        for _ in loader:
            raise_if_stopped()  # a training step's check
    answered = time.monotonic() - sent[0]
    for pid in set(_children(os.getpid())) - earlier:  # the stalled loader, not left to torch
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert ended.value.exit_code == 143
    assert answered < 1.0, f"the stop was answered {answered:.1f} s after SIGTERM"
