"""The local backend: one process (``mlrc study run``) or a pool of workers (``mlrc worker`` on
PostgreSQL, Slurm jobs) running the same loop. The loop takes the next trial under the study's lock,
trains its folds with a heartbeat and tells Optuna. Workers coordinate only through the database.

How a trial that raises ends is one rule (:func:`mlrc.search.errors.ending`): interrupted —
retried, not counted — for a signal (and, found by others, a lost worker or database); failed
with the one-line error as its reason — counted, told to Optuna as FAIL — for everything else,
and the error goes on (the command prints that line and exits 2)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from mlrc import store
from mlrc.errors import raise_if_stopped, sleep_or_stop
from mlrc.search.ax_sampler import SEM_ATTR
from mlrc.search.errors import INTERRUPTED, Interrupted, StudyError, ending
from mlrc.search.heartbeat import (
    HEARTBEAT_S,
    TrialHeartbeat,
    enqueue_lost_retries,
    fail_stale_trials,
    heartbeat_storage,
    recover_interrupted,
    recover_unbeaten,
    retry_interrupted,
)
from mlrc.search.objective import PRUNED, finish_trial, pruning, run_objective
from mlrc.search.optuna_setup import counts, optuna_study
from mlrc.search.session import StudySession
from mlrc.search.space import sampler as make_sampler
from mlrc.search.space import suggest
from mlrc.search.warm_start import enqueue_warm_start
from mlrc.train.ranks import RankLost

log = logging.getLogger("mlrc")


@dataclass
class _Claim:
    trial: optuna.Trial
    trial_id: int
    params: dict[str, Any]


# A trial drawn while the study's lock was lost: another worker may hold the lock and draw at the
# same sampler position. Not counted; drawn again (a retry put back into the queue).
LOST_CLAIM = "interrupted: the study's lock was lost while the trial was drawn"


DROPPED = "declared lost: retried"  # mlrc's reason for a trial whose worker dropped it


class DeclaredLost(Exception):
    """The claimed trial failed after another worker declared it lost (no heartbeat for the
    grace period: a database restart, a long pause) and took its parameters over."""


class _LostClaim(Exception):
    """The study's lock was lost during a claim (``number``: the trial it had asked, if any;
    ``final``: the SQLite study's lock file, which this process cannot take again safely)."""

    def __init__(self, why: str, number: int | None = None, final: bool = False) -> None:
        super().__init__(why)
        self.number, self.final = number, final


def run_search(
    ctx: StudySession,
    heartbeat_s: int = HEARTBEAT_S,
    grace_s: int | None = None,
    poll_s: float = 5.0,
) -> optuna.Study:
    """Run trials until ``trials`` of them have finished (complete or failed with a reason).

    One process (``mlrc study run``) or any number of workers (``mlrc worker``, PostgreSQL)
    run this same loop; they coordinate only through the database. Taking the next trial is
    serialised by an advisory lock, so the budget is global: a worker starts a trial only while
    finished + running < trials, and otherwise waits (``poll_s``) until the running ones end — a
    worker that dies leaves its trial without heartbeat; after ``grace_s`` (default 4 ×
    ``heartbeat_s``) another worker fails it and retries its parameters, reusing finished folds.
    """
    taker = TrialTaker(ctx, heartbeat_s, grace_s)
    while True:
        raise_if_stopped()  # a Ctrl-C or SIGTERM received: stop before the next claim
        took = taker.take()
        if took == DONE:
            return taker.ostudy
        if took == WAIT:
            sleep_or_stop(poll_s)  # looks for a stop signal every 0.1 s
        elif took == LOST:
            sleep_or_stop(min(poll_s, 1.0))


# What :meth:`TrialTaker.take` did: ran a trial (whatever its end), found the budget reached,
# found every remaining slot running (wait), or lost its claim (try again soon).
RAN, DONE, WAIT, LOST = "ran", "done", "wait", "lost"


