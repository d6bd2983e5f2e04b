"""A claim that knows it holds the study's lock, on a real PostgreSQL.

The study's advisory lock lives on a connection of its own; a database restart, or a backend
terminated by an administrator, ends it while the claim goes on (Optuna's storage reconnects by
itself). Here the lock connection's backend is terminated (``pg_terminate_backend``) at an exact
point of a claim — before ``ask()``, after it, and after it with a rival worker that takes the
freed lock and records the half-drawn trial as interrupted. Each is a lost claim, retried
cleanly: the run goes on, the study ends with its budget of complete trials, nothing running, and
the position the lost claim drew at is drawn again."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time

import optuna
import psycopg
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from mlrc import search as S
from mlrc import store
from mlrc.config import load_study
from mlrc.errors import forget_stop_signals, note_stop_signal
from mlrc.search import objective
from mlrc.search.backends import local
from mlrc.search.errors import Interrupted, StudyError
from mlrc.search.heartbeat import recover_unbeaten, retry_interrupted
from mlrc.train.checkpoint import CheckpointError

OVERRIDES = {"max_epochs": 1, "iterations_per_epoch": 2, "patience": {"default": 1}, "folds": 2}


def _study(tmp_path, name: str):  # noqa: ANN202
    doc = {
        "name": name,
        "dataset": {"name": "glyphs", "params": {"size": 24}},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 2, "sampler": "tpe", "seed": 5},
        "overrides": {**OVERRIDES, "image": {"resize": 18, "crop": 16}},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_study(path)


def _terminate_lock_holder(url: str) -> int:
    """``pg_terminate_backend`` on the one backend granted an advisory lock; its pid."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            [pid] = c.execute(
                text("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted")
            ).scalars()
            assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
            c.commit()
        return pid
    finally:
        engine.dispose()


def test_a_terminated_lock_connection_is_a_lost_lock(fresh_database):
    engine = store.connect(fresh_database)
    with store.advisory_lock(engine, "mlrc-study:x") as held:
        held.check()  # held
        _terminate_lock_holder(fresh_database)
        with pytest.raises(store.LockLost, match="lost with its connection"):
            held.check()
        with store.advisory_lock(engine, "mlrc-study:x") as again:  # freed: another takes it
            again.check()
    engine.dispose()


def test_a_stopping_wait_for_a_lock_goes_through_the_stop_and_then_gives_up(
    fresh_database, monkeypatch
):
    monkeypatch.setattr(store.engine, "STOPPING_WAIT_S", 0.5)
    engine = store.connect(fresh_database)
    note_stop_signal(signal.SIGTERM)
    try:
        with store.advisory_lock(engine, "mlrc-study:x", stopping=True):
            start = time.monotonic()
            with (
                pytest.raises(store.StoreError, match="'mlrc-study:x' was not free within 0.5 s"),
                store.advisory_lock(engine, "mlrc-study:x", stopping=True),
            ):
                pass
            assert time.monotonic() - start >= 0.5
            with pytest.raises(KeyboardInterrupt), store.advisory_lock(engine, "mlrc-study:x"):
                pass  # without ``stopping``, the stop ends the wait at once
    finally:
        forget_stop_signals()
        engine.dispose()


@pytest.mark.parametrize("when", ["before_ask", "after_ask", "rival"])
def test_a_claim_whose_lock_is_lost_is_retried_cleanly(
    tmp_path, fresh_database, monkeypatch, caplog, when
):
    name = f"lost_{when}"
    fired: list[int] = []

    def once(original):  # noqa: ANN001, ANN202
        def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if not fired:
                fired.append(_terminate_lock_holder(fresh_database))
                if when == "rival":  # another worker takes the freed lock and recovers the
                    rival_takes_the_lock()  # trial drawn under it, which has no heartbeat
            return original(*args, **kwargs)

        return wrapped

    with S.open_study(
        _study(tmp_path, name), fresh_database, tmp_path / "a", progress=False
    ) as ctx:

        def rival_takes_the_lock() -> None:
            storage = store.optuna_storage(ctx.url)
            ostudy = optuna.load_study(study_name=name, storage=storage)
            study_id = storage.get_study_id_from_name(name)
            with store.advisory_lock(ctx.engine, f"mlrc-study:{name}"):
                recover_unbeaten(ctx, ostudy, storage, study_id)

        target = "make_sampler" if when == "before_ask" else "suggest"
        monkeypatch.setattr(local, target, once(getattr(local, target)))
        with caplog.at_level(logging.WARNING, logger="mlrc"):
            ostudy = S.run_search(ctx)  # no error: the lost claim was taken again
    assert fired
    noticed = [r.getMessage() for r in caplog.records if "taking it again" in r.getMessage()]
    assert len(noticed) == 1, caplog.text  # the claim saw its lock lost, once
    trials = ostudy.get_trials()
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 2 and not [t for t in trials if t.state.name == "RUNNING"]
    lost = [t for t in trials if t.state.name == "FAIL"]
    if when == "before_ask":
        assert lost == []  # nothing was drawn under the lost lock
        return
    [dropped] = lost
    assert dropped.number == 0 and dropped.user_attrs["reason"].startswith("interrupted")
    if when == "after_ask":
        assert dropped.user_attrs["reason"] == local.LOST_CLAIM
        assert dropped.params == complete[0].params  # its position drawn again, the same
    params = [tuple(sorted(t.params.items())) for t in complete]
    assert len(set(params)) == 2  # no two trials drew the same position


