"""Failures at run time, as a user sees them: a loss that explodes, a disk that fills while a
checkpoint is written, Ctrl-C and SIGTERM to a running ``mlrc study run``, a second run of the
same SQLite study.

The runs are real processes: the ``mlrc`` command (``mlrc.cli.app``, standalone mode: the exit
code and stderr a shell sees) in a child forked from this pre-imported test process, which spares
the 5-10 s Python + torch start-up of each run. The children run torch on one thread (as
DataLoader workers do after a fork), so every run computes the same numbers bit for bit, and the
uninterrupted reference runs the same way.
"""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml

import mlrc.search  # noqa: F401 — imported once here, not in every child
from mlrc.cli import app
from mlrc.data import build as build_dataset
from mlrc.methods import losses

TINY = {  # and 16-px crops of 24-px glyphs: the runs here test what happens, not how well
    "iterations_per_epoch": 2,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "patience": {"default": 1},
    "image": {"resize": 18, "crop": 16},
}
GLYPHS = {"size": 24}
INTERRUPTED = "run the same command to resume"


# --- helpers -----------------------------------------------------------------------------------


def write_study(tmp: Path, name: str, *, trials=2, loss=None, enqueue=None, over=None) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs", "params": GLYPHS},
        "preset": "cpu",
        "loss": loss or {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0, "enqueue": enqueue or []},
        "test": {"reproductions": 2},
        "overrides": {**TINY, **(over or {})},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Child:
    """``mlrc ARGS`` in a forked child (several commands: one after the other while they
    succeed, as ``&&``); stdout and stderr go to files beside ``log``. ``hook`` runs in the child
    first (the crash tests plant a SIGKILL at an exact point with it). ``blocked`` and
    ``ignored``: signals the child starts with blocked or ignored, as a launcher may leave them
    (a signal mask and SIG_IGN survive fork and exec). Its ``/proc`` signal lines, read as each
    signal is sent, are part of :meth:`output`."""

    def __init__(
        self,
        commands: list[list],
        log: Path,
        fsize: int | None = None,
        hook: Callable[[], None] | None = None,
        blocked: frozenset[int] = frozenset(),
        ignored: frozenset[int] = frozenset(),
    ) -> None:
        self.out, self.err = log.with_suffix(".out"), log.with_suffix(".err")
        # here, not in the child: a child killed before it opened them still has both files
        self.out.touch()
        self.err.touch()
        build_dataset("glyphs", **GLYPHS)  # rendered once here, inherited by every child
        self.started = time.monotonic()
        self.states: list[str] = []
        self.pid = os.fork()
        if self.pid == 0:
            _child_main(commands, self.out, self.err, fsize, hook, (blocked, ignored))
        self.code: int | None = None

    def alive(self) -> bool:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code is None

    def wait(self, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                self.note_state(f"after {timeout} s")
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                pytest.fail(f"mlrc did not exit within {timeout} s:\n{self.output()}")
            time.sleep(0.02)
        return self.code

    def signal(self, sig: int) -> None:
        self.note_state(f"before {signal.Signals(sig).name}")
        os.kill(self.pid, sig)

    def note_state(self, when: str) -> None:
        """Keep the child's ``/proc`` state and signal lines (masks in hex: bit n-1 is signal
        n, SIGTERM 0x4000), for the output of a failed test."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text().splitlines()
        except OSError:
            return
        lines = [ln for ln in status if ln.startswith(("State", "SigBlk", "SigIgn", "SigCgt",
                                                       "ShdPnd", "SigPnd"))]  # fmt: skip
        self.states.append(f"{when}: " + "; ".join(" ".join(ln.split()) for ln in lines))

    def stderr_lines(self) -> list[str]:
        return [ln for ln in self.err.read_text().splitlines() if ln.strip()]

    def output(self) -> str:
        states = "".join(f"/proc/{self.pid}/status {s}\n" for s in self.states)
        return self.out.read_text() + self.err.read_text() + states


def _child_main(
    commands: list[list],
    out: Path,
    err: Path,
    fsize: int | None,
    hook: Callable | None,
    inherited: tuple[frozenset[int], frozenset[int]],
) -> None:
    """The forked child: a fresh process's signal dispositions and mask (but the ``inherited``
    blocked and ignored signals), unraisable exceptions on its stderr (pytest's hook would keep
    them in this process, lost at its exit), then the commands; never returns into pytest."""
    code = 1
    try:
        sys.stdout = open(out, "w", buffering=1)  # noqa: SIM115 — the child's own stdout
        sys.stderr = open(err, "w", buffering=1)  # noqa: SIM115
        os.dup2(sys.stdout.fileno(), 1)
        os.dup2(sys.stderr.fileno(), 2)
        sys.unraisablehook = sys.__unraisablehook__  # "Exception ignored in …" on its stderr
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        blocked, ignored = inherited
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for s in ignored:
            signal.signal(s, signal.SIG_IGN)
        if fsize is not None:  # what `ulimit -f` sets; Python ignores SIGXFSZ: write() → EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        torch.set_num_threads(1)
        if hook is not None:
            hook()
        code = 0
        for args in commands:
            code = _mlrc(args)
            if code:
                break
    except BaseException:  # noqa: BLE001 — show it in the child's stderr
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _mlrc(args: list) -> int:
    try:
        app([str(a) for a in args], prog_name="mlrc")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    return 0


def sql(db: Path, query: str, *params: object) -> list[tuple]:
    """``query`` on a connection of its own, closed before any child is forked."""
    with closing(sqlite3.connect(db, timeout=30)) as c:
        try:
            return c.execute(query, params).fetchall()
        except sqlite3.OperationalError as e:  # tables not created yet
            if "no such table" in str(e):
                return []
            raise


def until(child: Child, condition: Callable[[], bool], timeout: float = 240) -> None:
    """Poll ``condition`` while the child runs; fail if it exits or time runs out first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not child.alive():
            pytest.fail(f"mlrc exited ({child.code}) before the moment awaited:\n{child.output()}")
        if time.monotonic() > deadline:
            child.signal(signal.SIGKILL)
            child.wait()
            pytest.fail("the moment awaited did not come")
        time.sleep(0.05)


