"""A study end to end on one machine: Bayesian search over 4-fold CV, then the test stage.

Knows nothing of the loss it tunes: it draws parameters from the resolved search space and hands
them to the fold trainer. The Optuna study lives in the same database as mlrc's tables, under the
study's name. Re-running resumes: finished trials are kept, a trial left RUNNING by a dead process
is failed with the reason "interrupted" and re-enqueued with the same parameters, whose finished
folds are reused (``fold_run`` is keyed by a hash of the parameters) and whose interrupted fold
resumes from its ``last.pt``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from filelock import FileLock, Timeout
from optuna.trial import TrialState
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from mlrc import __version__, data, store
from mlrc.config import LOSS_LR, ResolvedStudy
from mlrc.data.base import ImageDataset
from mlrc.data.transforms import eval_transform
from mlrc.methods import miners, strategies
from mlrc.protocol import concatenate_embeddings, mlrc_split, retrieval_metrics
from mlrc.protocol.analysis import analysis_metrics, metrix_utilization
from mlrc.protocol.splits import Split
from mlrc.search.space import sampler as make_sampler
from mlrc.search.space import suggest
from mlrc.store import EpochMetric, FoldRun, TestResult, Trial, session, upsert
from mlrc.train.fold import (
    UNTRAINED_SEED,
    CheckpointError,
    EpochRecord,
    FoldResult,
    FoldSpec,
    View,
    embed,
    load_model,
    train_fold,
    untrained_trunk,
)

log = logging.getLogger("mlrc")
optuna.logging.set_verbosity(optuna.logging.WARNING)
# We run Optuna's heartbeat ourselves around ask/tell (see TrialHeartbeat): its notes are expected.
warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used", UserWarning)
warnings.filterwarnings("ignore", ".*heartbeat.*", optuna.exceptions.ExperimentalWarning)


class StudyError(RuntimeError):
    """The study cannot run as asked (locked, changed config, no complete trial, ...)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the search; ``trial``: the trial recorded as interrupted."""

    def __init__(self, trial: int | None = None) -> None:
        super().__init__("interrupted" if trial is None else f"trial {trial} interrupted")
        self.trial = trial


@dataclass
class Context:
    """Everything a running study needs, built once."""

    resolved: ResolvedStudy
    url: str
    engine: Engine
    artifacts: Path
    device: str
    dataset: ImageDataset
    split: Split
    study_id: int
    progress: bool = True

    @property
    def name(self) -> str:
        return self.resolved.study.name


def params_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(store.canonical_json(params).encode()).hexdigest()[:16]


def protocol_of(r: ResolvedStudy) -> dict[str, Any]:
    """What defines a fold's numbers besides its parameters, fold, reproduction and seed: the
    dataset, the loss/miner/strategy/batch sampler *names* (their values are the parameters),
    the study seed, and the resolved preset without its budgets (``search``, ``test``: trials
    and reproductions add work, they do not change a fold) and without the runtime-only fields
    (speed, not numbers). The search space, enqueued points, BO sampler and pruner decide which
    parameters are tried, not what a fold with given parameters computes."""
    fp = r.fingerprint()
    study, preset = fp["study"], dict(fp["preset"])
    for budget in ("search", "test"):
        preset.pop(budget, None)
    return {
        "dataset": study["dataset"],
        "loss": study["loss"]["name"],
        "miner": (study.get("miner") or {}).get("name"),
        "strategy": (study.get("strategy") or {}).get("name"),
        "sampler": study["sampler"],
        "seed": study["search"]["seed"],
        "preset": preset,
    }


def protocol_key(r: ResolvedStudy) -> str:
    """A short hash of :func:`protocol_of`: the artifact folder level that keeps checkpoints of
    different configurations apart (a new store never adopts another configuration's folds)."""
    return hashlib.sha256(store.canonical_json(protocol_of(r)).encode()).hexdigest()[:12]


def fold_dir(ctx: Context, kind: str, h: str, reproduction: int, fold: int) -> Path:
    """``<artifacts>/<study>/p-<protocol key>/<kind>/<params hash>/[rep<N>/]fold<k>``."""
    rep = f"rep{reproduction}" if kind == "test" else ""
    return ctx.artifacts / f"p-{protocol_key(ctx.resolved)}" / kind / h / rep / f"fold{fold}"


@functools.cache
def code_version() -> str:
    """mlrc's version, with the git commit when running from a checkout (``0.1.0+g1a2b3c4``,
    ``-dirty`` when it has uncommitted changes): recorded with every result it computes."""
    import subprocess

    here = Path(__file__).resolve().parents[2]
    if not (here / ".git").exists():  # an installed package: its version says it
        return __version__
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{out}" if out else __version__


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from the study seed and the job's identity (stable across runs)."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


# --- opening a study ---------------------------------------------------------------------------


@contextmanager
def open_study(
    resolved: ResolvedStudy,
    url: str,
    artifacts: str | Path,
    device: str = "cpu",
    progress: bool = True,
    force_new: bool = False,
) -> Iterator[Context]:
    """Connect, register (or check) the study, load the dataset; hold a lock for SQLite.
    ``force_new``: a stored study of the same name with another configuration is archived
    (:func:`archive_study`) and this one starts afresh; otherwise that is refused."""
    engine = store.connect(url)
    with _sqlite_lock(engine, resolved.study.name):
        if force_new:
            old = store.transact(
                engine, lambda s: store.get_study(s, resolved.study.name), "reading the study"
            )
            if old is not None and store.canonical_json(old.config) != store.canonical_json(
                resolved.fingerprint()
            ):
                new_name = archive_study(engine, resolved.study.name, Path(artifacts))
                log.warning("the stored study %r was archived as %r", resolved.study.name, new_name)
        ctx = build_context(resolved, url, artifacts, device, progress, engine)
        for warning in data.check_dataset(ctx.dataset, ctx.split.trainval_classes):
            log.warning("%s", warning)  # one-image training classes, duplicate files
        yield ctx


def build_context(
    resolved: ResolvedStudy,
    url: str,
    artifacts: str | Path,
    device: str = "cpu",
    progress: bool = True,
    engine: Engine | None = None,
) -> Context:
    """Register (or check) the study and load its dataset and split, without any lock (for a
    process that works for a study someone else holds: a Ray trial or fold task)."""
    engine = engine or store.connect(url)
    study_id = register_study(engine, resolved)
    ds = data.build(
        resolved.study.dataset.name,
        root=resolved.study.dataset.root,
        **resolved.study.dataset.params,
    )
    split = mlrc_split(
        ds.labels, n_folds=resolved.preset.folds, scheme=resolved.preset.split_scheme
    )
    return Context(
        resolved,
        url,
        engine,
        Path(artifacts) / resolved.study.name,
        device,
        ds,
        split,
        study_id,
        progress,
    )


@contextmanager
def _sqlite_lock(engine: Engine, name: str) -> Iterator[None]:
    """One process per study on a SQLite file: a second one is refused, never interleaved."""
    database = store.sqlite_path(engine)
    if database is None:
        yield
        return
    path = Path(f"{database}.{name}.lock")
    if not path.parent.is_dir():  # filelock would create it
        raise StudyError(f"{path}: cannot create the study's lock file (No such file or directory)")

    def write_pid(fd: int) -> None:  # the holder's pid, for the message a second process gets
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)

    lock = FileLock(
        path,
        blocking=False,
        thread_local=False,
        preserve_lock_file=True,
        fallback_to_soft=False,  # a kernel lock, released when the process dies, or none
        on_acquired=write_pid,
    )
    try:
        lock.acquire()
    except Timeout:  # before OSError: filelock's Timeout is a TimeoutError
        try:
            pid = path.read_text().strip() or "?"
        except OSError:
            pid = "?"
        raise StudyError(
            f"study {name!r} is already running on {engine.url.database} (pid {pid}); SQLite "
            "allows one process per study — use a PostgreSQL URL for parallel workers"
        ) from None
    except OSError as e:
        raise StudyError(f"{path}: cannot create the study's lock file ({e.strerror})") from None
    try:
        yield
    finally:
        lock.release()


