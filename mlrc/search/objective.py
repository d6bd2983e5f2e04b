"""The objective of a trial: its folds, trained in turn (or by a backend's fold runner), whose
mean validation MAP@R is the trial's value; optional pruning after each fold. A trial that
raises ends by the one rule of :func:`mlrc.search.errors.ending`: interrupted (a signal; a lost
database is left to whoever comes next) or failed with the one-line error as its reason."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import optuna

from mlrc import store
from mlrc.config.identity import params_hash
from mlrc.search import retention
from mlrc.search.errors import INTERRUPTED, ending
from mlrc.search.folds import run_fold
from mlrc.search.pruning import fold_reports, pruned_reason
from mlrc.search.session import StudySession
from mlrc.store import trials
from mlrc.train import FoldResult

log = logging.getLogger("mlrc")
PRUNED = "pruned"  # reasons of pruned trials start with it

ShouldPrune = Callable[[int, dict[int, float]], bool]


class Outcome(NamedTuple):
    """How a trial's folds ended: mean validation MAP@R (None: failed), the reason of a failure
    or a non-finite fold, and the SEM of the fold values (None with one fold or none)."""

    value: float | None
    reason: str | None
    sem: float | None


FoldRunner = Callable[["StudySession", dict[str, Any], int], Iterator[tuple[int, FoldResult]]]


def sequential_folds(
    ctx: StudySession, params: dict[str, Any], number: int
) -> Iterator[tuple[int, FoldResult]]:
    """The folds of trial ``number`` one after another, as (fold index, result)."""
    for fold in ctx.split.folds:
        yield fold.index, run_fold(ctx, "search", params, 0, fold.index, number)


def run_objective(
    ctx: StudySession,
    number: int,
    suggested: dict[str, Any],
    on_fold: Callable[[int, float], None] | None = None,
    folds: FoldRunner = sequential_folds,
    should_prune: ShouldPrune | None = None,
) -> Outcome:
    """Train the folds of one trial; (mean val MAP@R, None, fold SEM), (None, failure reason,
    None), or — a fold whose loss or embeddings went non-finite — (0.0, reason, 0.0): as in the
    reference harness, whose trial then returns (mean 0, SEM 0) to the optimiser, so the sampler
    learns to avoid the region (a FAILED trial would be ignored by GP and TPE). The trial stops
    at that fold. The SEM (None with one fold) is what ``sampler: ax`` gives Ax as the noise.
    ``on_fold(k, running mean)`` is called as the k-th fold finishes (in completion order);
    ``should_prune(fold, values)`` (:func:`pruning`) returning True after a fold that is not the
    last stops the trial, and so does a fold that ``search.stop`` ended early (status "stopped",
    its best so far told to the pruner only): it is recorded as pruned
    and ``optuna.TrialPruned`` is raised with the reason. Any other exception goes on, the
    trial and its running fold recorded first as :func:`end_on_error` says (the backend tells
    Optuna)."""
    params = {**ctx.resolved.fixed, **suggested}
    trials.start_trial(ctx.engine, ctx.study_id, number, params, params_hash(params))
    ctx.tracker.trial_started(number, params)
    try:
        return _folds_of_trial(ctx, number, params, on_fold, folds, should_prune)
    except optuna.TrialPruned:
        raise
    except BaseException as e:
        end_on_error(ctx, number, params, e)
        raise


def _folds_of_trial(
    ctx: StudySession,
    number: int,
    params: dict[str, Any],
    on_fold: Callable[[int, float], None] | None,
    folds: FoldRunner,
    should_prune: ShouldPrune | None,
) -> Outcome:
    """The body of :func:`run_objective`: the folds in turn, the trial's outcome recorded."""
    values: dict[int, float] = {}
    n_folds = len(ctx.split.folds)
    for fold, res in folds(ctx, params, number):
        ctx.tracker.fold_finished(number, fold, res)
        if res.status == "stopped":  # search.stop: its best so far decides the pruning only
            values[fold] = res.objective
            if should_prune is not None:
                should_prune(fold, values)
            _prune(ctx, number, f"{PRUNED}: {res.reason}")
        if res.nonfinite:  # "non-finite loss at iteration i, fold f" (store.NONFINITE)
            reason = f"{res.reason}, fold {fold}"
            finish_trial(ctx, number, "complete", 0.0, 0.0, reason)
            return Outcome(0.0, reason, 0.0)
        if res.status != "complete":
            reason = f"fold {fold}: {res.reason}"
            finish_trial(ctx, number, "failed", None, None, reason)
            return Outcome(None, reason, None)
        values[fold] = res.objective
        k, running = len(values), float(np.mean(list(values.values())))
        if on_fold is not None and k < n_folds:
            on_fold(k, running)
        if should_prune is not None and should_prune(fold, values) and k < n_folds:
            r = ctx.resolved
            _prune(ctx, number, pruned_reason(r.pruner, r, k, n_folds, running))
    v = [values[f] for f in sorted(values)]
    mean = float(np.mean(v))
    # one fold (the traditional preset) has no spread to speak of: no SEM, rather than NaN
    sem = float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None
    finish_trial(ctx, number, "complete", mean, sem, None)
    return Outcome(mean, None, sem)


