"""The Ray backend: Ray Tune places the trials, Optuna's sampler proposes them.

The searcher is Ray's ``OptunaSearch`` on the same RDB study as the local backend and the
worker pool (``storage=`` our Optuna storage, ``study_name=`` the study), so trials, fold runs,
epochs and reports end up in the same tables. Each Ray trial trains the folds of one Optuna trial
(in sequence, or with ``fold_parallel`` as parallel Ray tasks splitting the trial's CPUs/GPUs)
and reports the running mean validation MAP@R after every fold, so a Tune scheduler (ASHA,
median stopping) can stop a poor trial early: such a trial is recorded as PRUNED (state
``pruned`` in mlrc's table). Without a scheduler nothing is pruned, as in the protocol.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

from mlrc import store
from mlrc.config import ResolvedStudy
from mlrc.config.identity import params_hash
from mlrc.errors import stops_raise_at_once
from mlrc.search.ax_sampler import SEM_ATTR
from mlrc.search.backends.ray_train import ray_train_fold
from mlrc.search.errors import INTERRUPTED, Interrupted, StudyError, ending, failure_reason
from mlrc.search.folds import run_fold
from mlrc.search.heartbeat import (
    HEARTBEAT_S,
    TrialHeartbeat,
    fail_stale_trials,
    heartbeat_storage,
    recover_interrupted,
    retry_interrupted,
)
from mlrc.search.objective import run_objective, sequential_folds
from mlrc.search.optuna_setup import finished, optuna_study
from mlrc.search.session import StudySession, build_session
from mlrc.search.space import sampler as make_sampler
from mlrc.search.space import suggest
from mlrc.search.warm_start import enqueue_warm_start
from mlrc.store import trials
from mlrc.train import FoldResult

log = logging.getLogger("mlrc")
DRIVER_CPU = 0.01  # with --fold-parallel: the trial's own process, which only waits on its folds
NUMBER = "mlrc_trial_number"  # config key carrying the Optuna trial number into the trainable


@dataclass(frozen=True)
class Job:
    """What a Ray process needs to rebuild the study's context (picklable)."""

    resolved: ResolvedStudy
    url: str
    artifacts: str
    device: str
    fold_parallel: bool
    cpus_per_fold: float
    gpus_per_fold: float
    heartbeat_s: int
    procs: int = 1  # ranks per fold: Ray Train workers (mlrc.search.backends.ray_train)

    def context(self) -> StudySession:
        """Built once per Ray process (actors are reused across trials): dataset loaded once.
        With ``procs`` K > 1 each fold is a Ray Train run of K workers (one GPU each, or
        ``cpus_per_fold`` CPUs each on the CPU) that Ray places."""
        key = (self.resolved.study.name, self.url, self.artifacts, self.device, self.procs)
        if key not in _CONTEXTS:
            ctx = build_session(  # the driver recorded any change of budget
                self.resolved,
                self.url,
                self.artifacts,
                self.device,
                progress=False,
                budgets_used=(),
                procs=self.procs,
            )
            if self.procs > 1:  # placed by Ray, not by this process's devices
                ctx.devices = (self.device,) * self.procs
                ctx.launcher = partial(
                    ray_train_fold,
                    use_gpu=self.device == "cuda",
                    cpus_per_rank=self.cpus_per_fold,
                )
            _CONTEXTS[key] = ctx
        return _CONTEXTS[key]


_CONTEXTS: dict[tuple, StudySession] = {}


@functools.cache
def _storage(url: str, heartbeat_s: int) -> Any:
    return store.optuna_storage(url, heartbeat_interval=heartbeat_s)


class _Searcher(OptunaSearch):
    """OptunaSearch that records a scheduler-stopped trial as PRUNED (its last report was not
    the final mean over all folds) and a trial that reported a failure as FAIL."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        if result is not None and result.get("failed"):
            result, error = None, True
        elif result is not None and not result.get("final"):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is not None and result.get("folds_done"):  # the stopping result itself
                ot_trial.report(result["map_at_r"], int(result["folds_done"]))
            result = None  # Optuna: no value and no error → PRUNED
        super().on_trial_complete(trial_id, result, error)


@dataclass(frozen=True)
class _DefineByRun:
    """Draws the study's space (picklable: Tune checkpoints the searcher)."""

    space: dict[str, Any]

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        suggest(trial, self.space)
        return {NUMBER: trial.number}


def _searcher(job: Job, storage: Any) -> _Searcher:
    r = job.resolved
    return _Searcher(
        space=_DefineByRun(r.space),
        metric="map_at_r",
        mode="max",
        sampler=make_sampler(r.sampler, r.study.search.seed, r.space),
        study_name=r.study.name,
        storage=storage,
    )


