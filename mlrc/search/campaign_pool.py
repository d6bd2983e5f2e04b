"""A campaign served by a pool: every ``mlrc worker CAMPAIGN.yaml`` takes the campaign's next unit
of work from the store, whichever study it belongs to, until every study is searched and tested.

The next unit, in this order (each worker looks again after every unit):

1. a test unit of a study whose search is complete, studies in the campaign's order — its first
   test fold (reproduction r, fold k, in order) that is neither complete nor held by another
   worker; or, once a reproduction's folds are all trained, its rows (embeddings, metrics,
   concatenation, stored ``.npz``: what ``study test`` computes, by one worker);
2. else a search trial of the first study, in the campaign's order, whose budget is not reached
   and whose remaining slots are not all running elsewhere.

So a ready test fold goes before a new study's first trial, and studies finish in order. A worker
with nothing to take while others run waits ``poll_s`` and looks again; it returns when every
study is done (or has failed for it).

A trial is claimed, beaten and retried as in ``mlrc worker STUDY`` (:class:`TrialTaker`). A test
fold is claimed under the study's lock: ``running``, with this worker as its provenance and a
heartbeat (its ``updated`` time, every ``heartbeat_s``). One without a heartbeat for ``grace_s``
(its worker was killed) is taken by the next worker and resumes from its ``last.pt``. A signal
records the fold interrupted (the next worker resumes it); any other error fails it with its
one-line reason, and the study fails — for every worker, as ``campaign run`` would report it. A
trial that fails ends its study for the worker that ran it (as ``campaign run`` does); the other
workers go on with it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from mlrc import store
from mlrc.config import ResolvedStudy
from mlrc.config.identity import params_hash
from mlrc.errors import interrupt_behind, raise_if_stopped, sleep_or_stop
from mlrc.search.backends.local import DONE, LOST, RAN, WAIT, TrialTaker
from mlrc.search.campaign_runner import SILENT, CampaignEvents, Cell, Plan, progress
from mlrc.search.errors import INTERRUPTED, Interrupted, StudyError, ending, failure_reason
from mlrc.search.folds import FoldJob, claim_fold, run_fold
from mlrc.search.heartbeat import HEARTBEAT_S, Heartbeat
from mlrc.search.reproductions import (
    best_params,
    check_same_retrieval,
    fail_test_fold,
    finish_reproduction,
    is_tested,
)
from mlrc.search.session import StudySession
from mlrc.store import StoreError, trials

__all__ = ["serve_campaign"]

log = logging.getLogger("mlrc")

Opener = Callable[[ResolvedStudy], AbstractContextManager[StudySession]]


@dataclass
class _Study:
    """One study as this worker serves it: opened at its first unit, closed when it ends."""

    i: int
    cell: Cell
    resolved: ResolvedStudy
    stack: ExitStack = field(default_factory=ExitStack)
    ctx: StudySession | None = None
    taker: TrialTaker | None = None
    searched: bool = False
    params: dict[str, Any] | None = None
    ended: str | None = None  # "done", or why it failed

    @property
    def name(self) -> str:
        return self.cell.name

    def close(self) -> None:
        self.stack.close()
        self.ctx = self.taker = None


@dataclass
class _Pool:
    """What one campaign worker knows: its studies and how it runs them."""

    studies: list[_Study]
    open_study: Opener
    events: CampaignEvents
    heartbeat_s: int
    grace_s: int
    failures: dict[str, str] = field(default_factory=dict)


def serve_campaign(
    plan: Plan,
    open_study: Opener,
    events: CampaignEvents = SILENT,
    heartbeat_s: int = HEARTBEAT_S,
    grace_s: int | None = None,
    poll_s: float = 5.0,
) -> dict[str, str]:
    """Serve the campaign's studies (``plan``, registered: :func:`prepare_campaign`) until every
    one is done or failed; ``open_study`` opens one (:func:`~mlrc.search.session.open_study`
    with this worker's storage, artifacts and device). Returns each failed study's reason."""
    studies = [_Study(i, cell, r) for i, (cell, r) in enumerate(plan, 1)]
    pool = _Pool(studies, open_study, events, heartbeat_s, grace_s or 4 * heartbeat_s)
    try:
        while True:
            raise_if_stopped()
            took = _next_unit(pool)
            if took == DONE:
                return pool.failures
            if took == WAIT:
                sleep_or_stop(poll_s)
    finally:
        for s in studies:
            s.close()


def _next_unit(pool: _Pool) -> str:
    """Take and run the campaign's next unit (module docstring): :data:`RAN`, or :data:`WAIT`
    (nothing free while others run), or :data:`DONE` (every study ended)."""
    waiting = False
    for s in [s for s in pool.studies if s.ended is None and s.searched]:
        took = _guarded(pool, s, lambda s=s: _test_unit(pool, s))
        if took == RAN:
            return RAN
        waiting |= took == WAIT
    for s in [s for s in pool.studies if s.ended is None and not s.searched]:
        took = _guarded(pool, s, lambda s=s: _trial_unit(pool, s))
        if took in (RAN, DONE):  # DONE: its search is complete, its test folds come first
            return RAN
        waiting |= took in (WAIT, LOST)
    return WAIT if waiting else DONE


def _guarded(pool: _Pool, s: _Study, unit: Callable[[], str]) -> str:
    """Run one unit of study ``s``: an error of the study itself ends it for this worker (its
    reason kept, as ``campaign run`` reports it); the store's errors and stops go on."""
    try:
        if s.ctx is None and _open(pool, s) == DONE:
            return DONE
        return unit()
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 — one study's failure must not stop the pool
        if interrupt_behind(e) is not None:
            raise
        _fail(pool, s, failure_reason(e))
        return DONE


def _open(pool: _Pool, s: _Study) -> str | None:
    """Open study ``s`` for its first unit; :data:`DONE` when the store has it done already."""
    assert s.ctx is None
    s.ctx = s.stack.enter_context(pool.open_study(s.resolved))
    if progress(s.ctx.engine, s.name).state == "done":
        _end(s, "done")
        return DONE
    return None


def _trial_unit(pool: _Pool, s: _Study) -> str:
    """The next search trial of ``s`` (:meth:`TrialTaker.take`); once its budget is reached,
    ``s`` goes on to its test stage (or fails, when no trial completed)."""
    if s.taker is None:
        s.taker = TrialTaker(s.ctx, pool.heartbeat_s, pool.grace_s)
    took = s.taker.take()
    if took == DONE:
        p = progress(s.ctx.engine, s.name)
        if p.state == "failed":
            _fail(pool, s, p.text.removeprefix("failed: "))
        else:
            s.searched = True
            pool.events.searched(s.ctx)
    return took


def _test_unit(pool: _Pool, s: _Study) -> str:
    """The next test unit of ``s`` (a fold, or a reproduction's rows): :data:`RAN`,
    :data:`WAIT` (the rest is held by others) or :data:`DONE` (every reproduction tested)."""
    ctx = s.ctx
    if s.params is None:
        s.params = best_params(ctx)
        check_same_retrieval(ctx)
    reps = range(1, ctx.resolved.reproductions + 1)
    pending = [rep for rep in reps if not is_tested(ctx, s.params, rep)]
    if not pending:
        _end(s, "done")
        return DONE
    busy: set[int] = set()  # reproductions whose rows another worker computes now
    while True:
        claim = store.retry(
            lambda: _claim_test(ctx, s.params, pending, busy, pool.grace_s),
            ctx.engine,
            f"taking the next test fold of {s.name}",
        )
        if isinstance(claim, FoldJob):
            _run_test_fold(pool, s, claim)
            return RAN
        if claim is None:
            return WAIT
        if _rows(s, claim):
            return RAN
        busy.add(claim)


def _claim_test(
    ctx: StudySession, params: dict[str, Any], pending: list[int], busy: set[int], grace_s: int
) -> FoldJob | int | None:
    """Under the study's lock: the first test fold of the ``pending`` reproductions that is not
    complete and not held (running with a heartbeat younger than ``grace_s``), claimed for this
    worker; else the first reproduction not in ``busy`` whose folds are all complete (its rows
    are due); else None. A failed fold is a :class:`StudyError` (the study failed)."""
    h = params_hash(params)
    with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
        runs = {(f.reproduction, f.fold): f for f in trials.fold_runs(ctx.engine, ctx.study_id)
                if f.kind == "test" and f.params_hash == h}  # fmt: skip
        stale = _utcnow() - dt.timedelta(seconds=grace_s)
        due = None
        for rep in pending:
            trained = True
            for fold in ctx.split.folds:
                f = runs.get((rep, fold.index))
                if f is not None and f.status == "complete":
                    continue
                trained = False
                if f is not None and f.status == "failed":
                    raise StudyError(f"reproduction {rep}, fold {fold.index}: {f.reason}")
                if f is not None and f.status == "running" and f.updated > stale:
                    continue  # held by a live worker
                job = FoldJob("test", h, rep, fold.index)
                claim_fold(ctx, job)
                return job
            if trained and due is None and rep not in busy:
                due = rep
        return due


def _run_test_fold(pool: _Pool, s: _Study, job: FoldJob) -> None:
    """Train the claimed test fold with a heartbeat (resuming from its ``last.pt``)."""
    ctx, key = s.ctx, job.key(s.ctx.study_id)
    log.info("%s: test fold %d of reproduction %d", s.name, job.fold, job.reproduction)
    with (
        Heartbeat(lambda: trials.beat_fold(ctx.engine, key, job.what), pool.heartbeat_s, job.what),
        _fold_recorded_on_exit(ctx, s.params, job),
    ):
        run_fold(ctx, "test", s.params, job.reproduction, job.fold, None)


def _rows(s: _Study, rep: int) -> bool:
    """Reproduction ``rep``'s rows, unless another worker computes them now (False). A failed
    fold among them is a :class:`StudyError`."""
    ctx = s.ctx
    with store.try_advisory_lock(ctx.engine, f"mlrc-test-rows:{s.name}:{rep}") as held:
        if held is None:
            return False
        if not is_tested(ctx, s.params, rep):  # not by a worker that held the lock just before
            log.info("%s: the rows of reproduction %d", s.name, rep)
            problem = finish_reproduction(ctx, s.params, rep)
            if problem:
                raise StudyError(problem)
    return True


@contextmanager
def _fold_recorded_on_exit(
    ctx: StudySession, params: dict[str, Any], job: FoldJob
) -> Iterator[None]:
    """A test fold that raises ends by the one rule (:func:`ending`): a signal records it
    interrupted (the next worker resumes it) and :class:`Interrupted` names it; any other
    error fails it with the one-line reason; a lost database records nothing. The error goes
    on (a failure to record is only logged)."""
    try:
        yield
    except BaseException as e:
        how, reason = ending(e)
        what = f"reproduction {job.reproduction}, fold {job.fold}"
        try:
            if how == INTERRUPTED:
                trials.finish_fold(ctx.engine, job.key(ctx.study_id), job.what,
                                   status=INTERRUPTED, reason=reason or INTERRUPTED)  # fmt: skip
            elif how == "failed":
                fail_test_fold(ctx, params, job.reproduction, job.fold, reason)
        except Exception as err:  # noqa: BLE001 — ``e`` is what goes on
            log.warning("%s not recorded as %s (%s)", what, how, store.db_error_line(err))
        if how == INTERRUPTED and not isinstance(e, Interrupted):
            raise Interrupted(what=f"{ctx.name}: {what}") from e
        raise


def _end(s: _Study, how: str) -> None:
    """Study ``s`` ended for this worker (``how``: "done" or its failure's reason)."""
    s.ended = how
    s.close()


def _fail(pool: _Pool, s: _Study, reason: str) -> None:
    """Study ``s`` failed for this worker: its reason kept and told; the pool goes on."""
    pool.failures[s.name] = reason
    pool.events.study_failed(s.i, len(pool.studies), s.cell, reason)
    _end(s, reason)


def _utcnow() -> dt.datetime:
    """Now in UTC without a time zone, as the store writes ``updated``."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)