class TrialTaker:
    """One worker's hand on an open study's search: :meth:`take` claims and runs its next trial.
    ``mlrc study run`` and ``mlrc worker STUDY`` call it in a loop (:func:`run_search`); a
    campaign worker calls it on whichever study it serves next."""

    def __init__(
        self, ctx: StudySession, heartbeat_s: int = HEARTBEAT_S, grace_s: int | None = None
    ):
        self.ctx, self.heartbeat_s = ctx, heartbeat_s
        self.storage = heartbeat_storage(ctx, heartbeat_s, grace_s or 4 * heartbeat_s)
        self.ostudy = optuna_study(ctx, self.storage)
        self.study_id = store.retry(
            lambda: self.storage.get_study_id_from_name(ctx.name), ctx.engine, "reading the study"
        )
        store.retry(
            lambda: _prepare(ctx, self.ostudy, self.storage, self.study_id),
            ctx.engine,
            "opening the study",
        )

    def take(self) -> str:
        """Claim the next trial and run it to its end: :data:`RAN`, or :data:`DONE` (the
        budget is reached), :data:`WAIT` (every remaining slot is running elsewhere),
        :data:`LOST` (the claim was lost: retried cleanly). A failed trial's error goes on."""
        ctx, ostudy, storage, study_id = self.ctx, self.ostudy, self.storage, self.study_id
        try:
            claim = store.retry(
                lambda: _claim(ctx, ostudy, storage, study_id), ctx.engine, "taking the next trial"
            )
        except _LostClaim as e:  # retried cleanly: this worker goes on
            _drop_lost_claim(ctx, ostudy, storage, study_id, e)
            if e.final:
                raise StudyError(f"{e}; another process may run this study: run it again") from None
            return LOST
        if claim is None or claim == "wait":
            return DONE if claim is None else WAIT
        self._run(claim)
        return RAN

    def _run(self, claim: _Claim) -> None:
        """Train the claimed trial with a heartbeat and tell Optuna how it ended."""
        ctx, ostudy, storage = self.ctx, self.ostudy, self.storage
        try:
            with (
                TrialHeartbeat(storage, claim.trial_id, self.heartbeat_s),
                _recorded_on_exit(ctx, ostudy, storage, self.study_id, claim),
            ):
                try:
                    prune = pruning(ctx, claim.trial)
                    value, reason, sem = run_objective(
                        ctx, claim.trial.number, claim.params, should_prune=prune
                    )
                except optuna.TrialPruned as e:
                    value, reason, sem = None, str(e), None
                    claim.trial.set_user_attr("reason", reason)
        except RankLost as e:  # recorded interrupted and retried: this worker goes on
            log.warning("trial %d interrupted (%s): retried", claim.trial.number, e)
            return
        except DeclaredLost as e:  # its retry (another worker's) goes on, and so does this one
            _drop(ctx, claim, f"{e} while it ran")
            return
        tell_optuna(ctx, ostudy, storage, claim, value, reason, sem)


def _prepare(ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int) -> None:
    """Under the study's lock: recover interrupted trials (SQLite), enqueue the study file's
    points, then its warm start's (once)."""
    with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
        if ctx.engine.dialect.name == "sqlite":  # the file lock proves no other process runs
            recover_interrupted(ctx, ostudy, storage, study_id)
        if not ostudy.user_attrs.get("enqueued"):
            _enqueue_once(ostudy, ctx.resolved.study.search.enqueue)
            ostudy.set_user_attr("enqueued", True)
        enqueue_warm_start(ctx, ostudy)  # after the file's points, before any suggestion


def _claim(
    ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int
) -> _Claim | str | None:
    """Under the study's lock: fail stale trials, then ask for the next trial if the budget
    allows it (``None``: the search is done, ``"wait"``: all remaining slots are running).
    The lock is checked before ``ask()`` and before the claim is returned: a lost lock, or the
    asked trial finished by another worker meanwhile (``UpdateFinishedTrialError``), is a
    :class:`_LostClaim`."""
    with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}") as held:
        fail_stale_trials(ostudy)
        recover_unbeaten(ctx, ostudy, storage, study_id)
        known = ostudy.get_trials(deepcopy=False)
        done = sum(map(counts, known))
        running = sum(t.state == TrialState.RUNNING for t in known)
        if done >= ctx.resolved.trials:
            return None
        enqueue_lost_retries(ctx, ostudy, known)
        if done + running >= ctx.resolved.trials:
            return "wait"
        # The k-th suggestion is drawn with a seed of its own, so an interrupted and resumed
        # study proposes the same sequence as an uninterrupted one (a resumed process would
        # otherwise restart the sampler's random stream and repeat earlier parameters).
        r = ctx.resolved
        ostudy.sampler = make_sampler(r.sampler, r.study.search.seed, r.space, done + running)
        _still_held(ctx, held)
        trial = ostudy.ask()
        try:
            params = suggest(trial, ctx.resolved.space)
            trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.record_heartbeat(trial_id)  # before the lock's release: never RUNNING unseen
            _still_held(ctx, held, trial.number)
        except optuna.exceptions.UpdateFinishedTrialError as e:
            raise _LostClaim(f"trial {trial.number} was ended by another worker ({e})") from None
        return _Claim(trial, trial_id, params)