def _trainable(config: dict[str, Any], job: Job) -> None:
    """One Optuna trial as one Ray trial: its folds, a report after each."""
    from ray import tune

    number = int(config[NUMBER])
    params = {k: v for k, v in config.items() if k != NUMBER}
    if job.device == "cuda" and job.procs == 1 and not _cuda():  # K ranks: Ray Train's GPUs
        raise StudyError("--gpus-per-trial > 0 but this Ray worker sees no CUDA device")
    ctx = job.context()
    storage = _storage(ctx.url, job.heartbeat_s)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(ctx.name), number
    )
    storage.set_trial_user_attr(trial_id, "worker", f"ray:{os.uname().nodename}:{os.getpid()}")
    n = len(ctx.split.folds)

    def on_fold(k: int, running: float) -> None:
        tune.report({"map_at_r": running, "folds_done": k, "final": False})

    folds = _parallel_folds(job) if job.fold_parallel else sequential_folds
    with TrialHeartbeat(storage, trial_id, job.heartbeat_s):
        try:
            value, reason, sem = run_objective(ctx, number, params, on_fold=on_fold, folds=folds)
        except Exception as e:
            how, reason = ending(e)  # run_objective recorded mlrc's row and folds
            if how != "failed":  # a signal or a lost database: interrupted, see _record_outcomes
                raise
            value, sem = None, None
    if reason is not None:
        storage.set_trial_user_attr(trial_id, "reason", reason)
    if value is not None and sem is not None:  # the fold SEM, read by ``sampler: ax``
        storage.set_trial_user_attr(trial_id, SEM_ATTR, sem)
    if value is None:
        tune.report({"map_at_r": 0.0, "folds_done": n, "final": True, "failed": reason})
    else:  # with a reason: scored 0 for a non-finite loss, an observation like any other
        tune.report({"map_at_r": value, "folds_done": n, "final": True})


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _fold_task(job: Job, params: dict[str, Any], fold: int, number: int) -> FoldResult:
    ctx = job.context()
    return run_fold(ctx, "search", params, 0, fold, number)


def _parallel_folds(job: Job):
    """A fold runner that trains the folds of a trial as parallel Ray tasks."""
    import ray

    def folds(
        ctx: StudySession, params: dict[str, Any], number: int
    ) -> Iterator[tuple[int, FoldResult]]:
        task = ray.remote(_fold_task).options(
            num_cpus=job.cpus_per_fold, num_gpus=job.gpus_per_fold, max_retries=0
        )
        pending = {task.remote(job, params, f.index, number): f.index for f in ctx.split.folds}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                yield pending.pop(done[0]), ray.get(done[0])
        finally:
            for ref in pending:  # a failed fold ends the trial: stop its siblings
                ray.cancel(ref, force=True)

    return folds


def scheduler_named(name: str, n_folds: int) -> Any:
    """``none`` (the protocol), ``asha`` or ``median``: Tune schedulers on the running mean
    validation MAP@R, whose time unit is folds finished. Pruning is a departure from MLRC."""
    from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule

    if name == "none":
        return None
    if name == "asha":
        return ASHAScheduler(
            metric="map_at_r", mode="max", time_attr="folds_done", max_t=n_folds, grace_period=1
        )
    if name == "median":
        return MedianStoppingRule(
            metric="map_at_r", mode="max", time_attr="folds_done", grace_period=1
        )
    raise StudyError(f"unknown scheduler {name!r} (none, asha or median)")


