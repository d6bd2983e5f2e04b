"""Crash consistency: a study killed with SIGKILL again and again ends exactly as if it had never
been killed.

A small study on the embedded default dataset (glyphs, tiny preset: 2 trials of a 2-D TPE
search, 4 folds, 2 epochs of 2 iterations, 2 test reproductions) runs once without interruption,
its progress sampled as it goes. Then the same study file runs in a second store as a chain of
processes, each ``mlrc study run && mlrc study test``, each killed with SIGKILL and followed by the
next until one finishes:

- first four kills at exact points that no timing would hit reliably (planted in the child:
  between the two parameter draws of a trial, between a new best model and the ``last.pt`` that
  records it, in the recovery between the retry and the FAIL, between a trial's result and its
  ``tell``), each with the invariant checked right after (a fifth, between a fold row
  forgetting its ``best.pt`` and the file's deletion, in a store of its own: it can only come at
  the end of the search, where it would leave the random kills no search stage to land in);
- then ``N_RANDOM`` kills at seeded random moments, half uniform over the uninterrupted run's
  search stage and half over its test stage: moment g of the clean run becomes "once the chain
  has made the progress the clean run had made at g, wait as long as the clean run had been
  working past that progress, then kill", so
  every kill lands further into the study and the moments cover the search and the test stage.

After every kill: the SQLite file is intact, every finished fold's checkpoint exists, the fold
being trained has a loadable ``last.pt``. At the end the two stores agree exactly: the counted
trials (parameters, values, in order; retried trials get new Optuna numbers), every fold run
(status, seed, best epoch, metrics, epoch history) and every test result, bit for bit; every
checkpoint the store names exists where its row says and holds the same weights as the clean run's;
under the study's retention (``artifacts.keep: best``) those are the only checkpoint files left;
no temp file or uncommitted best model is left; no Optuna trial is left RUNNING or WAITING.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml

from .test_runtime import GLYPHS, TINY, Child, integrity, leftovers, optuna_trials, sql

N_RANDOM = 22  # random kill moments (≥ 20 must be real kills: a run may finish before its moment)
SEED = 20260522
NAME = "crash"
TRIALS = 2
REPS = 2
# lr 3e-5: the first iterations of a higher lr always make the tiny model worse than its epoch 0
# (which may be the best epoch, as in the reference), and then no trained epoch is ever a new
# best — the planted kill between a new best model and its last.pt needs one
OVERRIDES = {**TINY, "max_epochs": 2, "optimizer": {"lr": 3e-5}}
# checkpoint retention: "best" deletes files as the study goes (every last.pt once its fold is
# stored, the best.pt of trials that are not the best) and keeps some whose weights are compared
KEEP = "best"


def write_study(tmp: Path) -> Path:
    doc = {
        "name": NAME,
        "dataset": {"name": "glyphs", "params": GLYPHS},
        "preset": "cpu",
        "loss": {"name": "contrastive"},  # space: pos_margin, neg_margin
        "search": {"trials": TRIALS, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": REPS},
        "artifacts": {"keep": KEEP},
        "overrides": OVERRIDES,
    }
    path = tmp / "crash.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def commands(path: Path, db: Path, art: Path) -> list[list]:
    opts = ["--storage", f"sqlite:///{db}", "--artifacts", art, "--quiet"]
    return [["study", "run", path, *opts], ["study", "test", path, *opts]]


# --- progress and where a kill landed ----------------------------------------------------------


def progress(db: Path) -> int:
    """Durable steps so far: epochs, finished folds, test rows, counted trials (a redone step
    rewrites its row, so the count is the same in a killed chain as in the clean run)."""
    rows = sql(
        db,
        "select (select count(*) from mlrc_epoch_metric)"
        " + (select count(*) from mlrc_fold_run where status != 'running')"
        " + (select count(*) from mlrc_test_result)"
        " + (select count(*) from mlrc_trial where state in ('complete', 'failed'))",
    )
    return rows[0][0] if rows else 0


def landed(db: Path) -> tuple[str, str]:
    """(stage, detail) of the state a kill left: the stage from the counted trials, the detail
    from the fold row being trained (and its last stored epoch)."""
    counted = sql(db, "select count(*) from mlrc_trial where state in ('complete', 'failed')")
    stage = "test" if counted and counted[0][0] >= TRIALS else "search"
    running = sql(
        db,
        "select kind, trial_number, reproduction, fold, id from mlrc_fold_run "
        "where status = 'running' order by updated desc limit 1",
    )
    if not running and stage == "search":
        return stage, "between folds"
    if not running:
        [(done,)] = sql(db, "select count(distinct reproduction) from mlrc_test_result")
        if done == REPS:
            return stage, "after the last test results (report)"
        [(folds,)] = sql(
            db,
            "select count(*) from mlrc_fold_run where kind = 'test' and status = 'complete' "
            "and reproduction = ?",
            done + 1,
        )
        what = "embeddings and metrics" if folds == 4 else f"after {folds} folds"
        return stage, f"rep {done + 1} {what}"
    kind, trial, rep, fold, fid = running[0]
    [(epoch,)] = sql(db, "select max(epoch) from mlrc_epoch_metric where fold_run_id = ?", fid)
    who = f"trial {trial}" if kind == "search" else f"rep {rep}"
    return stage, f"{who} fold {fold}, epoch {'-' if epoch is None else epoch} stored"


def check_after_kill(db: Path) -> None:
    """What must hold at any moment: an intact file, finished folds' checkpoints, a loadable
    ``last.pt`` (weights only) for the fold being trained, whose best model — when it is the
    model ``last.pt`` holds — is in ``best.pt`` or pending commit, never another epoch's."""
    assert integrity(db) == "ok"
    tested = {r for (r,) in sql(db, "select distinct reproduction from mlrc_test_result")}
    for kind, rep, ckpt in sql(
        db, "select kind, reproduction, checkpoint from mlrc_fold_run where status = 'complete'"
    ):
        if ckpt is not None or (kind == "test" and rep not in tested):  # the test stage reads it
            assert Path(ckpt).is_file(), ckpt
    for h, kind, rep, fold in sql(
        db,
        "select params_hash, kind, reproduction, fold from mlrc_fold_run where status = 'running'",
    ):
        last = fold_dir(db, kind, h, rep, fold) / "last.pt"
        if not last.is_file():
            continue
        state = torch.load(last, map_location="cpu", weights_only=True)
        if state["best_epoch"] is not None and state["best_epoch"] == state["epoch"]:
            # the best model is the model last.pt holds: in best.pt, or still pending commit
            pending = last.with_name(f"best.pending-e{state['epoch']}.pt")
            best = pending if pending.is_file() else last.with_name("best.pt")
            weights = torch.load(best, map_location="cpu", weights_only=True)
            assert all(torch.equal(weights[k], state["model"][k]) for k in weights), best
        else:
            assert state["best"] is None or last.with_name("best.pt").is_file()