def _still_held(ctx: StudySession, held: store.HeldLock, number: int | None = None) -> None:
    """:class:`_LostClaim` (not a database error: :func:`store.retry` leaves it to the caller)
    unless the study's lock is still this process's: PostgreSQL's advisory lock, or on SQLite
    the study's lock file (``ctx.lock``)."""
    try:
        held.check()
    except store.LockLost as e:
        raise _LostClaim(str(e), number) from None
    if ctx.lock is not None:
        try:
            ctx.lock.check()
        except store.LockLost as e:
            raise _LostClaim(str(e), number, final=True) from None


def _drop_lost_claim(
    ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int, lost: _LostClaim
) -> None:
    """After a lost claim, under the lock again: the trial it asked, if still RUNNING, ends as
    interrupted (:data:`LOST_CLAIM`: not counted). One taken from the queue (enqueued points,
    retries) goes back to it; a fresh draw does not — its sampler position is drawn again by the
    next claim (another worker may have drawn the same parameters there already)."""
    log.warning("taking the next trial: %s; taking it again", lost)
    if lost.number is None:
        return

    def drop() -> None:
        with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, lost.number)
            t = storage.get_trial(trial_id)
            if t.state != TrialState.RUNNING:
                return  # ended by the worker that held the lock
            if t.system_attrs.get("fixed_params"):
                retry_interrupted(ctx, ostudy, storage, study_id, t, LOST_CLAIM)
            else:
                storage.set_trial_user_attr(trial_id, "reason", LOST_CLAIM)
                storage.set_trial_state_values(trial_id, TrialState.FAIL)

    try:
        store.retry(drop, ctx.engine, f"dropping trial {lost.number}")
    except Exception as e:  # noqa: BLE001 — recovered later (its heartbeat stops); one line
        log.warning(
            "trial %d not dropped now (%s); it is recovered later",
            lost.number,
            store.db_error_line(e),
        )


def tell_optuna(
    ctx: StudySession,
    ostudy: optuna.Study,
    storage: Any,
    claim: _Claim,
    value: float | None,
    reason: str | None,
    sem: float | None = None,
) -> None:
    """Tell Optuna how a claimed trial ended, after mlrc's table has it (the crash corpus kills a
    worker here: ``tests/bad_inputs/test_crash_consistency.py``); the fold SEM of a trial with
    a value is its user attribute ``sem`` (``sampler: ax`` reads it)."""

    def tell() -> None:
        if value is not None:  # a reason beside a value: scored 0 for a non-finite loss
            if reason is not None:
                claim.trial.set_user_attr("reason", reason)
            if sem is not None:
                claim.trial.set_user_attr(SEM_ATTR, sem)
            ostudy.tell(claim.trial, value)
        elif reason is not None and reason.startswith(PRUNED):
            ostudy.tell(claim.trial, state=TrialState.PRUNED)
        else:
            claim.trial.set_user_attr("reason", reason)
            ostudy.tell(claim.trial, state=TrialState.FAIL)

    try:
        store.retry(tell, ctx.engine, f"recording trial {claim.trial.number}")
    except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError) as e:
        if isinstance(e, store.StoreError):
            raise
        if not _told_already(ctx, storage, claim, value, reason):
            # Another worker declared this trial lost (no heartbeat for the grace period, e.g. a
            # long network cut) and retries its parameters; the finished folds are reused there.
            _drop(ctx, claim, f"trial {claim.trial.number} was declared lost while it ran: {e}")
            return
    if reason is not None and value is not None:
        log.warning("trial %d scored %g: %s", claim.trial.number, value, reason)
    elif reason is not None and reason.startswith(PRUNED):
        log.info("trial %d %s", claim.trial.number, reason)
    elif reason is not None:
        log.warning("trial %d failed: %s", claim.trial.number, reason)


def _drop(ctx: StudySession, claim: _Claim, why: str) -> None:
    """This worker's trial, declared lost by another, as interrupted in mlrc's table (so the
    next claim enqueues a retry the other did not get to enqueue: a connection lost between)."""
    log.warning("%s: dropped", why)
    finish_trial(ctx, claim.trial.number, "interrupted", None, None, DROPPED)


