"""What ``mlrc campaign status`` shows of each study's work: search trials done / running / left
of the budget, test folds done / running / left of reproductions × folds, and which worker
(``host:pid``) holds each running trial or test fold. Read from the store only
(:mod:`mlrc.store.campaigns`); prints nothing.

Counts: a trial is done when it ended complete, failed or pruned (it counts towards the budget,
as in :func:`~mlrc.search.campaign_runner.progress`); left is the budget less done and running
(an interrupted trial is left: it is retried). A test fold (reproduction r ≤ the study's
reproductions, fold k) is done when its fold run is complete or its reproduction is tested;
left is reproductions × folds less done and running. A worker that died leaves its trial or
fold ``running`` until another worker recovers it: ``seen`` (the trial's last heartbeat, the
test fold's last write) tells such a row from a live one.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from mlrc.search.campaign_runner import FINISHED
from mlrc.store.campaigns import Running, running_units, study_progress

__all__ = ["Counts", "StudyWork", "study_work"]


@dataclass(frozen=True)
class Counts:
    """Units of one kind: ``done``, ``running`` and ``left`` of ``total``."""

    total: int
    done: int
    running: int
    left: int


@dataclass(frozen=True)
class Held:
    """A running unit and who holds it: ``what`` (``trial 3``, ``rep 1 fold 0``), ``worker``
    (``host:pid``, None: not recorded), ``seen`` (``YYYY-MM-DD HH:MM:SS`` UTC, None: unknown)."""

    what: str
    worker: str | None
    seen: str | None


@dataclass(frozen=True)
class StudyWork:
    """One study's work: its search trials, its test folds and what runs (trials first)."""

    study: str
    trials: Counts
    test_folds: Counts
    running: list[Held]


def study_work(engine: Any, name: str) -> StudyWork:
    """The work of study ``name`` as the store records it; a study not in the store yet has
    nothing done and nothing running (its totals are 0: its budget is not stored yet)."""
    st = study_progress(engine, name)
    if st is None:
        return StudyWork(name, Counts(0, 0, 0, 0), Counts(0, 0, 0, 0), [])
    budget = int(st.config.get("trials") or 0)
    done = sum(state in FINISHED for state, _ in st.trials)
    running = sum(state == "running" for state, _ in st.trials)
    trials = Counts(budget, done, running, max(0, budget - done - running))
    wanted = int(st.config.get("reproductions") or 0)
    folds = int((st.config.get("preset") or {}).get("folds") or 0)
    tested = {(r, k) for r in range(1, min(st.reproductions, wanted) + 1) for k in range(folds)}
    complete = {(r, k) for status, r, k, _ in st.test_folds if status == "complete"}
    live = {(r, k) for status, r, k, _ in st.test_folds if status == "running"}
    ok = {(r, k) for r, k in tested | complete | live if 1 <= r <= wanted and 0 <= k < folds}
    test_done = len(ok & (tested | complete))
    test_running = len(ok & live - tested - complete)
    total = wanted * folds
    tests = Counts(total, test_done, test_running, max(0, total - test_done - test_running))
    return StudyWork(name, trials, tests, [_held(u) for u in running_units(engine, name)])


def _held(u: Running) -> Held:
    what = f"trial {u.trial}" if u.kind == "trial" else f"rep {u.reproduction} fold {u.fold}"
    return Held(what, u.worker, _time_text(u.seen))


def _time_text(value: Any) -> str | None:
    """A time as the database returned it (a datetime, or SQLite's text) to the second."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value).replace("T", " ")[:19]