def register_study(engine: Engine, resolved: ResolvedStudy) -> int:
    config = resolved.fingerprint()
    with store.advisory_lock(engine, "mlrc-register"), session(engine) as s:
        row = store.get_study(s, resolved.study.name)
        if row is None:
            row = store.Study(
                name=resolved.study.name,
                dataset=resolved.study.dataset.name,
                loss=resolved.study.loss.name,
                strategy=resolved.study.strategy.name if resolved.study.strategy else None,
                preset=resolved.study.preset,
                config=config,
                code_version=__version__,
            )
            s.add(row)
            s.flush()
        elif store.canonical_json(row.config) != store.canonical_json(config):
            changed = first_difference(row.config, config)
            raise StudyError(
                f"study {resolved.study.name!r} already exists in the store with a different "
                f"configuration ({changed}); give the study a new name, or pass --force-new to "
                "archive the stored one as NAME.old-K and start afresh"
            )
        return row.id


def archive_study(engine: Engine, name: str, artifacts: Path) -> str:
    """Rename a stored study, its Optuna study and its artifact directory to ``NAME.old-K``
    (the first free K) and point its checkpoint paths there; nothing is deleted."""
    from sqlalchemy import inspect, text, update

    with store.advisory_lock(engine, "mlrc-register"), session(engine) as s:
        taken = set(
            s.scalars(select(store.Study.name).where(store.Study.name.like(f"{name}.old-%")))
        )
        new = next(f"{name}.old-{k}" for k in range(1, 10_000) if f"{name}.old-{k}" not in taken)
        row = store.get_study(s, name)
        row.name = new
        if "studies" in inspect(s.connection()).get_table_names():  # Optuna's tables
            s.execute(
                text("UPDATE studies SET study_name = :new WHERE study_name = :old"),
                {"new": new, "old": name},
            )
        src, dst = artifacts / name, artifacts / new
        if src.exists():
            s.execute(
                update(FoldRun)
                .where(FoldRun.study_id == row.id, FoldRun.checkpoint.like(f"{src}/%"))
                .values(checkpoint=func.replace(FoldRun.checkpoint, f"{src}/", f"{dst}/"))
            )
            s.flush()
            os.replace(src, dst)  # last: a failure before it rolls the rows back
    return new