def end_on_error(ctx: StudySession, number: int, params: dict[str, Any], e: BaseException) -> str:
    """Record how trial ``number`` ends on the exception ``e`` (:func:`ending`): its running
    search folds end as interrupted (a signal) or failed with the reason (the one-line error),
    and so does mlrc's row of a failed trial (an interrupted one is recorded with its retry,
    :func:`mlrc.search.heartbeat.retry_interrupted`); a lost database records nothing. Returns
    how it ended. A failure to record is only logged: ``e`` is what the caller raises."""
    how, reason = ending(e)
    if how == "lost":
        return how
    try:
        trials.end_running_folds(
            ctx.engine, ctx.study_id, "search", params_hash(params), how, reason or INTERRUPTED
        )
        if how == "failed":
            finish_trial(ctx, number, "failed", None, None, reason)
    except Exception as err:  # noqa: BLE001 — the next run recovers it; ``e`` goes on
        log.warning(
            "trial %d not recorded as %s now (%s); it is recovered later",
            number,
            how,
            store.db_error_line(err),
        )
    return how


def _prune(ctx: StudySession, number: int, reason: str) -> None:
    """Record trial ``number`` as pruned (``reason`` starts with "pruned") and raise
    ``optuna.TrialPruned``."""
    finish_trial(ctx, number, "pruned", None, None, reason)
    raise optuna.TrialPruned(reason)


def finish_trial(
    ctx: StudySession,
    number: int,
    state: str,
    value: float | None,
    sem: float | None,
    reason: str | None,
) -> None:
    """Record in mlrc's table how trial ``number`` ended (state, value, SEM, reason)."""
    trials.finish_trial(ctx.engine, ctx.study_id, number, state, value, sem, reason)
    retention.collect(ctx)  # a trial that is not (or no longer) the best drops its best.pt
    ctx.tracker.trial_finished(number, state, value, sem, reason)


def pruning(ctx: StudySession, trial: optuna.Trial) -> ShouldPrune | None:
    """``should_prune(fold, values)`` for :func:`run_objective` (``values``: fold → value of the
    trial's folds done, ``fold`` the new one): reports to the trial's pruner what
    :func:`~mlrc.search.pruning.fold_reports` says and asks it; None when pruning is off."""
    pruner = ctx.resolved.pruner
    if pruner == "none":
        return None
    order: list[int] = []

    def should_prune(fold: int, values: dict[int, float]) -> bool:
        order.append(fold)
        if pruner == "median" and len(order) >= len(ctx.split.folds):
            return False  # median: the running means after folds 1..n−1, as before
        for step, value in fold_reports(pruner, order, values):
            trial.report(value, step=step)
        return trial.should_prune()

    return should_prune