def trials(db: Path) -> dict[int, tuple]:
    """mlrc's trial rows: number → (state, reason, params JSON, value)."""
    rows = sql(db, "select number, state, reason, params, value from mlrc_trial")
    return {r[0]: r[1:] for r in rows}


def optuna_trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    """Optuna's trials, read with a connection closed at once: a child forked while this
    process holds an SQLite connection to the same file would share SQLite's lock state."""
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage).get_trials()
    finally:
        storage.engine.dispose()


def leftovers(root: Path) -> list[Path]:
    """Temp files and uncommitted best models under ``root`` (none may survive a finished run)."""
    return sorted([*root.rglob(".*.tmp-*"), *root.rglob("best.pending-e*.pt")])


def integrity(db: Path) -> str:
    return sql(db, "pragma integrity_check")[0][0]


# --- a loss that explodes ----------------------------------------------------------------------


class _NaNGradient(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose step leaves NaN weights."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        return torch.full_like(g, float("nan"))


class _Unstable(torch.nn.Module):
    """mean(e²) × explode^(k−1) at the k-th training call (float32 overflows to inf once that
    passes 3.4e38); ``poison_at`` = k: the k-th step gets a NaN gradient."""

    def __init__(self, explode: float, poison_at: int) -> None:
        super().__init__()
        self.explode, self.poison_at, self.calls = explode, poison_at, 0

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = embeddings.pow(2).mean() * self.explode ** (self.calls - 1)
        return _NaNGradient.apply(loss) if self.calls == self.poison_at else loss


def _unstable(*, num_classes: int, embedding_size: int, explode: float = 1.0, poison_at: int = 0):
    """Explodes or poisons its gradient on request (runtime-failure tests)."""
    return _Unstable(explode, poison_at)


@pytest.fixture(scope="module", autouse=True)
def _unstable_loss():
    """The test loss exists only while this module runs: other tests list every registered
    loss (one study file and one search space per loss)."""
    losses.register("rt_unstable", batch="pair")(_unstable)
    yield
    losses.LOSSES.unregister("rt_unstable")


@pytest.fixture(scope="module")
def unstable_study(tmp_path_factory):
    """Three enqueued trials: an overflowing loss, a NaN gradient on the last step of epoch 1,
    a healthy one. Iterations per epoch: 3, so the overflow (iteration 3) is inside epoch 1."""
    tmp = tmp_path_factory.mktemp("unstable")
    loss = {
        "name": "rt_unstable",
        "search": {
            "explode": {"low": 1.0, "high": 1e30, "log": True},
            "poison_at": {"low": 0, "high": 3, "int": True},
        },
    }
    enqueue = [
        {"explode": 1e30, "poison_at": 0},
        {"explode": 1.0, "poison_at": 3},
        {"explode": 1.0, "poison_at": 0},
    ]
    path = write_study(
        tmp, "unstable", trials=3, loss=loss, enqueue=enqueue, over={"iterations_per_epoch": 3}
    )
    db = tmp / "db.sqlite"
    url = f"sqlite:///{db}"
    child = Child(
        [["study", "run", path, "--storage", url, "--artifacts", tmp / "a", "--quiet"]], tmp / "run"
    )
    child.wait()
    return child, db, url


def _zero_scored_trial_and_failed_fold(unstable_study, number: int, reason: str) -> None:
    """As the reference harness: a non-finite loss or embedding gives the trial the value 0
    (Optuna COMPLETE: the sampler sees it), its reason kept; the fold itself failed."""
    child, db, url = unstable_study
    assert child.code == 0, child.output()
    state, stored, *_ = trials(db)[number]
    assert (state, stored) == ("complete", f"{reason}, fold 0")
    [(value, sem)] = sql(db, "select value, sem from mlrc_trial where number = ?", number)
    assert (value, sem) == (0.0, 0.0)
    [o] = [t for t in optuna_trials(url, "unstable") if t.number == number]
    assert o.state == optuna.trial.TrialState.COMPLETE and o.value == 0.0
    assert o.user_attrs["reason"] == f"{reason}, fold 0"
    folds = sql(
        db,
        "select f.fold, f.status, f.reason from mlrc_fold_run f join mlrc_trial t on "
        "t.params_hash = f.params_hash where t.number = ?",
        number,
    )
    assert folds == [(0, "failed", reason)]  # the trial stops at its first failed fold
    assert f"trial {number} complete  0.0000  (scored 0: {reason}, fold 0)" in child.output()


def test_non_finite_loss_scores_the_trial_0_with_the_iteration(unstable_study):
    _zero_scored_trial_and_failed_fold(unstable_study, 0, "non-finite loss at iteration 3")


def test_nan_weights_score_0_at_validation_with_the_epoch(unstable_study):
    _zero_scored_trial_and_failed_fold(
        unstable_study, 1, "non-finite embeddings at validation, epoch 1"
    )


def test_the_search_goes_on_after_zero_scored_trials(unstable_study):
    child, db, url = unstable_study
    assert [t[0] for _, t in sorted(trials(db).items())] == ["complete"] * 3
    states = [t.state.name for t in optuna_trials(url, "unstable")]
    assert states == ["COMPLETE"] * 3  # scored, counted, not retried
    assert "3 complete, 0 running, 0 failed, 0 interrupted" in child.output()


# --- a disk that fills while a checkpoint is written --------------------------------------------


def test_full_disk_while_checkpointing_fails_the_trial_with_the_line(tmp_path):
    """``ulimit -f`` between the sizes of ``last.pt`` after epoch 0 (~0.5 MB: no optimiser state
    yet) and after epoch 1 (~1.4 MB): the epoch-1 checkpoint cannot be written. The run stops
    with one line naming the file, no temp file is left, and — not a signal, a lost worker or a
    lost database — the trial and its fold are failed with that line as their reason (counted,
    not retried); the next run (no limit) goes on with the next trial."""
    path = write_study(tmp_path, "full", trials=2, over={"max_epochs": 2})
    db, art = tmp_path / "db.sqlite", tmp_path / "art"
    url = f"sqlite:///{db}"
    args = ["study", "run", path, "--storage", url, "--artifacts", art, "--quiet"]
    child = Child([args], tmp_path / "full", fsize=1_000_000)
    assert child.wait() == 2, child.output()
    [(h,)] = sql(db, "select params_hash from mlrc_fold_run where fold = 0")
    [protocol] = (art / "full").glob("p-*")
    last = protocol / "search" / h / "fold0" / "last.pt"
    reason = f"disk full / file too large writing {last} (File too large)"
    assert child.stderr_lines() == [f"error: {reason}"]
    assert leftovers(art) == []
    assert trials(db)[0][:2] == ("failed", reason)
    assert sql(db, "select fold, status, reason from mlrc_fold_run") == [(0, "failed", reason)]
    [(fold0,)] = sql(db, "select id from mlrc_fold_run where fold = 0")
    epochs = sql(db, "select epoch from mlrc_epoch_metric where fold_run_id = ? order by 1", fold0)
    # epoch 1 was validated and its checkpoint failed in the background writer; the failure is
    # raised at the next save, after epoch 2 (the last) was validated: neither was kept
    assert [e for (e,) in epochs] == [0, 1, 2]
    [first] = optuna_trials(url, "full")
    assert first.state.name == "FAIL" and first.user_attrs["reason"] == reason  # counted

    again = Child([args], tmp_path / "again")
    assert again.wait() == 0, again.output()
    assert [t[:2] for _, t in sorted(trials(db).items())] == [
        ("failed", reason),
        ("complete", None),
    ]
    assert leftovers(art) == [] and integrity(db) == "ok"


def test_a_last_pt_that_is_not_weights_only_is_refused_in_one_line(tmp_path):
    """``last.pt`` is loaded with ``weights_only=True``: one holding anything but tensors and
    plain values (here a numpy scalar, as an older or foreign file might) is not unpickled."""
    from mlrc.train.checkpoint import CheckpointError, resume_state

    last = tmp_path / "last.pt"
    torch.save({"epoch": 3, "best": {"map_at_r": np.float64(0.5)}}, last)
    with pytest.raises(CheckpointError) as e:
        resume_state(last, tmp_path / "best.pt")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"cannot resume from {last} (Weights only load failed")
    assert message.endswith("; delete it to train this fold again")