def run_search_ray(
    ctx: StudySession,
    address: str | None = None,
    max_concurrent: int = 1,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    fold_parallel: bool = False,
    scheduler: Any = None,
    heartbeat_s: int = HEARTBEAT_S,
) -> optuna.Study:
    """Run the study's remaining trials on Ray (``address``: None starts a local Ray, "auto"
    joins the running cluster, HOST:PORT a given one). ``scheduler``: a Ray Tune scheduler
    (e.g. ``ASHAScheduler(metric="map_at_r", mode="max", max_t=folds, grace_period=1)``; its
    time unit is folds finished) or None (the protocol: no early stopping)."""
    if max_concurrent < 1 or cpus_per_trial <= DRIVER_CPU or gpus_per_trial < 0:
        raise StudyError("--max-concurrent ≥ 1, --cpus-per-trial > 0.01, --gpus-per-trial ≥ 0")
    r = ctx.resolved
    if r.pruner != "none" or r.stop is not None:  # Tune runs the trials: its schedulers prune
        raise StudyError(
            f"search.pruner {r.pruner}{' and search.stop' if r.stop else ''} run with the local "
            "backend and pools (mlrc worker); with --backend ray prune with --scheduler asha or "
            "median"
        )
    storage = store.optuna_storage(ctx.url)  # the searcher's: Tune pickles it with the searcher
    ostudy = optuna_study(ctx, storage)
    study_id = storage.get_study_id_from_name(ctx.name)
    with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
        if ctx.engine.dialect.name == "sqlite":  # the file lock proves no other process runs
            recover_interrupted(ctx, ostudy, storage, study_id)
        else:
            _fail_stale(ctx, 4 * heartbeat_s, heartbeat_s)
        enqueue_warm_start(ctx, ostudy)  # Ray's searcher asks Optuna: they come first
    procs = _ranks_per_trial(ctx, gpus_per_trial, fold_parallel)
    remaining = ctx.resolved.trials - len(finished(ostudy))
    if remaining <= 0:
        return ostudy
    n = len(ctx.split.folds)
    job = Job(
        ctx.resolved,
        store.absolute_url(ctx.url),
        str(ctx.artifacts.parent.resolve()),
        "cuda" if gpus_per_trial > 0 else ctx.device,
        fold_parallel,
        # per fold task, or per rank (the trial's driver keeps DRIVER_CPU of it), or per trial
        (cpus_per_trial - DRIVER_CPU) / (n if fold_parallel else procs)
        if fold_parallel or procs > 1
        else cpus_per_trial,
        gpus_per_trial / (n if fold_parallel else procs),  # per fold task, or per rank
        heartbeat_s,
        procs,
    )
    resources = _resources(job, n, cpus_per_trial, gpus_per_trial)
    tuner = partial(_tuner, ctx, job, storage, scheduler, max_concurrent, remaining, resources)
    try:
        results = _fit(ctx, address, tuner)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (the CLI's): the running trials
        raise _interrupted(ctx, ostudy, storage, study_id) from e
    _record_outcomes(ctx, ostudy, results, n)
    return ostudy


def _ranks_per_trial(ctx: StudySession, gpus_per_trial: float, fold_parallel: bool) -> int:
    """K, the ranks of each fold (``--procs-per-trial``): Ray Train workers, one GPU each with
    ``--gpus-per-trial K``. One line when Ray cannot place them."""
    k = max(1, len(ctx.devices))
    why = ranks_refusal(k, gpus_per_trial, fold_parallel)
    if why is not None:
        raise StudyError(why)
    return k


def ranks_refusal(k: int, gpus_per_trial: float, fold_parallel: bool) -> str | None:
    """Why Ray cannot place a trial whose folds train as ``k`` ranks with these options."""
    if k > 1 and fold_parallel:
        return f"--procs-per-trial {k}: a fold's ranks need the trial's resources; drop --fold-parallel"
    if k > 1 and gpus_per_trial and gpus_per_trial != k:
        return (
            f"--procs-per-trial {k} needs --gpus-per-trial {k} on Ray (one GPU per rank), "
            f"got {gpus_per_trial:g}"
        )
    return None


def _interrupted(
    ctx: StudySession, ostudy: optuna.Study, storage: Any, study_id: int
) -> Interrupted:
    """After Ctrl-C or SIGTERM stopped Tune (its trials' processes are gone with this driver's
    Ray session): the Ray trials of the study still RUNNING, with mlrc's row running, are
    recorded as interrupted now — retried, not counted — as the local backend does; the
    :class:`Interrupted` to raise names them. A failure to record is only logged (the next run
    recovers them)."""
    numbers = []
    try:
        with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}", stopping=True):
            for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                ours = str(t.user_attrs.get("worker", "")).startswith("ray:")  # not a pool's
                if ours and trials.trial_state(ctx.engine, ctx.study_id, t.number) == "running":
                    retry_interrupted(ctx, ostudy, storage, study_id, t)
                    numbers.append(t.number)
    except Exception as err:  # noqa: BLE001 — recovered by the next run; the signal goes on
        log.warning("Ray trials not recorded as interrupted now (%s)", store.db_error_line(err))
    if len(numbers) == 1:
        return Interrupted(numbers[0])
    return Interrupted(what=f"trials {', '.join(map(str, numbers))}" if numbers else None)


