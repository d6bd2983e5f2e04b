"""A worker pool at scale under faults (issue #15): 8 ``mlrc worker`` processes with no-op folds
run a 200-trial study on a real PostgreSQL while workers are SIGKILLed at random moments (each
replaced at once) and the database is restarted once; the store must end exactly as the budget
says.

The run is ``bench/pool_load.py`` (the benchmark prints the same run's figures): the workers
are children forked from this pre-imported process (no Python + torch start-up per worker), and
in each only the fold trainer is replaced by a no-op; claims, Optuna's storage and sampler,
heartbeats, mlrc's rows and reconnects are the real ones.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import bench_module

WORKERS, TRIALS, KILLS = 8, 200, 10


@pytest.mark.slow
def test_pool_of_8_with_kills_and_a_database_restart(tmp_path, postgres_server):
    bench = bench_module("pool_load")
    r = bench.run(
        postgres_server,
        tmp_path,
        workers=WORKERS,
        trials=TRIALS,
        kills=KILLS,
        restart=True,
        seed=15,
        timeout_s=420,
    )
    f = bench.verify(r)
    figures = bench.figures(r, f)
    print(bench.markdown(figures, bench.problems(r, f), "this machine"))
    failing = {w.pid: w.output()[-3000:] for w in r.pool if not w.killed and w.code != 0}
    assert not r.timed_out, "the pool did not finish"
    assert f["bad_exits"] == [], failing
    assert f["optuna_complete"] == f["mlrc_complete"] == TRIALS
    assert f["complete_numbers_agree"] and f["values_agree"]
    assert f["params_complete_twice"] == 0  # no trial counted twice
    assert f["fold_rows"] == 4 * TRIALS and f["fold_rows_not_complete"] == 0
    assert f["fold_params_not_complete_trials"] == 0
    assert f["duplicate_fold_rows"] == 0 and f["duplicate_epoch_rows"] == 0
    assert f["running_or_waiting"] == 0
    assert len(r.kills) == KILLS and r.restart is not None
    assert r.restart["recovery_s"] is not None  # trials completed again after the restart
    assert f["killed_trials"], "no kill hit a running trial"
    assert f["killed_not_interrupted_and_retried"] == []
    assert f["failed_not_interrupted"] == [] and f["failed_not_retried"] == []
    assert len(r.pool) == WORKERS + KILLS
    assert bench.problems(r, f) == []


def _die_at_first(owner: type, method: str):
    """A hook: this process SIGKILLs itself as ``owner.method`` is first called (after the
    call for ``ask``, which creates the trial, and ``_set_trial_param``, which records its first
    parameter; before it for ``record_heartbeat``)."""

    def hook() -> None:
        original = getattr(owner, method)

        def dying(self, *args, **kwargs):
            if method in ("ask", "_set_trial_param"):
                original(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        setattr(owner, method, dying)

    return hook


def _wait(w, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while w.alive():
        if time.monotonic() > deadline:
            w.kill()
            pytest.fail(f"worker {w.pid} still running after {timeout} s:\n{w.output()}")
        time.sleep(0.05)
    return w.code


@pytest.mark.parametrize(
    "where",
    ["after Optuna's ask", "after its first parameter", "before the first heartbeat"],
    ids=["ask", "drawing", "heartbeat"],
)
def test_a_claim_killed_before_its_first_heartbeat_is_retried(tmp_path, postgres_server, where):
    """A worker killed between Optuna's ask and its trial's first heartbeat leaves a RUNNING
    trial that Optuna never fails (no heartbeat, never stale): the next claim, under the study's
    lock, records it as interrupted; the pool does not wait for it forever."""
    import optuna

    bench = bench_module("pool_load")
    url, name, args = bench.new_pool(postgres_server, tmp_path, trials=4, seed=3)
    if where == "after Optuna's ask":
        hook = _die_at_first(optuna.Study, "ask")
    elif where == "after its first parameter":  # as a connection lost mid-draw, asked again
        hook = _die_at_first(optuna.storages.RDBStorage, "_set_trial_param")
    else:
        hook = _die_at_first(optuna.storages.RDBStorage, "record_heartbeat")
    dying = bench.fork_worker(0, args, tmp_path, hook=hook)
    assert _wait(dying, 120) == -signal.SIGKILL, dying.output()
    dying.killed = True
    running = bench.running_by_pid(bench.conninfo(url)) or {}
    drawing = where != "before the first heartbeat"  # killed before the worker attribute
    assert running.get(dying.pid, []) == ([] if drawing else [0])
    survivor = bench.fork_worker(1, args, tmp_path)
    assert _wait(survivor, 120) == 0, survivor.output()
    assert "trial 0 was claimed by a worker that stopped before its first heartbeat" in (
        survivor.output()
    )
    r = bench.Run(name, url, 2, 4, pool=[dying, survivor])
    # all its parameters drawn: retried with them; some or none drawn: the next trial draws
    # them again at the same sampler position, so no parameters are counted twice either way
    r.kills = [{"pid": dying.pid, "at": 0, "trials": [] if drawing else [0]}]
    f = bench.verify(r)
    assert bench.problems(r, f) == []
    assert f["optuna_states"] == {"COMPLETE": 4, "FAIL": 1}
    assert f["failed_not_interrupted"] == []
    assert f["failed_while_drawing"] == ([0] if drawing else [])
    if where == "after its first parameter":  # the next claim, at position 0, draws them again
        first, second = optuna.load_study(study_name=name, storage=url).get_trials()[:2]
        assert 0 < len(first.params) < len(second.params)
        assert {k: second.params[k] for k in first.params} == first.params


def test_a_connection_lost_inside_optuna_storage_is_waited_out():
    """Optuna's storage turns a lost connection into its own StorageInternalError (raised from
    the driver's error, or from the PendingRollbackError of the query it tried next on the
    broken session): ``store.retry`` sees the lost connection behind it and tries again (a
    worker used to exit 1 on a database restart)."""
    import optuna
    from sqlalchemy import create_engine
    from sqlalchemy.exc import OperationalError, PendingRollbackError

    from mlrc import store

    engine = create_engine("postgresql+psycopg://mlrc@127.0.0.1:1/none")  # never connected
    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    calls = []

    def storage_call() -> str:
        calls.append(len(calls))
        try:
            try:
                raise lost
            except OperationalError:
                if len(calls) == 1:
                    raise optuna.exceptions.StorageInternalError("commit") from lost
                raise PendingRollbackError("rollback first")  # noqa: B904 — as SQLAlchemy does
        except PendingRollbackError as e:
            if len(calls) == 2:
                raise optuna.exceptions.StorageInternalError("commit") from e
        return "done"

    assert store.retry(storage_call, engine, "testing") == "done"
    assert calls == [0, 1, 2]
    with pytest.raises(optuna.exceptions.StorageInternalError):  # not a lost connection

        def invalid() -> None:
            raise optuna.exceptions.StorageInternalError("commit") from ValueError("too long")

        store.retry(invalid, engine, "testing")