def _told_already(
    ctx: StudySession, storage: Any, claim: _Claim, value: float | None, reason: str | None
) -> bool:
    """Did this worker's own tell land, its commit's answer lost with the connection (the retried
    tell then finds the trial finished)? Only this worker completes its trial, and another
    worker ends it as FAIL with a reason of its own, never this one's."""
    t = store.retry(
        lambda: storage.get_trial(claim.trial_id),
        ctx.engine,
        f"reading trial {claim.trial.number}",
    )
    if value is not None:
        told = t.state == TrialState.COMPLETE and t.value == value
    elif reason is not None and reason.startswith(PRUNED):
        told = t.state == TrialState.PRUNED
    else:
        told = t.state == TrialState.FAIL and t.user_attrs.get("reason") == reason
    if told:
        log.info("trial %d was recorded before the connection dropped", claim.trial.number)
    return told


def _enqueue_once(ostudy: optuna.Study, enqueue: list[dict[str, Any]]) -> None:
    """The study file's ``enqueue`` list, each entry once even if a kill interrupts the loop."""
    seen = {t.user_attrs.get("enqueue_index") for t in ostudy.get_trials(deepcopy=False)}
    for i, params in enumerate(enqueue):
        if i not in seen:
            ostudy.enqueue_trial(params, user_attrs={"enqueue_index": i})


@contextmanager
def _recorded_on_exit(
    ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int, claim: _Claim
) -> Iterator[None]:
    """A trial that raises is told to Optuna at once, by the one rule (:func:`ending`; mlrc's
    row and folds are recorded by :func:`~mlrc.search.objective.run_objective`): stopped by
    Ctrl-C or SIGTERM (the CLI turns it into KeyboardInterrupt) it is recorded as interrupted —
    retried, not counted — and :class:`Interrupted`, naming the trial, goes on; failed for any
    other error (unreadable image, disk full, …) with that error's one line as its reason —
    counted — and the error goes on. A lost database is left to the next run."""
    try:
        yield
    except BaseException as e:
        how, reason = ending(e)
        if how == INTERRUPTED:
            _record_interrupt(ctx, ostudy, storage, study_id, claim, reason or INTERRUPTED)
            if reason is not None and not isinstance(e, RankLost):  # a loader killed: as a rank
                raise RankLost(reason.removeprefix(f"{INTERRUPTED}: ")) from e
            if not isinstance(e, Interrupted | RankLost):
                raise Interrupted(claim.trial.number) from e
        elif how == "failed" and _record_failure(ctx, ostudy, storage, study_id, claim, reason):
            raise DeclaredLost(f"{reason}; trial {claim.trial.number} was declared lost") from e
        raise


def _record_interrupt(
    ctx: StudySession,
    ostudy: optuna.Study,
    storage: Any,
    study_id: int,
    claim: _Claim,
    reason: str = INTERRUPTED,
) -> None:
    """The claimed trial, if still RUNNING, as interrupted now with ``reason`` (a failure here
    is only logged). Without the study's lock, so that a stop never waits behind other
    workers' claims: no other worker writes this trial while its heartbeat is fresh, and the
    order of :func:`retry_interrupted` (the retry committed before Optuna's FAIL) lets a claim
    that reads the trials meanwhile see it RUNNING, or FAIL with its retry — never FAIL alone,
    which it would retry a second time."""
    try:
        t = storage.get_trial(claim.trial_id)
        if t.state == TrialState.RUNNING:
            retry_interrupted(ctx, ostudy, storage, study_id, t, reason)
    except Exception as e:  # noqa: BLE001 — recovered later (next run / heartbeat); one line
        log.warning(
            "trial %d not recorded as interrupted now (%s); it is recovered later",
            claim.trial.number,
            store.db_error_line(e),
        )


def _record_failure(
    ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int, claim: _Claim, reason: str
) -> bool:
    """The claimed trial, if still RUNNING, told to Optuna as FAIL with ``reason`` (a failure
    here is only logged: left RUNNING, the next run recovers it as interrupted). True when it
    was not RUNNING: another worker declared it lost and retries it (the error is no longer
    this worker's: it goes on)."""
    try:
        with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
            if storage.get_trial(claim.trial_id).state != TrialState.RUNNING:
                return True
            claim.trial.set_user_attr("reason", reason)
            ostudy.tell(claim.trial, state=TrialState.FAIL)
    except Exception as e:  # noqa: BLE001 — recovered later (next run / heartbeat); one line
        log.warning(
            "trial %d not recorded as failed now (%s); it is recovered later",
            claim.trial.number,
            store.db_error_line(e),
        )
    return False