def _resources(job: Job, n_folds: int, cpus_per_trial: float, gpus_per_trial: float) -> Any:
    """What one Ray trial reserves: its CPUs/GPUs, or with ``fold_parallel`` a placement group
    whose bundle is split among its folds (the driver task is tiny)."""
    from ray import tune

    if job.fold_parallel:
        return tune.PlacementGroupFactory(
            [{"CPU": DRIVER_CPU}] + [{"CPU": job.cpus_per_fold, "GPU": job.gpus_per_fold}] * n_folds
        )
    if job.procs > 1:  # the trial is its driver; Ray Train reserves each fold's K workers
        return {"cpu": DRIVER_CPU, "gpu": 0}
    return {"cpu": cpus_per_trial, "gpu": gpus_per_trial}


def _tuner(
    ctx: StudySession,
    job: Job,
    storage: Any,
    scheduler: Any,
    max_concurrent: int,
    remaining: int,
    resources: Any,
) -> Any:
    """Ray Tune's tuner for the ``remaining`` trials, proposed by the study's Optuna sampler."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    return tune.Tuner(
        tune.with_resources(tune.with_parameters(_trainable, job=job), resources),
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(_searcher(job, storage), max_concurrent),
            scheduler=scheduler,
            num_samples=remaining,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=ctx.name,
            storage_path=str((ctx.artifacts / "ray").resolve()),
            verbose=1 if ctx.progress else 0,
        ),
    )


def _fit(ctx: StudySession, address: str | None, tuner: Callable[[], Any]) -> Any:
    """Run the tuner made by ``tuner()`` on Ray (started here, and shut down after,
    unless this process already joined one); returns Tune's results."""
    import ray

    # Ctrl-C raises KeyboardInterrupt here, as SIGTERM does (mlrc.cli.interrupts), instead of
    # Tune's handler, which would end the run as if it were complete and the trials pruned
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=ctx.progress,
            logging_level=logging.WARNING,
        )
    try:
        with stops_raise_at_once():  # Tune's loop has none of mlrc's safe points
            return tuner().fit()
    finally:
        if started_here:
            ray.shutdown()


def _fail_stale(ctx: StudySession, grace: int, heartbeat_s: int) -> None:
    """On a shared database: trials of a dead driver or pool worker (no heartbeat for
    ``grace`` seconds) are failed and their parameters retried."""
    storage = heartbeat_storage(ctx, heartbeat_s, grace)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ostudy = optuna.load_study(study_name=ctx.name, storage=storage)
    fail_stale_trials(ostudy)


def _record_outcomes(ctx: StudySession, ostudy: optuna.Study, results: Any, n_folds: int) -> None:
    """Mirror what Ray decided into mlrc's trial table, by the one rule (:func:`ending`):
    PRUNED trials; a trial that failed before its folds began (mlrc has no row of it: its
    context could not be built, no CUDA device, …) as failed with Ray's error line; a trial
    left running in mlrc's table (its process was stopped, lost, or lost the database) as
    interrupted, retried with the same parameters by the next run."""
    errors = {}
    for res in results:
        number = (res.config or {}).get(NUMBER)
        if number is not None and res.error is not None:
            errors[int(number)] = _error_line(res.error)
    retried = {t.user_attrs.get("retry_of") for t in ostudy.get_trials(deepcopy=False)}
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.PRUNED, TrialState.FAIL)):
        state = trials.trial_state(ctx.engine, ctx.study_id, t.number)
        if t.state == TrialState.PRUNED and state != "pruned":
            done = max(t.intermediate_values, default=0)
            reason = f"stopped by the scheduler after {done} of {n_folds} folds"
            _record(ctx, t, "pruned", reason)
        elif t.state == TrialState.FAIL and state is None:
            _record(ctx, t, "failed", errors.get(t.number, "the Ray trial failed"))
        elif t.state == TrialState.FAIL and state == "running":
            _record(ctx, t, INTERRUPTED, INTERRUPTED)
            if t.number not in retried and set(ctx.resolved.space) <= set(t.params):
                ostudy.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})


def _error_line(error: BaseException) -> str:
    """The one line of a Ray trial's error: the original exception's (:func:`failure_reason`)
    when Ray kept it, else the last line of Ray's text."""
    cause = getattr(error, "cause", None) or error.__cause__
    if isinstance(cause, Exception) and not isinstance(cause, type(error)):
        return failure_reason(cause)
    return str(error).strip().splitlines()[-1][:500]


def _record(ctx: StudySession, t: optuna.trial.FrozenTrial, state: str, reason: str) -> None:
    params = {**ctx.resolved.fixed, **t.params}
    if state == INTERRUPTED:  # its running folds resume from last.pt
        trials.end_running_folds(
            ctx.engine, ctx.study_id, "search", params_hash(params), state, reason
        )
    trials.mark_trial(
        ctx.engine, ctx.study_id, t.number, params, params_hash(params), state, reason
    )
    ctx.tracker.trial_finished(t.number, state, None, None, reason)