def fold_dir(db: Path, kind: str, h: str, rep: int, fold: int) -> Path:
    [protocol] = (db.parent / "art" / NAME).glob("p-*")  # one protocol per store here
    root = protocol / kind / h
    return (root / f"rep{rep}" if kind == "test" else root) / f"fold{fold}"


# --- kills planted at exact points ---------------------------------------------------------------


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def between_parameter_draws() -> None:
    """Killed as the trial asks for its second parameter: the trial holds one of two."""
    original, calls = optuna.trial.Trial.suggest_float, [0]

    def suggest_float(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls[0] += 1
        if calls[0] == 2:
            _die()
        return original(self, *args, **kwargs)

    optuna.trial.Trial.suggest_float = suggest_float


def between_best_and_last() -> None:
    """Killed right after a new best model of a trained epoch (≥ 1: it replaces an earlier best,
    epoch 0 at least) is written, before ``last.pt``."""
    from mlrc.train import checkpoint

    original = checkpoint.atomic_save  # save_pending_best writes through it

    def save(obj, path: Path) -> None:  # noqa: ANN001
        original(obj, path)
        m = re.fullmatch(r"best\.pending-e(\d+)\.pt", path.name)
        if m and int(m.group(1)) >= 1:
            _die()

    checkpoint.atomic_save = save


def between_retry_and_fail() -> None:
    """Killed in the recovery of an interrupted trial: its retry enqueued, not yet FAILed."""
    storage = optuna.storages.RDBStorage
    original = storage.set_trial_user_attr

    def set_user_attr(self, trial_id, key, value):  # noqa: ANN001, ANN202
        if (key, value) == ("reason", "interrupted"):
            _die()
        return original(self, trial_id, key, value)

    storage.set_trial_user_attr = set_user_attr


def before_tell() -> None:
    """Killed after a trial's result is stored in mlrc's table, before Optuna is told."""
    from mlrc.search.backends import local

    local.tell_optuna = lambda *args, **kwargs: _die()


def between_forget_and_delete() -> None:
    """Killed as retention drops a best.pt: the fold row forgets it, the file is not deleted."""
    from mlrc.store import trials

    original = trials.forget_checkpoint

    def forget(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        original(*args, **kwargs)
        _die()

    trials.forget_checkpoint = forget


def _otrials(db: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna_trials(f"sqlite:///{db}", NAME)


def check_planted(hook: str, db: Path) -> str:
    """The invariant right after a planted kill; returns what was seen (for the log)."""
    trials = _otrials(db)
    if hook == "between_parameter_draws":
        [t] = trials
        assert t.state.name == "RUNNING" and list(t.params) == ["pos_margin"]
        return "trial 0 killed holding 1 of 2 parameters"
    if hook == "between_best_and_last":
        [pending] = list((db.parent / "art").rglob("best.pending-e*.pt"))
        state = torch.load(pending.parent / "last.pt", map_location="cpu", weights_only=True)
        best = torch.load(pending.parent / "best.pt", map_location="cpu", weights_only=True)
        new = int(re.fullmatch(r"best\.pending-e(\d+)\.pt", pending.name).group(1))
        assert state["epoch"] == new - 1 and state["best_epoch"] < new  # the new best unrecorded
        if state["best_epoch"] == state["epoch"]:  # best.pt = the model last.pt holds
            assert all(torch.equal(best[k], state["model"][k]) for k in best)
        return (
            f"{pending.name} written, last.pt at epoch {state['epoch']}, best.pt still the "
            f"epoch-{state['best_epoch']} model"
        )
    if hook == "between_retry_and_fail":
        running = [t for t in trials if t.state.name == "RUNNING"]
        assert len(running) == 1
        retries = [t for t in trials if t.user_attrs.get("retry_of") == running[0].number]
        assert [t.state.name for t in retries] == ["WAITING"]
        return f"trial {running[0].number} RUNNING with its retry enqueued"
    if hook == "before_tell":
        running = [t for t in trials if t.state.name == "RUNNING"]
        [(state,)] = sql(db, "select state from mlrc_trial where number = ?", running[0].number)
        assert state == "complete"
        counts = {}
        for t in trials:  # the recovery before was redone without a second retry
            if "retry_of" in t.user_attrs:
                counts[t.user_attrs["retry_of"]] = counts.get(t.user_attrs["retry_of"], 0) + 1
        assert set(counts.values()) == {1}
        return f"trial {running[0].number} complete in mlrc, RUNNING in Optuna"
    if hook == "between_forget_and_delete":
        stray = [
            (h, fold)
            for h, fold in sql(
                db,
                "select params_hash, fold from mlrc_fold_run "
                "where kind = 'search' and status = 'complete' and checkpoint is null",
            )
            if (fold_dir(db, "search", h, 0, fold) / "best.pt").is_file()
        ]
        assert len(stray) == 1  # forgotten by its row, still on disk (the next collect's)
        return f"best.pt of search fold {stray[0][1]} of {stray[0][0]} forgotten, not deleted"
    raise AssertionError(hook)


PLANTED = [between_parameter_draws, between_best_and_last, between_retry_and_fail, before_tell]


# --- the runs -------------------------------------------------------------------------------------


def run_clean(path: Path, tmp: Path) -> tuple[Path, list[tuple[float, int]]]:
    """The uninterrupted run, with its progress timeline [(seconds, progress)]."""
    tmp.mkdir()
    db = tmp / "db.sqlite"
    child = Child(commands(path, db, tmp / "art"), tmp / "clean")
    timeline = [(0.0, 0)]
    while child.alive():
        p = progress(db)
        if p != timeline[-1][1]:
            timeline.append((time.monotonic() - child.started, p))
        time.sleep(0.03)
    assert child.code == 0, child.output()
    if progress(db) != timeline[-1][1]:
        timeline.append((time.monotonic() - child.started, progress(db)))
    return db, timeline


def search_progress(db: Path) -> int:
    """The progress count of a finished search stage (search epochs, folds and trials)."""
    rows = sql(
        db,
        "select (select count(*) from mlrc_epoch_metric e join mlrc_fold_run f"
        " on e.fold_run_id = f.id where f.kind = 'search')"
        " + (select count(*) from mlrc_fold_run where kind = 'search' and status != 'running')"
        " + (select count(*) from mlrc_trial where state in ('complete', 'failed'))",
    )
    return rows[0][0]


def kill_moments(
    timeline: list[tuple[float, int]], search_done: int
) -> list[tuple[float, int, float]]:
    """Seeded moments g, half uniform over the clean run's search stage and half over its test
    stage (so a loaded machine that slows one stage still puts kills in both): (g, the progress
    made by g, the time the clean run had worked past that progress at g)."""
    times = [t for t, _ in timeline]
    split = next(t for t, p in timeline if p >= search_done)
    rng = np.random.default_rng(SEED)
    half = N_RANDOM // 2
    moments = np.sort(
        np.concatenate(
            [rng.uniform(0, split, half), rng.uniform(split, times[-1], N_RANDOM - half)]
        )
    )
    out = []
    for g in moments:
        i = bisect.bisect_right(times, g) - 1
        out.append((float(g), timeline[i][1], float(g - times[i])))
    return out


def kill_when(child: Child, db: Path, target: int, extra: float) -> bool:
    """SIGKILL ``child`` ``extra`` seconds after the chain's progress reaches ``target``;
    False if it finished first."""
    deadline = time.monotonic() + 300
    while progress(db) < target:
        if not child.alive():
            return False
        assert time.monotonic() < deadline, f"no progress to {target}:\n{child.output()}"
        time.sleep(0.05)
    until = time.monotonic() + extra
    while time.monotonic() < until:
        if not child.alive():
            return False
        time.sleep(min(0.02, max(until - time.monotonic(), 0)))
    child.signal(signal.SIGKILL)
    child.wait()
    return child.code == -signal.SIGKILL


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The clean store, the killed-and-resumed store, and the log of kills."""
    tmp = tmp_path_factory.mktemp("crash")
    path = write_study(tmp)
    clean_db, timeline = run_clean(path, tmp / "clean")
    db = tmp / "killed" / "db.sqlite"
    db.parent.mkdir()
    cmds = commands(path, db, db.parent / "art")
    log: list[tuple[str, ...]] = []
    for k, hook in enumerate(PLANTED):
        child = Child(cmds, tmp / f"planted{k}", hook=hook)
        assert child.wait() == -signal.SIGKILL, f"{hook.__name__} did not fire:\n{child.output()}"
        seen = check_planted(hook.__name__, db)
        check_after_kill(db)
        log.append(("planted", hook.__name__, *landed(db), seen))
    finished = searched = False
    for k, (g, target, extra) in enumerate(kill_moments(timeline, search_progress(clean_db))):
        before = progress(db)
        # once a `study run` has returned, the user goes on with `study test` alone
        child = Child(cmds[1:] if searched else cmds, tmp / f"random{k}")
        if not kill_when(child, db, target, extra):
            assert child.code == 0, child.output()
            finished = True
            log.append(("finished", f"{g:.1f} s", "", "", "the run ended before this moment"))
            break
        check_after_kill(db)
        searched = searched or "reproductions tested:" in child.out.read_text()
        age = time.monotonic() - child.started
        note = f"killed {age:.1f} s after its start, progress {before} → {progress(db)}"
        log.append(("random", f"{g:.1f} s of {timeline[-1][0]:.1f} s", *landed(db), note))
    if not finished:
        last = Child(cmds, tmp / "last")
        assert last.wait() == 0, last.output()
    for entry in log:
        print(" | ".join(entry))
    return clean_db, db, log


def test_at_least_20_random_kills_landed_in_the_search_and_in_the_test_stage(chain):
    _, _, log = chain
    random = [e for e in log if e[0] == "random"]
    stages = {s: sum(e[2] == s for e in random) for s in ("search", "test")}
    print(f"random kills: {len(random)} ({stages}); planted: {len(log) - len(random)}")
    assert len(random) >= 20 and stages["search"] >= 3 and stages["test"] >= 3


def _json(text: str | None) -> object:
    return None if text is None else json.loads(text)


def counted_trials(db: Path) -> list[tuple]:
    rows = sql(
        db,
        "select params, value, sem, state, reason from mlrc_trial "
        "where state in ('complete', 'failed') order by number",
    )
    return [(_json(p), *rest) for p, *rest in rows]


def fold_runs(db: Path) -> dict[tuple, tuple]:
    rows = sql(
        db,
        "select kind, params_hash, reproduction, fold, status, reason, seed, best_epoch, "
        "map_at_r, precision_at_1, r_precision, checkpoint, id from mlrc_fold_run",
    )
    out = {}
    for *key, status, reason, seed, best_epoch, m, p1, rp, ckpt, fid in rows:
        epochs = sql(
            db,
            "select epoch, train_loss, map_at_r, precision_at_1, r_precision "
            "from mlrc_epoch_metric where fold_run_id = ? order by epoch",
            fid,
        )
        rel = Path(ckpt).relative_to(db.parent / "art") if ckpt else None
        out[tuple(key)] = (status, reason, seed, best_epoch, m, p1, rp, str(rel), epochs)
    return out


def result_rows(db: Path) -> dict[tuple, tuple]:
    rows = sql(
        db,
        "select reproduction, mode, fold, map_at_r, precision_at_1, r_precision, params, extra "
        "from mlrc_test_result",
    )
    return {tuple(r[:3]): (*r[3:6], _json(r[6]), _json(r[7])) for r in rows}


def test_the_same_counted_trials_as_the_uninterrupted_run(chain):
    clean, killed, _ = chain
    assert len(counted_trials(clean)) == TRIALS
    assert counted_trials(killed) == counted_trials(clean)
    states = {s for (s,) in sql(killed, "select state from mlrc_trial")}
    assert states <= {"complete", "interrupted"}  # nothing left "running"
    otrials = _otrials(killed)
    assert {t.state.name for t in otrials} == {"COMPLETE", "FAIL"}  # none RUNNING or WAITING
    assert all(t.user_attrs["reason"] == "interrupted" for t in otrials if t.state.name == "FAIL")
    complete = [t.params for t in otrials if t.state.name == "COMPLETE"]
    assert len(complete) == TRIALS and len({json.dumps(p) for p in complete}) == TRIALS


def test_the_same_fold_runs_and_epoch_histories_bit_for_bit(chain):
    clean, killed, _ = chain
    a, b = fold_runs(clean), fold_runs(killed)
    assert len(a) == TRIALS * 4 + REPS * 4
    assert sorted(b) == sorted(a)
    for key in a:
        assert b[key] == a[key], key
    numbers = dict(sql(killed, "select number, params_hash from mlrc_trial"))
    for trial, h in sql(killed, "select trial_number, params_hash from mlrc_fold_run"):
        assert trial is None or numbers[trial] == h  # a fold names a trial with its parameters


def test_the_same_test_results_bit_for_bit(chain):
    clean, killed, _ = chain
    assert len(result_rows(clean)) == REPS * (4 + 2)
    assert result_rows(killed) == result_rows(clean)


def test_every_checkpoint_exists_in_its_own_fold_and_holds_the_clean_weights(chain):
    clean, killed, _ = chain
    rows = sql(
        killed, "select kind, params_hash, reproduction, fold, checkpoint from mlrc_fold_run"
    )
    kept = []
    for kind, h, rep, fold, ckpt in rows:
        if ckpt is None:  # dropped by retention (as in the clean run: see the fold runs' test)
            continue
        kept.append(Path(ckpt))
        assert Path(ckpt) == fold_dir(killed, kind, h, rep, fold) / "best.pt"
        mine = torch.load(ckpt, map_location="cpu", weights_only=True)
        theirs = torch.load(
            fold_dir(clean, kind, h, rep, fold) / "best.pt", map_location="cpu", weights_only=True
        )
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), ckpt
    # kept: the test reproductions' and the best trial's best.pt, nothing else (no last.pt)
    assert len(kept) == REPS * 4 + 4
    assert sorted((killed.parent / "art").rglob("*.pt")) == sorted(kept)
    assert leftovers(killed.parent / "art") == []
    assert integrity(killed) == "ok"


def test_a_kill_between_forgetting_and_deleting_a_checkpoint_is_collected_by_the_next_run(
    chain, tmp_path
):
    """Planted: killed as retention drops the best.pt of the trial that lost — the row forgets
    it, the file stays. The next run deletes it, and the store ends as the clean run's."""
    clean, _, _ = chain
    db = tmp_path / "db.sqlite"
    path = write_study(tmp_path)
    cmds = commands(path, db, tmp_path / "art")
    child = Child(cmds, tmp_path / "planted", hook=between_forget_and_delete)
    assert child.wait() == -signal.SIGKILL, child.output()
    seen = check_planted("between_forget_and_delete", db)
    check_after_kill(db)
    last = Child(cmds, tmp_path / "last")
    assert last.wait() == 0, last.output()
    assert counted_trials(db) == counted_trials(clean), seen
    assert fold_runs(db) == fold_runs(clean)
    assert result_rows(db) == result_rows(clean)
    named = {Path(c) for (c,) in sql(db, "select checkpoint from mlrc_fold_run") if c}
    assert set((tmp_path / "art").rglob("*.pt")) == named  # the stray best.pt is gone
