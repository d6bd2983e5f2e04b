"""Experiment tracking: a study's trials and test reproductions also logged to MLflow (or W&B).

``tracking: {mlflow: URI}`` in a study or campaign file, or ``--track mlflow:URI``, gives one
run per study, and nested under it one run per trial (its parameters, the per-epoch validation
metrics of each fold with ``step`` = epoch, each fold's best, the objective) and one run per test
reproduction (its parameters and test metrics). The store stays the record: tracking never
decides a number, is not part of a study's fingerprint, and a tracking failure (server down, bad
URI) is logged once and turns tracking off for the process — the trial goes on.

Every process of a study (``mlrc study run``, each ``mlrc worker`` of a pool, each Ray process)
finds the same study run and trial runs by their tags (``mlrc.key``, ``mlrc.trial``, …): the
oldest run with the tags wins, and a process that raced another to create one deletes its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mlrc.config.identity import canonical_json
from mlrc.config.schema import TrackingSpec
from mlrc.errors import first_line
from mlrc.search.errors import StudyError

if TYPE_CHECKING:
    from mlrc.config import ResolvedStudy
    from mlrc.search.context import Context
    from mlrc.search.folds import FoldJob
    from mlrc.train import EpochRecord, FoldResult

__all__ = [
    "TRACK_FORMS",
    "EXPERIMENT",
    "MlflowTracker",
    "NullTracker",
    "Tracker",
    "TrackingError",
    "WandbTracker",
    "check_available",
    "open_tracker",
    "parse_track",
    "with_track",
]

log = logging.getLogger("mlrc")

TRACK_FORMS = "mlflow:URI or wandb:PROJECT"
EXPERIMENT = "mlrc"  # the MLflow experiment (MLFLOW_EXPERIMENT_NAME overrides it)
_STATUS = {"complete": "FINISHED", "failed": "FAILED", "pruned": "KILLED", "interrupted": "KILLED"}


class TrackingError(StudyError):
    """A tracking target that cannot be used (unknown form, package not installed): one line."""


def parse_track(value: str, where: str = "--track") -> TrackingSpec | None:
    """``mlflow:URI`` / ``wandb:PROJECT`` → a :class:`TrackingSpec`; ``none`` → None (no
    tracking, overriding the file's); anything else is a :class:`TrackingError` naming
    ``where``."""
    if value.strip().lower() in ("none", "off"):
        return None
    kind, sep, target = value.strip().partition(":")
    if not sep or not target.strip() or kind not in ("mlflow", "wandb"):
        raise TrackingError(f"{where}: expected {TRACK_FORMS} (or none), got {value!r}")
    return TrackingSpec(**{kind: target.strip()})


def with_track(resolved: ResolvedStudy, track: str | None) -> ResolvedStudy:
    """``resolved`` with the tracking ``--track`` gives (``none``: none) instead of the file's;
    as it was when ``track`` is None. Not part of the study's identity."""
    if track is None:
        return resolved
    study = resolved.study.model_copy(update={"tracking": parse_track(track)})
    return resolved.model_copy(update={"study": study})


# --- the interface ------------------------------------------------------------------------------


class Tracker:
    """Where a study's progress is also logged. The base class logs nothing (no tracking);
    every hook is best-effort and never raises."""

    def start_study(self, ctx: Context) -> None:
        """The study was opened by this process (``ctx``: its context)."""

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        """Trial ``number`` starts with ``params`` (fixed and suggested)."""

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        """One validated epoch of a fold (``job.kind`` search: of trial ``trial_number``; test:
        of reproduction ``job.reproduction``)."""

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        """A fold of trial ``number`` finished (or was reused): ``fold{k}/objective``,
        ``fold{k}/best_epoch`` and the best epoch's validation metrics ``fold{k}/best_*``."""

    def trial_finished(
        self,
        number: int,
        state: str,
        value: float | None,
        sem: float | None,
        reason: str | None,
    ) -> None:
        """Trial ``number`` ended: complete (``value``, ``sem``), failed, pruned or interrupted."""

    def reproduction_finished(
        self, rep: int, params: Mapping[str, Any], rows: list[tuple[str, int, dict[str, float]]]
    ) -> None:
        """Test reproduction ``rep`` stored its rows (mode, fold or −1, metrics)."""

    def close(self) -> None:
        """The study is closed by this process: runs it left open end as interrupted."""


NullTracker = Tracker  # no tracking: every hook does nothing


class _Both(Tracker):
    """Several trackers (MLflow and W&B at once), each called in turn."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def start_study(self, ctx: Context) -> None:
        for t in self.trackers:
            t.start_study(ctx)

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.trial_started(number, params)

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        for t in self.trackers:
            t.epoch(job, trial_number, rec)

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        for t in self.trackers:
            t.fold_finished(number, fold, res)

    def trial_finished(self, number: int, state: str, *args: Any) -> None:
        for t in self.trackers:
            t.trial_finished(number, state, *args)

    def reproduction_finished(self, rep: int, params: Mapping[str, Any], rows: list) -> None:
        for t in self.trackers:
            t.reproduction_finished(rep, params, rows)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def open_tracker(ctx: Context) -> Tracker:
    """The tracker of ``ctx``'s study file (``tracking:``, or what ``--track`` put there),
    started; :class:`NullTracker` when it has none."""
    spec = ctx.resolved.study.tracking
    check_available(spec, "tracking")
    made: list[Tracker] = []
    if spec is not None and spec.mlflow:
        made.append(MlflowTracker(spec.mlflow))
    if spec is not None and spec.wandb:
        made.append(WandbTracker(spec.wandb))
    tracker = made[0] if len(made) == 1 else _Both(made) if made else NullTracker()
    tracker.start_study(ctx)
    return tracker


def check_available(spec: TrackingSpec | None, where: str = "--track") -> None:
    """A :class:`TrackingError` when ``spec`` needs a package that is not installed."""
    import importlib.util

    for kind, package, extra in (
        ("mlflow", "mlflow", "mlrc[tracking]"),
        ("wandb", "wandb", "wandb"),
    ):
        if spec is not None and getattr(spec, kind) and importlib.util.find_spec(package) is None:
            raise TrackingError(
                f"{where}: {kind} tracking needs the {package} package (pip install {extra})"
            )


# --- shared helpers -----------------------------------------------------------------------------


def _redact(uri: str) -> str:
    """``scheme://user:secret@host`` → ``scheme://***@host`` (for messages)."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


def _study_tags(ctx: Context) -> dict[str, str]:
    """What identifies and describes the study on a run: its name, a hash of its fingerprint
    (a study archived by --force-new and started afresh gets a new study run), dataset, loss,
    miner, strategy, preset and the code version."""
    from mlrc.config import identity
    from mlrc.search.context import code_version

    r = ctx.resolved
    fingerprint = canonical_json(identity(r.fingerprint()))  # budgets may change
    key = hashlib.sha256(f"{r.study.name}\0{fingerprint}".encode()).hexdigest()[:16]
    tags = {
        "mlrc.study": r.study.name,
        "mlrc.key": key,
        "mlrc.dataset": r.study.dataset.name,
        "mlrc.loss": r.study.loss.name,
        "mlrc.preset": r.study.preset,
        "mlrc.code_version": code_version(),
    }
    if r.study.miner is not None:
        tags["mlrc.miner"] = r.study.miner.name
    if r.study.strategy is not None:
        tags["mlrc.strategy"] = r.study.strategy.name
    return tags


_Key = tuple[str, int, str]  # a tracked run: ("trial", number, "") | ("reproduction", n, hash)


def _run_key(job: FoldJob, trial_number: int | None) -> _Key | None:
    """The tracked run a fold's epochs belong to: its trial's, or its test reproduction's."""
    if job.kind == "search":
        return None if trial_number is None else ("trial", trial_number, "")
    return ("reproduction", job.reproduction, job.params_hash)


def _hash(params: Mapping[str, Any]) -> str:
    from mlrc.search.context import params_hash

    return params_hash(dict(params))


def _epoch_metrics(prefix: str, rec: EpochRecord) -> dict[str, float]:
    """``fold{k}/val_map_at_r``, ``…/val_precision_at_1``, ``…/val_r_precision`` and
    ``…/train_loss`` (none at epoch 0) of one validated epoch."""
    out = {
        f"{prefix}/val_map_at_r": rec.map_at_r,
        f"{prefix}/val_precision_at_1": rec.precision_at_1,
        f"{prefix}/val_r_precision": rec.r_precision,
    }
    if rec.train_loss is not None:
        out[f"{prefix}/train_loss"] = rec.train_loss
    return out


def _fold_metrics(fold: int, res: FoldResult) -> dict[str, float]:
    """How a fold ended: its objective, best epoch and the best epoch's validation metrics."""
    out = {f"fold{fold}/objective": res.objective, f"fold{fold}/best_epoch": res.best_epoch}
    out.update({f"fold{fold}/best_{k}": v for k, v in (res.best or {}).items()})
    return {k: float(v) for k, v in out.items() if v is not None}


def _test_metrics(rows: list[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
    """``test/{mode}/fold{k}/{metric}`` per fold model, ``test/{mode}/{metric}`` for the
    aggregate (fold −1: the separated mean, the concatenated 512-D model)."""
    out = {}
    for mode, fold, metrics in rows:
        where = f"test/{mode}" + (f"/fold{fold}" if fold >= 0 else "")
        for k, v in metrics.items():
            if v is not None:
                out[f"{where}/{_safe_key(k)}"] = float(v)
    return out


def _safe_key(key: str) -> str:
    """A metric name MLflow accepts (alphanumerics, ``_-. /``)."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)


class _BestEffort(Tracker):
    """A tracker whose hooks never raise: the first failure is logged (one warning, naming the
    target) and turns the tracker off for this process."""

    name = "tracking"

    def __init__(self, target: str) -> None:
        self.target = target
        self.off = False

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.off:
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the client libraries' deprecation notices
                return fn()
        except Exception as e:  # noqa: BLE001 — tracking never fails a trial
            self.off = True
            log.warning(
                "%s tracking at %s failed while %s (%s); tracking is off for this process, "
                "the study goes on",
                self.name,
                _redact(self.target),
                what,
                first_line(e, default=type(e).__name__),
            )
            return None


# --- MLflow -------------------------------------------------------------------------------------


class MlflowTracker(_BestEffort):
    """Nested MLflow runs through the tracking client: study run → trial runs and test
    reproduction runs (tag ``mlflow.parentRunId``).

    Optuna's ``optuna_integration.MLflowCallback`` is not used: it logs one flat run per trial
    after the trial ends (no nesting, no per-epoch metrics, no test stage), from the process
    that calls ``study.optimize`` — which mlrc's ask/tell loop, worker pool and Ray trials do not.
    """

    name = "MLflow"

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.client: Any = None
        self.experiment_id: str | None = None
        self.parent: str | None = None
        self.tags: dict[str, str] = {}
        self.runs: dict[_Key, str] = {}  # ("trial" | "reproduction", n, params hash) → run id
        self.open: set[_Key] = set()  # runs this process left running
        self.logged: set[tuple[_Key, int, int]] = set()  # (run, fold, epoch) sent

    # the hooks

    def start_study(self, ctx: Context) -> None:
        self.tags = _study_tags(ctx)
        r = ctx.resolved
        budgets = {"mlrc.trials": str(r.trials), "mlrc.reproductions": str(r.reproductions)}
        params = {
            "sampler": r.sampler,
            "pruner": r.pruner,
            "seed": r.study.search.seed,
            "folds": len(ctx.split.folds),  # a split file may set another number
            "trunk": r.preset.trunk,
            **{f"fixed.{k}": v for k, v in r.fixed.items()},
        }
        self._call("opening the study run", lambda: self._start(r.study.name, params, budgets))

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        self._call(f"starting trial {number}", lambda: self._run(("trial", number, ""), params))

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        key = _run_key(job, trial_number)
        if key is None or (key, job.fold, rec.epoch) in self.logged:
            return  # a resumed fold reports its epochs again: sent once
        metrics = _epoch_metrics(f"fold{job.fold}", rec)
        if self._call(
            f"logging epoch {rec.epoch} of {key[0]} {key[1]}",
            lambda: self._log(self._run(key), metrics, step=rec.epoch),
        ):
            self.logged.add((key, job.fold, rec.epoch))

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        values = _fold_metrics(fold, res)
        self._call(
            f"logging fold {fold} of trial {number}",
            lambda: self._log(self._run(("trial", number, "")), values),
        )

    def trial_finished(
        self,
        number: int,
        state: str,
        value: float | None,
        sem: float | None,
        reason: str | None,
    ) -> None:
        metrics = {"objective": value, "objective_sem": sem}
        self._call(
            f"finishing trial {number}",
            lambda: self._end(("trial", number, ""), state, reason, metrics),
        )

    def reproduction_finished(
        self, rep: int, params: Mapping[str, Any], rows: list[tuple[str, int, dict[str, float]]]
    ) -> None:
        self._call(
            f"logging test reproduction {rep}",
            lambda: self._end(
                ("reproduction", rep, _hash(params)),
                "complete",
                None,
                _test_metrics(rows),
                params=params,
            ),
        )

    def close(self) -> None:
        for key in sorted(self.open):
            self._call(f"closing {key[0]} {key[1]}", lambda key=key: self._interrupted(key))
        if self.parent is not None:
            self._call("closing the study run", lambda: self.client.set_terminated(self.parent))

    # MLflow calls

    def _start(self, study: str, params: dict[str, Any], budgets: dict[str, str]) -> None:
        import mlflow  # noqa: F401 — a missing package is the warning, not a crash
        from mlflow.tracking import MlflowClient

        # a server that does not answer must not hold a trial for minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # "creating tables", …
        self.client = MlflowClient(tracking_uri=self.target)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(name)
            except Exception:  # another process created it first
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp is not None:
            self.experiment_id = exp.experiment_id
        wanted = {"mlrc.key": self.tags["mlrc.key"], "mlrc.kind": "study"}
        tags = {**self.tags, **wanted, "mlflow.runName": study}
        self.parent = self._find_or_create(wanted, tags, params)
        self.client.update_run(self.parent, status="RUNNING")  # closed again by close()
        from mlflow.entities import RunTag

        current = [RunTag(k, v) for k, v in {**self.tags, **budgets}.items()]
        self.client.log_batch(self.parent, tags=current)  # code version, budgets may change

    def _run(self, key: _Key, params: Mapping[str, Any] | None = None) -> str:
        """The run of trial or reproduction ``n`` (a reproduction: of the parameters hashed
        ``h``; a study given more trials may test other ones): found by its parent and tags,
        else created; kept open until it ends."""
        if key not in self.runs:
            if self.parent is None:
                raise RuntimeError("the study run could not be opened")
            kind, n, h = key
            wanted = {"mlflow.parentRunId": self.parent, "mlrc.kind": kind, f"mlrc.{kind}": str(n)}
            if h:
                wanted["mlrc.params_hash"] = h
            tags = {**self.tags, **wanted, "mlflow.runName": f"{kind} {n}", "mlrc.state": "running"}
            self.runs[key] = self._find_or_create(wanted, tags, params)
            self.open.add(key)
        return self.runs[key]

    def _find_or_create(
        self, wanted: dict[str, str], tags: dict[str, str], params: Mapping[str, Any] | None
    ) -> str:
        """The oldest run with the tags ``wanted``; if none, one is created with ``tags`` and
        ``params`` — and deleted again if another process created one first."""
        found = self._oldest(wanted)
        if found is not None:
            return found
        run = self.client.create_run(self.experiment_id, tags=tags)
        run_id = run.info.run_id
        if params:
            self._params(run_id, params)
        winner = self._oldest(wanted)
        if winner is not None and winner != run_id:
            self.client.delete_run(run_id)
            return winner
        return run_id

    def _oldest(self, wanted: dict[str, str]) -> str | None:
        filter_string = " and ".join(f"tags.`{k}` = '{v}'" for k, v in wanted.items())
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=filter_string,
            order_by=["attributes.start_time ASC"],
            max_results=10,
        )
        runs = sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))
        return runs[0].info.run_id if runs else None

    def _params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(_safe_key(str(k)), str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _log(self, run_id: str, metrics: Mapping[str, float | None], step: int = 0) -> bool:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])
        return True

    def _interrupted(self, key: _Key) -> None:
        """A run this process opened and did not end: interrupted, unless another process
        ended it meanwhile (a trial declared lost and retried, a Ray trial's driver)."""
        if self.client.get_run(self.runs[key]).info.status == "RUNNING":
            self._end(key, "interrupted", "the process stopped", {})
        self.open.discard(key)

    def _end(
        self,
        key: _Key,
        state: str,
        reason: str | None,
        metrics: Mapping[str, float | None],
        params: Mapping[str, Any] | None = None,
    ) -> None:
        run_id = self._run(key)
        if params:  # a reproduction's: its run was opened by its first epoch, without them
            self._params(run_id, params)
        self._log(run_id, metrics)
        self.client.set_tag(run_id, "mlrc.state", state)
        if reason:
            self.client.set_tag(run_id, "mlrc.reason", reason[:5000])
        self.client.set_terminated(run_id, _STATUS.get(state, "FINISHED"))
        self.open.discard(key)


# --- Weights & Biases ---------------------------------------------------------------------------


class WandbTracker(_BestEffort):
    """W&B runs in project ``PROJECT``, grouped by study (``group``): one per trial and one per
    test reproduction, with a deterministic id (``{key}-trial-{n}``), so that every process of a
    study resumes the same run. Per-epoch metrics use a step metric per fold
    (``fold{k}/epoch``): W&B's own step must only grow within a run."""

    name = "W&B"

    def __init__(self, project: str) -> None:
        super().__init__(project)
        self.tags: dict[str, str] = {}
        self.runs: dict[_Key, Any] = {}

    def start_study(self, ctx: Context) -> None:
        self.tags = _study_tags(ctx)

    def _run(self, key: _Key, params: Mapping[str, Any] | None = None) -> Any:
        if key not in self.runs:
            import wandb

            kind, n, h = key
            self.runs[key] = wandb.init(
                project=self.target,
                group=self.tags["mlrc.study"],
                job_type=kind,
                name=f"{self.tags['mlrc.study']} {kind} {n}",
                id=f"{self.tags['mlrc.key']}-{kind}-{n}" + (f"-{h}" if h else ""),
                resume="allow",
                config={**self.tags, **dict(params or {})},
                reinit="create_new",
            )
        return self.runs[key]

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        self._call(f"starting trial {number}", lambda: self._run(("trial", number, ""), params))

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        key = _run_key(job, trial_number)
        if key is None:
            return
        prefix = f"fold{job.fold}"

        def log_epoch() -> None:
            run = self._run(key)
            run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/epoch")
            run.log({f"{prefix}/epoch": rec.epoch, **_epoch_metrics(prefix, rec)})

        self._call(f"logging epoch {rec.epoch} of {key[0]} {key[1]}", log_epoch)

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        values = _fold_metrics(fold, res)
        self._call(
            f"logging fold {fold} of trial {number}",
            lambda: self._run(("trial", number, "")).summary.update(values),
        )

    def _finish(self, key: _Key, state: str, summary: dict[str, Any]) -> None:
        run = self._run(key)
        run.summary.update({**summary, "mlrc.state": state})
        run.finish(exit_code=0 if state == "complete" else 1)
        del self.runs[key]

    def trial_finished(
        self,
        number: int,
        state: str,
        value: float | None,
        sem: float | None,
        reason: str | None,
    ) -> None:
        summary = {"objective": value, "objective_sem": sem, "mlrc.reason": reason}
        self._call(
            f"finishing trial {number}", lambda: self._finish(("trial", number, ""), state, summary)
        )

    def reproduction_finished(
        self, rep: int, params: Mapping[str, Any], rows: list[tuple[str, int, dict[str, float]]]
    ) -> None:
        def finish() -> None:
            key = ("reproduction", rep, _hash(params))
            self._run(key).config.update(dict(params), allow_val_change=True)
            self._finish(key, "complete", _test_metrics(rows))

        self._call(f"logging test reproduction {rep}", finish)

    def close(self) -> None:
        for key in list(self.runs):
            self._call(
                f"closing {key[0]} {key[1]}", lambda key=key: self._finish(key, "interrupted", {})
            )