def test_a_lock_file_removed_or_replaced_is_a_lost_lock(tmp_path):
    path = str(tmp_path / "db.sqlite.s.lock")
    with store.removed_lock_file(path) as held:
        held.check()  # still the file locked, still locked
        os.unlink(path)
        with pytest.raises(store.LockLost, match="removed or replaced"):
            held.check()
        fd = os.open(path, os.O_CREAT | os.O_RDWR)  # another process's new file, locked
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with pytest.raises(store.LockLost, match="removed or replaced"):
                held.check()
        finally:
            os.close(fd)


def test_a_sqlite_claim_whose_lock_file_is_gone_stops_the_run_in_one_line(tmp_path, monkeypatch):
    db = tmp_path / "db.sqlite"
    original = local.suggest

    def removed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        os.unlink(f"{db}.lost_file.lock")  # removed by hand while trial 0 is drawn
        return original(*args, **kwargs)

    monkeypatch.setattr(local, "suggest", removed)
    url = f"sqlite:///{db}"
    with (
        pytest.raises(StudyError, match=r"lock file was removed or replaced; another process"),
        S.open_study(_study(tmp_path, "lost_file"), url, tmp_path / "a", progress=False) as ctx,
    ):
        S.run_search(ctx)
    storage = store.optuna_storage(url)
    [t] = optuna.load_study(study_name="lost_file", storage=storage).get_trials()
    assert (t.state.name, t.user_attrs["reason"]) == ("FAIL", local.LOST_CLAIM)  # not counted


def _lose_the_answer(storage, who: str, fired: list[int]):  # noqa: ANN001, ANN202
    """``storage`` whose first COMPLETE of a trial goes wrong. ``own``: it commits, then its
    answer is lost with the connection — SQLAlchemy's OperationalError (connection invalidated)
    inside Optuna's session, raised as Optuna does, as ``StorageInternalError`` from it.
    ``rival``: just before it, another worker declares the trial lost (FAIL)."""
    set_state = storage.set_trial_state_values

    def faulty(trial_id, state, values=None):  # noqa: ANN001, ANN202
        if fired or state != TrialState.COMPLETE:
            return set_state(trial_id, state, values)
        fired.append(trial_id)
        if who == "rival":
            set_state(trial_id, TrialState.FAIL)
            return set_state(trial_id, state, values)  # UpdateFinishedTrialError
        set_state(trial_id, state, values)
        closed = psycopg.OperationalError("server closed the connection unexpectedly")
        lost = OperationalError("COMMIT", {}, closed, connection_invalidated=True)
        raise optuna.exceptions.StorageInternalError(
            "An exception is raised during commit"
        ) from lost

    storage.set_trial_state_values = faulty
    return storage


@pytest.mark.parametrize("who", ["own", "rival"])
def test_a_tell_whose_answer_is_lost_keeps_what_landed(
    tmp_path, fresh_database, monkeypatch, caplog, who
):
    """The pool-of-8 bench once ended with Optuna 200 complete, mlrc 199: a tell committed during
    a database restart, its retry found the trial finished and took it for one declared lost."""
    name, fired = f"tell_{who}", []
    heartbeat_storage = local.heartbeat_storage
    monkeypatch.setattr(
        local,
        "heartbeat_storage",
        lambda *a, **k: _lose_the_answer(heartbeat_storage(*a, **k), who, fired),
    )
    with (
        S.open_study(_study(tmp_path, name), fresh_database, tmp_path / "a", progress=False) as ctx,
        caplog.at_level(logging.INFO, logger="mlrc"),
    ):
        ostudy = S.run_search(ctx)
    assert fired
    trials = {t.number: t for t in ostudy.get_trials()}
    engine = create_engine(fresh_database)
    with engine.connect() as c:
        rows = c.execute(text("SELECT number, state, reason, value FROM mlrc_trial")).all()
    engine.dispose()
    mlrc = {n: (state, reason, value) for n, state, reason, value in rows}
    complete = sorted(n for n, t in trials.items() if t.state.name == "COMPLETE")
    assert complete == sorted(n for n, m in mlrc.items() if m[0] == "complete")
    assert len(complete) == 2 and "RUNNING" not in {t.state.name for t in trials.values()}
    for n in complete:
        assert mlrc[n][2] == trials[n].value
    if who == "own":  # kept: complete in both tables, nothing retried
        assert complete == [0, 1] and "declared lost" not in caplog.text
        assert "trial 0 was recorded before the connection dropped" in caplog.text
    else:  # dropped: interrupted in mlrc's table, its parameters retried
        assert trials[0].state.name == "FAIL"
        assert mlrc[0][:2] == ("interrupted", "declared lost: retried")
        [retry] = [t for t in trials.values() if t.user_attrs.get("retry_of") == 0]
        assert retry.number in complete and retry.params == trials[0].params


