"""Heartbeats of running trials and the recovery of trials whose process died.

A running trial records a heartbeat every ``heartbeat_s`` seconds (:class:`TrialHeartbeat`). A
trial without one for the grace period (its worker was killed, or lost its network) is failed
by the next worker that looks (:func:`heartbeat_storage`) and its parameters are retried; on a
SQLite file, whose lock proves that no other process runs, every RUNNING trial is such a trial
(:func:`recover_interrupted`). A retried trial reuses its finished folds."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from mlrc import store
from mlrc.config.identity import params_hash
from mlrc.search.session import StudySession
from mlrc.store import trials

log = logging.getLogger("mlrc")
# We run Optuna's heartbeat ourselves around ask/tell (see TrialHeartbeat): its notes are expected.
warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used", UserWarning)
warnings.filterwarnings("ignore", ".*heartbeat.*", optuna.exceptions.ExperimentalWarning)

HEARTBEAT_S = 30  # default heartbeat interval of a running trial (seconds)


class Heartbeat:
    """Calls ``beat()`` every ``interval`` seconds in a daemon thread while the block runs; a
    lost database only logs a warning naming ``what`` (the retrying connection comes back by
    itself)."""

    def __init__(self, beat: Callable[[], Any], interval: float, what: str) -> None:
        self.beat, self.interval, self.what = beat, interval, what
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="mlrc-heartbeat")

    def _beat(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001 — keep beating; report in one line
                log.warning("heartbeat of %s not recorded: %s", self.what, store.db_error_line(e))

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


class TrialHeartbeat(Heartbeat):
    """Records the trial's heartbeat (Optuna's) every ``interval`` seconds."""

    def __init__(self, storage: Any, trial_id: int, interval: float) -> None:
        super().__init__(
            lambda: storage.record_heartbeat(trial_id), interval, f"trial id {trial_id}"
        )
        self.storage, self.trial_id = storage, trial_id


def heartbeat_storage(ctx: StudySession, heartbeat_s: int, grace_s: int) -> Any:
    """Optuna storage whose stale trials (no heartbeat for ``grace_s``) are failed with the
    reason and retried with the same parameters (:func:`_on_stale`)."""
    return store.optuna_storage(
        ctx.url,
        heartbeat_interval=heartbeat_s,
        grace_period=grace_s,
        heartbeat_stale_trial_callback=lambda st, t: _on_stale(ctx, st, t, grace_s),
    )


def fail_stale_trials(ostudy: optuna.Study) -> None:
    """Fail (and retry, see :func:`heartbeat_storage`) the trials of ``ostudy`` whose heartbeat
    is older than its storage's grace period."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(ostudy)


def recover_unbeaten(ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int) -> None:
    """RUNNING trials that never recorded a heartbeat, as interrupted now (and retried when
    their parameters were all drawn). A claim that died between Optuna's ask and its first
    heartbeat (SIGKILL, or a lost connection whose retried claim asked again) leaves such a
    trial, and Optuna never fails a trial without a heartbeat: the pool would wait for it
    forever. Call under the study's lock, where every live claim has recorded its heartbeat:
    the next claim recovers it before drawing, at the position the dead claim drew at (as on
    SQLite, :func:`recover_interrupted`)."""
    unbeaten = {number for _, number in store.unbeaten_trials(ctx.engine, study_id)}
    if not unbeaten:
        return
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number in unbeaten:
            retry_interrupted(ctx, ostudy, storage, study_id, t)
            log.warning(
                "trial %d was claimed by a worker that stopped before its first heartbeat; "
                "recorded as interrupted",
                t.number,
            )


def enqueue_lost_retries(
    ctx: StudySession, ostudy: optuna.Study, known: list[optuna.trial.FrozenTrial]
) -> None:
    """Retry the FAIL trials recorded interrupted whose retry was never enqueued: Optuna fails a
    stale trial before its callback (:func:`_on_stale`) enqueues the retry, and a connection
    lost in between (a database restart) leaves it FAIL for good — no later pass sees it as
    RUNNING again. Call under the study's lock, with the study's trials ``known``."""
    retried = {t.user_attrs.get("retry_of") for t in known}
    lost = [t for t in known if t.state == TrialState.FAIL and t.number not in retried]
    if not lost:
        return
    interrupted = trials.interrupted_trial_numbers(ctx.engine, ctx.study_id)
    for t in lost:
        params = _retry_params(ctx, t)
        if t.number in interrupted and params is not None:
            ostudy.enqueue_trial(params, user_attrs={"retry_of": t.number})
            log.warning("trial %d was failed without its retry; retrying its parameters", t.number)


def _on_stale(
    ctx: StudySession, ostudy: optuna.Study, t: optuna.trial.FrozenTrial, grace: int
) -> None:
    """Optuna failed a RUNNING trial whose worker stopped beating: record why, retry it."""
    reason = f"worker lost: no heartbeat for more than {grace} s"
    _mark_interrupted(ctx, t, reason)
    ostudy.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
    log.warning("trial %d: %s; retrying its parameters", t.number, reason)


def _mark_interrupted(ctx: StudySession, t: optuna.trial.FrozenTrial, reason: str) -> None:
    """mlrc's row of trial ``t`` as interrupted with ``reason``, and its search folds still
    marked running (by its dead or stopped process) too: they resume from ``last.pt``."""
    params = {**ctx.resolved.fixed, **t.params}
    if set(ctx.resolved.space) <= set(t.params):  # its folds exist only once all are drawn
        trials.end_running_folds(
            ctx.engine, ctx.study_id, "search", params_hash(params), "interrupted", reason
        )
    trials.mark_trial(
        ctx.engine,
        ctx.study_id,
        t.number,
        params,
        params_hash(params),
        "interrupted",
        reason,
        what=f"recording trial {t.number} as interrupted",
    )


def recover_interrupted(
    ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int
) -> None:
    """Trials left RUNNING by a dead process: fail them ("interrupted") and retry their params."""
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        retry_interrupted(ctx, ostudy, storage, study_id, t)
        log.warning("trial %d was interrupted; retrying its parameters", t.number)


def retry_interrupted(
    ctx: StudySession,
    ostudy: optuna.Study,
    storage: Any,
    study_id: int,
    t: optuna.trial.FrozenTrial,
    reason: str = "interrupted",
) -> None:
    """Record the RUNNING trial ``t`` as interrupted (``reason``: how, e.g. a lost rank):
    retried, not counted. Idempotent, and in an order that a kill at any step leaves
    repairable — mlrc's row, the retry (enqueued once), then Optuna's FAIL: until that last
    write the trial is still RUNNING and the next run redoes it."""
    _mark_interrupted(ctx, t, reason)
    params = _retry_params(ctx, t)
    retried = any(o.user_attrs.get("retry_of") == t.number for o in ostudy.get_trials(False))
    if params is not None and not retried:
        ostudy.enqueue_trial(params, user_attrs={"retry_of": t.number})
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
    storage.set_trial_user_attr(trial_id, "reason", reason)
    storage.set_trial_state_values(trial_id, TrialState.FAIL)


def _retry_params(ctx: StudySession, t: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
    """What to retry ``t`` with: all its parameters once drawn, else those it was enqueued with,
    else nothing — killed while its parameters were being drawn, it is drawn again by the next
    trial from the same per-position sampler seed (see :func:`mlrc.search.backends.local`)."""
    if set(ctx.resolved.space) <= set(t.params):
        return dict(t.params)
    fixed = t.system_attrs.get("fixed_params")
    return dict(fixed) if fixed else None