def first_difference(a: Any, b: Any, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{where}.{k}" if where else k)
    return f"{where}: {a!r} in the store, {b!r} now"


HEARTBEAT_S = 30  # default heartbeat interval of a running trial (seconds)


def optuna_study(ctx: Context, storage: Any = None) -> optuna.Study:
    r = ctx.resolved
    return store.retry(
        lambda: optuna.create_study(
            study_name=ctx.name,
            storage=storage or ctx.url,
            direction="maximize",
            load_if_exists=True,
            sampler=make_sampler(r.sampler, r.study.search.seed),
            pruner=make_pruner(r),
        ),
        ctx.engine,
        "opening the Optuna study",
    )


def make_pruner(r: ResolvedStudy) -> optuna.pruners.BasePruner:
    """Opt-in pruning (``search.pruner: median``): after fold k, a trial whose running mean of
    fold MAP@R is below the median of the complete trials' running means after fold k stops
    (recorded as PRUNED); nothing is pruned before ``prune_startup`` trials are complete. The
    folds run in the same order in every trial, so step k compares like with like."""
    if r.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=r.prune_startup, n_warmup_steps=0)
    return optuna.pruners.NopPruner()


# --- search ------------------------------------------------------------------------------------


def finished(ostudy: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards the budget: complete, pruned (Ray scheduler), or failed for a
    reason of their own (a trial failed as "interrupted" or lost by a dead worker is retried,
    not counted)."""
    return [t for t in ostudy.get_trials(deepcopy=False) if _counts(t)]


def _counts(t: optuna.trial.FrozenTrial) -> bool:
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    reason = t.user_attrs.get("reason")
    return t.state == TrialState.FAIL and reason is not None and reason != "interrupted"


@dataclass
class _Claim:
    trial: optuna.Trial
    trial_id: int
    params: dict[str, Any]


def run_search(
    ctx: Context, heartbeat_s: int = HEARTBEAT_S, grace_s: int | None = None, poll_s: float = 5.0
) -> optuna.Study:
    """Run trials until ``trials`` of them have finished (complete or failed with a reason).

    One process (``mlrc study run``) or any number of workers (``mlrc worker``, PostgreSQL)
    run this same loop; they coordinate only through the database. Taking the next trial is
    serialised by an advisory lock, so the budget is global: a worker starts a trial only while
    finished + running < trials, and otherwise waits (``poll_s``) until the running ones end — a
    worker that dies leaves its trial without heartbeat; after ``grace_s`` (default 4 ×
    ``heartbeat_s``) another worker fails it and retries its parameters, reusing finished folds.
    """
    storage = heartbeat_storage(ctx, heartbeat_s, grace_s or 4 * heartbeat_s)
    ostudy = optuna_study(ctx, storage)
    study_id = store.retry(
        lambda: storage.get_study_id_from_name(ctx.name), ctx.engine, "reading the study"
    )
    with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
        if ctx.engine.dialect.name == "sqlite":  # the file lock proves no other process runs
            recover_interrupted(ctx, ostudy, storage, study_id)
        if not ostudy.user_attrs.get("enqueued"):
            _enqueue_once(ostudy, ctx.resolved.study.search.enqueue)
            ostudy.set_user_attr("enqueued", True)
    while True:
        claim = store.retry(
            lambda: _claim(ctx, ostudy, storage, study_id), ctx.engine, "taking the next trial"
        )
        if claim is None:
            return ostudy
        if claim == "wait":
            time.sleep(poll_s)
            continue
        with (
            TrialHeartbeat(storage, claim.trial_id, heartbeat_s),
            _interrupted_on_exit(ctx, ostudy, storage, study_id, claim),
        ):
            try:
                value, reason = run_objective(
                    ctx, claim.trial.number, claim.params, should_prune=_pruning(ctx, claim.trial)
                )
            except optuna.TrialPruned as e:
                value, reason = None, str(e)
                claim.trial.set_user_attr("reason", reason)
        _tell(ctx, ostudy, claim, value, reason)


def heartbeat_storage(ctx: Context, heartbeat_s: int, grace_s: int) -> Any:
    """Optuna storage whose stale trials (no heartbeat for ``grace_s``) are failed with the
    reason and retried with the same parameters (:func:`_on_stale`)."""
    return store.optuna_storage(
        ctx.url,
        heartbeat_interval=heartbeat_s,
        grace_period=grace_s,
        heartbeat_stale_trial_callback=lambda st, t: _on_stale(ctx, st, t, grace_s),
    )


def _claim(ctx: Context, ostudy: optuna.Study, storage: Any, study_id: int) -> _Claim | str | None:
    """Under the study's lock: fail stale trials, then ask for the next trial if the budget
    allows it (``None``: the search is done, ``"wait"``: all remaining slots are running)."""
    with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(ostudy)
        trials = ostudy.get_trials(deepcopy=False)
        done = sum(map(_counts, trials))
        running = sum(t.state == TrialState.RUNNING for t in trials)
        if done >= ctx.resolved.trials:
            return None
        if done + running >= ctx.resolved.trials:
            return "wait"
        # The k-th suggestion is drawn with a seed of its own, so an interrupted and resumed
        # study proposes the same sequence as an uninterrupted one (a resumed process would
        # otherwise restart the sampler's random stream and repeat earlier parameters).
        ostudy.sampler = make_sampler(
            ctx.resolved.sampler,
            derive_seed(ctx.resolved.study.search.seed, "sampler", done + running),
        )
        trial = ostudy.ask()
        params = suggest(trial, ctx.resolved.space)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.record_heartbeat(trial_id)  # before the lock is released: never RUNNING unseen
        return _Claim(trial, trial_id, params)


def _tell(
    ctx: Context, ostudy: optuna.Study, claim: _Claim, value: float | None, reason: str | None
) -> None:
    def tell() -> None:
        if value is not None:  # a reason beside a value: scored 0 for a non-finite loss
            if reason is not None:
                claim.trial.set_user_attr("reason", reason)
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
        # Another worker declared this trial lost (no heartbeat for the grace period, e.g. a
        # long network cut) and retries its parameters; the finished folds are reused there.
        log.warning("trial %d was declared lost while it ran: %s", claim.trial.number, e)
        finish_trial(ctx, claim.trial.number, "interrupted", None, None, "declared lost: retried")
        return
    if reason is not None and value is not None:
        log.warning("trial %d scored %g: %s", claim.trial.number, value, reason)
    elif reason is not None and reason.startswith(PRUNED):
        log.info("trial %d %s", claim.trial.number, reason)
    elif reason is not None:
        log.warning("trial %d failed: %s", claim.trial.number, reason)


PRUNED = "pruned"  # reasons of pruned trials start with it


def _pruning(ctx: Context, trial: optuna.Trial) -> Callable[[int, float], bool] | None:
    """``should_prune(k, running mean)`` for :func:`run_objective`, or None when pruning is off."""
    if ctx.resolved.pruner == "none":
        return None

    def should_prune(k: int, running: float) -> bool:
        trial.report(running, step=k)
        return trial.should_prune()

    return should_prune


class TrialHeartbeat:
    """Records the trial's heartbeat every ``interval`` seconds in a daemon thread; a lost
    database only logs a warning (the retrying connection comes back by itself)."""

    def __init__(self, storage: Any, trial_id: int, interval: float) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="mlrc-heartbeat")

    def _beat(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as e:  # noqa: BLE001 — keep beating; report in one line
                log.warning(
                    "heartbeat of trial id %d not recorded: %s",
                    self.trial_id,
                    store.db_error_line(e),
                )

    def __enter__(self) -> TrialHeartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def _on_stale(ctx: Context, ostudy: optuna.Study, t: optuna.trial.FrozenTrial, grace: int) -> None:
    """Optuna failed a RUNNING trial whose worker stopped beating: record why, retry it."""
    reason = f"worker lost: no heartbeat for more than {grace} s"
    _mark_interrupted(ctx, t, reason)
    ostudy.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
    log.warning("trial %d: %s; retrying its parameters", t.number, reason)


def _mark_interrupted(ctx: Context, t: optuna.trial.FrozenTrial, reason: str) -> None:
    store.transact(
        ctx.engine,
        lambda s: upsert(
            s,
            Trial,
            {"study_id": ctx.study_id, "number": t.number},
            params={**ctx.resolved.fixed, **t.params},
            params_hash=params_hash({**ctx.resolved.fixed, **t.params}),
            state="interrupted",
            value=None,
            sem=None,
            reason=reason,
        ),
        f"recording trial {t.number} as interrupted",
    )


def recover_interrupted(ctx: Context, ostudy: optuna.Study, storage: Any, study_id: int) -> None:
    """Trials left RUNNING by a dead process: fail them ("interrupted") and retry their params."""
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        _retry_interrupted(ctx, ostudy, storage, study_id, t)
        log.warning("trial %d was interrupted; retrying its parameters", t.number)


def _retry_interrupted(
    ctx: Context, ostudy: optuna.Study, storage: Any, study_id: int, t: optuna.trial.FrozenTrial
) -> None:
    """Record the RUNNING trial ``t`` as interrupted: retried, not counted. Idempotent, and in an
    order that a kill at any step leaves repairable — mlrc's row, the retry (enqueued once), then
    Optuna's FAIL: until that last write the trial is still RUNNING and the next run redoes it."""
    _mark_interrupted(ctx, t, "interrupted")
    params = _retry_params(ctx, t)
    retried = any(o.user_attrs.get("retry_of") == t.number for o in ostudy.get_trials(False))
    if params is not None and not retried:
        ostudy.enqueue_trial(params, user_attrs={"retry_of": t.number})
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
    storage.set_trial_user_attr(trial_id, "reason", "interrupted")
    storage.set_trial_state_values(trial_id, TrialState.FAIL)


def _retry_params(ctx: Context, t: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
    """What to retry ``t`` with: all its parameters once drawn, else those it was enqueued with,
    else nothing — killed while its parameters were being drawn, it is drawn again by the next
    trial from the same per-position sampler seed (see :func:`_claim`)."""
    if set(ctx.resolved.space) <= set(t.params):
        return dict(t.params)
    fixed = t.system_attrs.get("fixed_params")
    return dict(fixed) if fixed else None


def _enqueue_once(ostudy: optuna.Study, enqueue: list[dict[str, Any]]) -> None:
    """The study file's ``enqueue`` list, each entry once even if a kill interrupts the loop."""
    seen = {t.user_attrs.get("enqueue_index") for t in ostudy.get_trials(deepcopy=False)}
    for i, params in enumerate(enqueue):
        if i not in seen:
            ostudy.enqueue_trial(params, user_attrs={"enqueue_index": i})


@contextmanager
def _interrupted_on_exit(
    ctx: Context, ostudy: optuna.Study, storage: Any, study_id: int, claim: _Claim
) -> Iterator[None]:
    """A trial stopped by Ctrl-C, SIGTERM (the CLI turns it into KeyboardInterrupt) or an error
    that ends the process (disk full, unreadable image, ...) is recorded as interrupted at once —
    retried, not counted — and the exception goes on; KeyboardInterrupt becomes
    :class:`Interrupted`, naming the trial. A lost database is left to the next run."""
    try:
        yield
    except BaseException as e:
        if not isinstance(e, store.StoreError | DBAPIError):
            _record_interrupt(ctx, ostudy, storage, study_id, claim)
        # a Ctrl-C may surface as another error raised while it unwound (torch.save's
        # RuntimeError mid-checkpoint): still an interrupt, naming the trial
        stopped = e if isinstance(e, KeyboardInterrupt) else e.__context__
        if isinstance(stopped, KeyboardInterrupt) and not isinstance(e, Interrupted):
            raise Interrupted(claim.trial.number) from e
        raise


def _record_interrupt(
    ctx: Context, ostudy: optuna.Study, storage: Any, study_id: int, claim: _Claim
) -> None:
    """The claimed trial, if still RUNNING, as interrupted now (a failure here is only logged)."""
    try:
        with store.advisory_lock(ctx.engine, f"mlrc-study:{ctx.name}"):
            t = storage.get_trial(claim.trial_id)
            if t.state == TrialState.RUNNING:
                _retry_interrupted(ctx, ostudy, storage, study_id, t)
    except Exception as e:  # noqa: BLE001 — recovered later (next run / heartbeat); one line
        log.warning(
            "trial %d not recorded as interrupted now (%s); it is recovered later",
            claim.trial.number,
            store.db_error_line(e),
        )


FoldRunner = Callable[["Context", dict[str, Any], int], Iterator[tuple[int, FoldResult]]]


def sequential_folds(
    ctx: Context, params: dict[str, Any], number: int
) -> Iterator[tuple[int, FoldResult]]:
    """The folds of trial ``number`` one after another, as (fold index, result)."""
    for fold in ctx.split.folds:
        yield fold.index, run_fold(ctx, "search", params, 0, fold.index, number)


def run_objective(
    ctx: Context,
    number: int,
    suggested: dict[str, Any],
    on_fold: Callable[[int, float], None] | None = None,
    folds: FoldRunner = sequential_folds,
    should_prune: Callable[[int, float], bool] | None = None,
) -> tuple[float | None, str | None]:
    """Train the folds of one trial; (mean val MAP@R, None), (None, failure reason), or — a fold
    whose loss or embeddings went non-finite — (0.0, reason): as in the reference harness, whose
    trial then returns (mean 0, SEM 0) to the optimiser, so the sampler learns to avoid the
    region (a FAILED trial would be ignored by GP and TPE). The trial stops at that fold.
    ``on_fold(k, running mean)`` is called as the k-th fold finishes (in completion order);
    ``should_prune(k, running mean)`` returning True stops the trial: it is recorded as pruned
    and ``optuna.TrialPruned`` is raised with the reason."""
    params = {**ctx.resolved.fixed, **suggested}
    h = params_hash(params)
    store.transact(
        ctx.engine,
        lambda s: upsert(
            s,
            Trial,
            {"study_id": ctx.study_id, "number": number},
            params=params,
            params_hash=h,
            state="running",
            value=None,
            sem=None,
            reason=None,
        ),
        f"starting trial {number}",
    )
    values: dict[int, float] = {}
    for fold, res in folds(ctx, params, number):
        if res.nonfinite:  # "non-finite loss at iteration i, fold f" (store.NONFINITE)
            reason = f"{res.reason}, fold {fold}"
            finish_trial(ctx, number, "complete", 0.0, 0.0, reason)
            return 0.0, reason
        if res.status != "complete":
            reason = f"fold {fold}: {res.reason}"
            finish_trial(ctx, number, "failed", None, None, reason)
            return None, reason
        values[fold] = res.objective
        k, running = len(values), float(np.mean(list(values.values())))
        if on_fold is not None and k < len(ctx.split.folds):
            on_fold(k, running)
        if should_prune is not None and k < len(ctx.split.folds) and should_prune(k, running):
            reason = (
                f"{PRUNED} after {k} of {len(ctx.split.folds)} folds: running mean "
                f"{running:.4f} below the median of complete trials"
            )
            finish_trial(ctx, number, "pruned", None, None, reason)
            raise optuna.TrialPruned(reason)
    v = [values[f] for f in sorted(values)]
    mean = float(np.mean(v))
    sem = float(np.std(v, ddof=1) / math.sqrt(len(v)))
    finish_trial(ctx, number, "complete", mean, sem, None)
    return mean, None


def finish_trial(
    ctx: Context,
    number: int,
    state: str,
    value: float | None,
    sem: float | None,
    reason: str | None,
) -> None:
    store.transact(
        ctx.engine,
        lambda s: upsert(
            s,
            Trial,
            {"study_id": ctx.study_id, "number": number},
            state=state,
            value=value,
            sem=sem,
            reason=reason,
        ),
        f"recording trial {number}",
    )


def _prefixed(params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``{"miner.epsilon": 0.1, ...}`` → ``{"epsilon": 0.1}`` for one prefix."""
    return {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}


def run_fold(
    ctx: Context,
    kind: str,
    params: dict[str, Any],
    reproduction: int,
    fold: int,
    trial_number: int | None,
) -> FoldResult:
    """One fold of a trial (kind "search") or of a reproduction (kind "test"), idempotently."""
    h = params_hash(params)
    key = {
        "study_id": ctx.study_id,
        "kind": kind,
        "params_hash": h,
        "reproduction": reproduction,
        "fold": fold,
    }
    what = f"{kind} fold {fold} of {h}" + (
        f" (reproduction {reproduction})" if reproduction else ""
    )
    row = store.transact(
        ctx.engine,
        lambda s: s.execute(select(FoldRun).filter_by(**key)).scalar_one_or_none(),
        f"reading {what}",
    )
    if row is not None and row.status == "complete" and row.checkpoint:
        if Path(row.checkpoint).is_file():
            return FoldResult(
                "complete",
                None,
                row.best_epoch,
                {k: getattr(row, k) for k in store.METRIC_COLUMNS},
                checkpoint=row.checkpoint,
                wall_time_s=row.wall_time_s or 0.0,
                # rows before schema 3: epoch 0 was never best, so map_at_r is the objective
                objective=row.map_at_r if row.objective is None else row.objective,
                device=row.device,
                code_version=row.code_version,
            )
        log.warning("%s: checkpoint %s is missing; training it again", what, row.checkpoint)
    r = ctx.resolved
    seed = derive_seed(r.study.search.seed, kind, h, reproduction, fold)
    identity = {
        "protocol": protocol_key(r),
        "params": h,
        "kind": kind,
        "reproduction": reproduction,
        "fold": fold,
        "seed": seed,
    }
    fold_run_id = store.transact(
        ctx.engine,
        lambda s: (
            upsert(
                s,
                FoldRun,
                key,
                trial_number=trial_number,
                seed=seed,
                status="running",
                reason=None,
                device=ctx.device,  # this run's, until the result says who computed it
                code_version=code_version(),
            ).id
        ),
        f"starting {what}",
    )

    def record(rec: EpochRecord) -> None:
        store.transact(
            ctx.engine,
            lambda s: upsert(
                s,
                EpochMetric,
                {"fold_run_id": fold_run_id, "epoch": rec.epoch},
                train_loss=rec.train_loss,
                map_at_r=rec.map_at_r,
                precision_at_1=rec.precision_at_1,
                r_precision=rec.r_precision,
            ),
            f"recording epoch {rec.epoch} of {what}",
        )

    f = ctx.split.folds[fold]
    label = f"trial {trial_number}" if kind == "search" else f"reproduction {reproduction}"
    spec = FoldSpec(
        dataset=ctx.dataset,
        dataset_name=r.study.dataset.name,
        train_classes=f.train_classes,
        val_classes=f.val_classes,
        loss=r.study.loss.name,
        loss_params={
            k: v
            for k, v in params.items()
            if k != LOSS_LR and not k.startswith((miners.PREFIX, strategies.PREFIX))
        },
        miner=r.study.miner.name if r.study.miner else None,
        miner_params=_prefixed(params, miners.PREFIX),
        strategy=r.study.strategy.name if r.study.strategy else None,
        strategy_params=_prefixed(params, strategies.PREFIX),
        sampler=r.study.sampler.name,
        sampler_params=dict(r.study.sampler.params),
        loss_lr=params.get(LOSS_LR),
        preset=r.preset,
        seed=seed,
        workdir=fold_dir(ctx, kind, h, reproduction, fold),
        device=ctx.device,
        desc=f"{label} · fold {fold}",
        progress=ctx.progress,
        identity=identity,
        code_version=code_version(),
    )
    try:
        res = train_fold(spec, on_validation=record)
    except CheckpointError as e:  # disk full, unreadable last.pt: the run stops, one line
        raise StudyError(str(e)) from None
    for rec in res.history:  # a resumed fold re-reports nothing: make sure every epoch is stored
        record(rec)
    best = res.best or {}
    store.transact(
        ctx.engine,
        lambda s: upsert(
            s,
            FoldRun,
            key,
            status=res.status,
            reason=res.reason,
            best_epoch=res.best_epoch,
            objective=res.objective,
            checkpoint=res.checkpoint,
            wall_time_s=res.wall_time_s,
            device=res.device,  # provenance: the run that computed it (adopted or not)
            code_version=res.code_version,
            **{k: best.get(k) for k in store.METRIC_COLUMNS},
        ),
        f"recording {what}",
    )
    return res


# --- test stage --------------------------------------------------------------------------------


def best_params(ctx: Context) -> dict[str, Any]:
    try:
        ostudy = optuna.load_study(study_name=ctx.name, storage=ctx.url)
    except KeyError:  # Optuna: "Record does not exist."
        ostudy = None
    complete = ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if ostudy else []
    if not complete:
        raise StudyError(
            f"study {ctx.name!r} has no complete trial yet: run `mlrc study run` first"
        )
    best = ostudy.best_trial
    if str(best.user_attrs.get("reason") or "").startswith(store.NONFINITE):
        raise StudyError(
            f"study {ctx.name!r}: every complete trial was scored 0 because its loss or "
            f"embeddings went non-finite (best: trial {best.number}, {best.user_attrs['reason']});"
            " nothing to test — narrow the search space (e.g. loss_lr) and search again"
        )
    return {**ctx.resolved.fixed, **best.params}


def run_test(ctx: Context) -> list[str]:
    """Retrain the best parameters ``reproductions`` times × all folds; test each on the test
    classes, separated (each 128-D fold model, then their mean) and concatenated (512-D).
    Returns messages for reproductions that failed (their results are not stored)."""
    params = best_params(ctx)
    ensure_baseline(ctx)
    problems = []
    for rep in range(1, ctx.resolved.reproductions + 1):
        with session(ctx.engine) as s:
            done = (
                s.execute(select(TestResult).filter_by(study_id=ctx.study_id, reproduction=rep))
                .scalars()
                .all()
            )
        same = [r for r in done if store.canonical_json(r.params) == store.canonical_json(params)]
        if len(same) == len(ctx.split.folds) + 2:
            continue
        problem = _test_reproduction(ctx, params, rep)
        if problem:
            problems.append(problem)
    return problems


def baseline_of(r: ResolvedStudy) -> dict[str, Any]:
    """What defines the untrained row's numbers: the dataset, the trunk and its weights, the
    eval transform (the test classes are the second half of the classes, whatever the folds)."""
    p = r.preset
    return {
        "dataset": r.study.dataset.model_dump(mode="json"),
        "trunk": p.trunk,
        "pretrained": p.pretrained,
        "seed": None if p.pretrained else UNTRAINED_SEED,
        "resize": p.image.resize,
        "crop": p.image.crop,
    }


def ensure_baseline(ctx: Context) -> None:
    """The untrained trunk on the test classes (the tables' "Pretrained" row, or "Random init"
    for a trunk trained from scratch), computed once per :func:`baseline_of` key and linked to
    this study. Separated = concatenated = the trunk's own features (L2-normalised by the
    metrics), as the reference harness does for untrained status."""
    r, config = ctx.resolved, baseline_of(ctx.resolved)
    key = hashlib.sha256(store.canonical_json(config).encode()).hexdigest()[:16]

    def have(s: Any) -> bool:
        return s.execute(select(store.Baseline.id).filter_by(key=key)).first() is not None

    if not store.transact(ctx.engine, have, "reading the untrained baseline"):
        kind = "pretrained" if r.preset.pretrained else "random_init"
        label = f"{'Pretrained' if r.preset.pretrained else 'Random init'} ({r.preset.trunk})"
        log.info("computing the untrained baseline row: %s on the test classes", label)
        model = untrained_trunk(r.preset).to(ctx.device)
        p = r.preset
        emb, labels = embed(
            model, _test_view(ctx, model.trunk.input_spec), p.eval_batch_size, ctx.device
        )
        m = retrieval_metrics(emb, labels, device=ctx.device)
        m.pop("num_queries")
        m |= analysis_metrics(emb, labels, seed=r.study.search.seed)

        def write(s: Any) -> None:
            for mode in ("separated", "concatenated"):
                upsert(
                    s,
                    store.Baseline,
                    {"key": key, "mode": mode},
                    dataset=r.study.dataset.name,
                    kind=kind,
                    label=label,
                    trunk=p.trunk,
                    extra={k: v for k, v in m.items() if k not in store.METRIC_COLUMNS},
                    config=config,
                    device=ctx.device,
                    code_version=code_version(),
                    **{k: m[k] for k in store.METRIC_COLUMNS},
                )

        store.transact(ctx.engine, write, "recording the untrained baseline")

    def link(s: Any) -> None:  # (not upsert: its own argument is called ``key``)
        row = s.execute(
            select(store.StudyBaseline).filter_by(study_id=ctx.study_id)
        ).scalar_one_or_none()
        if row is None:
            s.add(store.StudyBaseline(study_id=ctx.study_id, key=key))
        else:
            row.key = key

    store.transact(ctx.engine, link, "linking the untrained baseline")


def _test_view(ctx: Context, input_spec: dict) -> View:
    im = ctx.resolved.preset.image
    return View(ctx.dataset, ctx.split.test_classes, eval_transform(im.resize, im.crop, input_spec))


def _test_metrics(
    ctx: Context, emb: np.ndarray, labels: np.ndarray, train_emb: np.ndarray
) -> dict[str, float]:
    """MAP@R, P@1, R-Precision, the analysis metrics (Recall@K, NMI, mAP@1000, ρ, π) and the
    Metrix utilization of the test embeddings against the training embeddings ``train_emb``
    (the fold's training classes; for the 512-D row, all train+val classes), both L2-normalised.
    """
    m = retrieval_metrics(emb, labels, device=ctx.device)
    m.pop("num_queries")
    seed = ctx.resolved.study.search.seed
    util = metrix_utilization(emb, train_emb, normalize=True, device=ctx.device)
    return {**m, **analysis_metrics(emb, labels, seed=seed), "metrix_utilization": util}


def _test_reproduction(ctx: Context, params: dict[str, Any], rep: int) -> str | None:
    p = ctx.resolved.preset
    embeddings, seen, labels, rows = [], [], None, []
    trainval = View(ctx.dataset, ctx.split.trainval_classes, None)
    for fold in ctx.split.folds:
        res = run_fold(ctx, "test", params, rep, fold.index, None)
        if res.status != "complete":
            return f"reproduction {rep}, fold {fold.index}: {res.reason}"
        model = load_model(p, res.checkpoint, ctx.device)
        spec_in = model.trunk.input_spec
        emb, labels = embed(
            model, _test_view(ctx, spec_in), p.eval_batch_size, ctx.device, p.num_workers
        )
        trainval.transform = _test_view(ctx, spec_in).transform
        tv_emb, tv_lab = embed(model, trainval, p.eval_batch_size, ctx.device, p.num_workers)
        embeddings.append(emb)
        seen.append(tv_emb)
        own = np.isin(np.asarray(ctx.split.trainval_classes)[tv_lab], fold.train_classes)
        rows.append(("separated", fold.index, _test_metrics(ctx, emb, labels, tv_emb[own])))
    # separated aggregate: the mean of the four 128-D models' metrics (MLRC's MeanAggregator)
    keys = rows[0][2].keys()
    rows.append(("separated", -1, {k: float(np.mean([m[k] for _, _, m in rows])) for k in keys}))
    joined = concatenate_embeddings(embeddings)
    rows.append(
        ("concatenated", -1, _test_metrics(ctx, joined, labels, concatenate_embeddings(seen)))
    )
    with session(ctx.engine) as s:  # all rows of a reproduction in one transaction
        for mode, fold, m in rows:
            upsert(
                s,
                TestResult,
                {"study_id": ctx.study_id, "reproduction": rep, "mode": mode, "fold": fold},
                params=params,
                extra={k: v for k, v in m.items() if k not in store.METRIC_COLUMNS},
                **{k: m[k] for k in store.METRIC_COLUMNS},
            )
    return None