def test_a_stop_while_another_worker_holds_the_lock_still_records_the_trial(
    tmp_path, fresh_database, monkeypatch, caplog
):
    """A SIGTERM (Slurm's scancel) reaches a worker while another holds the study's lock (it is
    claiming, or stuck): the interruption is recorded at once, without the lock — not after
    the other's claim, nor left RUNNING until its heartbeat goes stale."""
    name, held, released = "stop_waits", threading.Event(), threading.Event()
    run_objective = local.run_objective

    def stopped_while_locked(ctx, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        def rival() -> None:  # another worker's claim, holding the lock until the test's end
            with store.advisory_lock(ctx.engine, f"mlrc-study:{name}"):
                held.set()
                released.wait(60)

        threading.Thread(target=rival, daemon=True).start()
        held.wait(10)
        note_stop_signal(signal.SIGTERM)  # as the CLI's handler does
        return run_objective(ctx, *args, **kwargs)  # its first step raises the stop

    monkeypatch.setattr(local, "run_objective", stopped_while_locked)
    try:
        with (
            S.open_study(
                _study(tmp_path, name), fresh_database, tmp_path / "a", progress=False
            ) as ctx,
            caplog.at_level(logging.WARNING, logger="mlrc"),
            pytest.raises(Interrupted, match="trial 0"),
        ):
            S.run_search(ctx)
    finally:
        forget_stop_signals()
    try:  # recorded while the rival still holds the lock
        assert "not recorded as interrupted" not in caplog.text
        ostudy = optuna.load_study(study_name=name, storage=store.optuna_storage(fresh_database))
        t = ostudy.trials[0]
    finally:
        released.set()
    assert t.state.name == "FAIL" and t.user_attrs["reason"].startswith("interrupted")
    engine = create_engine(fresh_database)
    with engine.connect() as c:
        [state] = c.execute(text("SELECT state FROM mlrc_trial WHERE number = 0")).scalars()
    engine.dispose()
    assert state == "interrupted"


@pytest.mark.parametrize("rival", ["recorded", "cut off"])
def test_an_error_after_the_trial_was_declared_lost_is_dropped_and_the_worker_goes_on(
    tmp_path, fresh_database, monkeypatch, caplog, rival
):
    """A worker whose trial was declared lost (a database restart longer than the grace) trains
    on; its retry, in another worker, takes the parameters' folds over — and may clean a fold
    folder under it. The first worker's error then is not its own: the trial ends interrupted,
    not failed, and the worker goes on (it exited 2). ``recorded``: the rival recorded it
    interrupted and enqueued its retry; ``cut off``: only Optuna's FAIL landed (the rival's
    connection was lost after it), so this worker's next claim enqueues the retry."""
    name, fired = f"declared_{rival.replace(' ', '_')}", []
    run_fold = objective.run_fold

    def lost_then_fails(ctx, *args):  # noqa: ANN001, ANN002, ANN202 — fold 0 of trial 0
        if fired:
            return run_fold(ctx, *args)
        fired.append(args)
        storage = store.optuna_storage(ctx.url)
        ostudy = optuna.load_study(study_name=name, storage=storage)
        study_id = storage.get_study_id_from_name(name)
        [t] = ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if rival == "recorded":
            retry_interrupted(ctx, ostudy, storage, study_id, t, "interrupted: worker lost")
        else:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
        raise CheckpointError("cannot write /x/fold3/last.pt (No such file or directory)")

    monkeypatch.setattr(objective, "run_fold", lost_then_fails)
    with (
        S.open_study(_study(tmp_path, name), fresh_database, tmp_path / "a", progress=False) as ctx,
        caplog.at_level(logging.WARNING, logger="mlrc"),
    ):
        ostudy = S.run_search(ctx)  # no error
    assert "trial 0 was declared lost while it ran: dropped" in caplog.text
    ts = {t.number: t for t in ostudy.get_trials()}
    assert ts[0].state.name == "FAIL"
    assert sum(t.state.name == "COMPLETE" for t in ts.values()) == 2
    [retry] = [t for t in ts.values() if t.user_attrs.get("retry_of") == 0]
    assert retry.state.name == "COMPLETE" and retry.params == ts[0].params
    engine = create_engine(fresh_database)
    with engine.connect() as c:
        [state] = c.execute(text("SELECT state FROM mlrc_trial WHERE number = 0")).scalars()
    engine.dispose()
    assert state == "interrupted"  # not failed by the error
