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

import optuna
import pytest
import yaml
from sqlalchemy import create_engine, text

from mlrc import search as S
from mlrc import store
from mlrc.config import load_study
from mlrc.search.backends import local
from mlrc.search.errors import StudyError
from mlrc.search.heartbeat import recover_unbeaten

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