# --- Ctrl-C, SIGTERM, and a second run at once ---------------------------------------------------


def _completed(db: Path) -> list[tuple]:
    """The counted trials in order: (params, value) — numbers differ where a trial was retried."""
    rows = sql(db, "select params, value from mlrc_trial where state = 'complete' order by number")
    return rows


def _folds(db: Path) -> dict[tuple, tuple]:
    """Fold rows with their epoch histories, by (params hash, fold)."""
    rows = sql(
        db,
        "select params_hash, fold, status, best_epoch, map_at_r, precision_at_1, r_precision, id "
        "from mlrc_fold_run",
    )
    history = "select epoch, train_loss, map_at_r from mlrc_epoch_metric where fold_run_id = ?"
    return {r[:2]: (*r[2:-1], sorted(sql(db, history, r[-1]))) for r in rows}


def _training_fold(db: Path, trial: int) -> bool:
    """A fold of ``trial`` is training: its row is running and epoch 0 is stored."""
    return bool(
        sql(
            db,
            "select 1 from mlrc_fold_run f join mlrc_epoch_metric e on e.fold_run_id = f.id "
            "where f.status = 'running' and f.trial_number = ?",
            trial,
        )
    )


def _linger_after_epochs() -> None:
    """In the child: wait 0.5 s after each stored epoch, inside the fold (a 1-epoch fold of
    these tiny runs ends a few ms after its epoch is stored, too soon for a poll to see it
    training on a fast machine). Timing only: the numbers are unchanged."""
    from mlrc.store import trials as store_trials

    original = store_trials.record_epoch

    def record_epoch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        original(*args, **kwargs)
        time.sleep(0.5)

    store_trials.record_epoch = record_epoch


@pytest.fixture(scope="module")
def signalled(tmp_path_factory):
    """One study run four times: Ctrl-C while trial 0 trains, SIGTERM while its retry (trial 1)
    trains, then a run that finishes — paused (SIGSTOP) while it holds the study so that a second
    run started meanwhile meets it, and resumed (SIGCONT). Beside it, an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("signals")
    path = write_study(tmp, "sig", trials=2)
    db, art = tmp / "db.sqlite", tmp / "art"

    def args(d: Path, a: Path) -> list:
        return ["study", "run", path, "--storage", f"sqlite:///{d}", "--artifacts", a, "--quiet"]

    reference = Child([args(tmp / "ref.sqlite", tmp / "ref")], tmp / "reference")
    assert reference.wait() == 0, reference.output()
    runs = {}
    for name, sig, trial in (("sigint", signal.SIGINT, 0), ("sigterm", signal.SIGTERM, 1)):
        child = Child([args(db, art)], tmp / name, hook=_linger_after_epochs)
        until(child, lambda trial=trial: _training_fold(db, trial))
        sent = time.monotonic()
        child.signal(sig)
        code = child.wait()
        runs[name] = (
            child,
            code,
            time.monotonic() - sent,
            trials(db),
            optuna_trials(f"sqlite:///{db}", "sig"),
        )
    final = Child([args(db, art)], tmp / "final")
    lock = Path(f"{db}.sig.lock")
    until(final, lambda: lock.is_file() and lock.read_text().strip() == str(final.pid))
    final.signal(signal.SIGSTOP)
    second = Child([args(db, art)], tmp / "second")
    runs["second"] = (second, second.wait(), None, None, None)
    final.signal(signal.SIGCONT)
    runs["final"] = (final, final.wait(), None, None, None)
    return runs, db, tmp / "ref.sqlite", art


@pytest.mark.parametrize(
    ("run", "name", "code", "trial"), [("sigint", "SIGINT", 130, 0), ("sigterm", "SIGTERM", 143, 1)]
)
def test_signal_stops_the_run_and_records_the_trial_as_interrupted(
    signalled, run, name, code, trial
):
    runs, _, _, _ = signalled
    child, exit_code, delay, rows, otrials = runs[run]
    assert exit_code == code, child.output()
    assert child.stderr_lines() == [
        f"interrupted ({name}): trial {trial} marked interrupted; {INTERRUPTED}"
    ]
    assert delay < 30  # promptly: the trial is recorded, nothing else is waited for
    assert rows[trial][:2] == ("interrupted", "interrupted")
    assert not [t for t in rows.values() if t[0] == "running"]
    by_number = {t.number: t for t in otrials}
    assert by_number[trial].state.name == "FAIL"
    assert by_number[trial].user_attrs["reason"] == "interrupted"  # retried, not counted
    [retry] = [t for t in otrials if t.user_attrs.get("retry_of") == trial]
    assert retry.state.name == "WAITING"
    assert retry.system_attrs["fixed_params"] == by_number[trial].params
    assert not [t for t in otrials if t.state.name == "RUNNING"]


def test_second_run_of_the_same_sqlite_study_is_refused_naming_the_pid(signalled):
    runs, db, _, _ = signalled
    second, code, *_ = runs["second"]
    final = runs["final"][0]
    assert code == 2, second.output()
    assert second.stderr_lines() == [
        f"error: study 'sig' is already running on {db} (pid {final.pid}); SQLite allows one "
        "process per study — use a PostgreSQL URL for parallel workers"
    ]


def test_interrupted_study_resumes_to_the_uninterrupted_result(signalled):
    runs, db, ref, art = signalled
    final, code, *_ = runs["final"]
    assert code == 0, final.output()
    assert [t[0] for _, t in sorted(trials(db).items())] == [
        "interrupted",
        "interrupted",
        "complete",
        "complete",
    ]
    assert _completed(db) == _completed(ref)  # same parameters, same values, bit for bit
    assert _folds(db) == _folds(ref) and len(_folds(db)) == 8
    assert leftovers(art) == [] and integrity(db) == "ok"


@pytest.mark.parametrize("how", ["blocked", "ignored"])
def test_sigterm_blocked_or_ignored_at_start_still_stops_the_run_which_resumes(tmp_path, how):
    """A launcher may start mlrc with SIGTERM blocked or ignored (a mask and SIG_IGN survive
    fork and exec): the run unblocks and handles it all the same (an ignored one with a
    warning), stops promptly with the trial interrupted, and the same command resumes it."""
    path = write_study(tmp_path, "held", trials=1)
    db = tmp_path / "db.sqlite"
    args = ["study", "run", path, "--storage", f"sqlite:///{db}", "--artifacts", tmp_path / "a"]
    inherited = {how: frozenset({signal.SIGTERM})}
    child = Child([[*args, "--quiet"]], tmp_path / "run", hook=_linger_after_epochs, **inherited)
    until(child, lambda: _training_fold(db, 0))
    sent = time.monotonic()
    child.signal(signal.SIGTERM)
    code, delay = child.wait(timeout=60), time.monotonic() - sent
    assert code == 143, child.output()
    warned = (
        "warning: SIGTERM was ignored when mlrc started (inherited); mlrc stops on it all the same"
    )
    assert child.stderr_lines() == [
        *([warned] if how == "ignored" else []),
        f"interrupted (SIGTERM): trial 0 marked interrupted; {INTERRUPTED}",
    ], child.output()
    assert delay < 30, child.output()  # the figure is bench/signals.py's; this is a sanity bound
    assert trials(db)[0][:2] == ("interrupted", "interrupted")
    again = Child([[*args, "--quiet"]], tmp_path / "again", **inherited)
    assert again.wait() == 0, again.output()
    assert [t[0] for _, t in sorted(trials(db).items())] == ["interrupted", "complete"]
