"""The MLflow tracker: nested runs through MLflow's tracking client (``import mlflow`` here is the
installed library: imports are absolute)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mlrc.config.identity import params_hash
from mlrc.search.tracking.base import (
    BestEffort,
    RunKey,
    StudyRun,
    epoch_metrics,
    fold_metrics,
    reproduction_metrics,
    run_key,
    safe_key,
)

if TYPE_CHECKING:
    from mlrc.search.folds import FoldJob
    from mlrc.train import EpochRecord, FoldResult

__all__ = ["EXPERIMENT", "MlflowTracker"]

EXPERIMENT = "mlrc"  # the MLflow experiment (MLFLOW_EXPERIMENT_NAME overrides it)
_STATUS = {"complete": "FINISHED", "failed": "FAILED", "pruned": "KILLED", "interrupted": "KILLED"}


class MlflowTracker(BestEffort):
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
        self.runs: dict[RunKey, str] = {}  # ("trial" | "reproduction", n, params hash) → run id
        self.open: set[RunKey] = set()  # runs this process left running
        self.logged: set[tuple[RunKey, int, int]] = set()  # (run, fold, epoch) sent

    # the hooks

    def start_study(self, study: StudyRun) -> None:
        self.tags = dict(study.tags)
        self._call(
            "opening the study run",
            lambda: self._start(study.name, study.params, study.budgets),
        )

    def trial_started(self, number: int, params: Mapping[str, Any]) -> None:
        self._call(f"starting trial {number}", lambda: self._run(("trial", number, ""), params))

    def epoch(self, job: FoldJob, trial_number: int | None, rec: EpochRecord) -> None:
        key = run_key(job, trial_number)
        if key is None or (key, job.fold, rec.epoch) in self.logged:
            return  # a resumed fold reports its epochs again: sent once
        metrics = epoch_metrics(f"fold{job.fold}", rec)
        if self._call(
            f"logging epoch {rec.epoch} of {key[0]} {key[1]}",
            lambda: self._log(self._run(key), metrics, step=rec.epoch),
        ):
            self.logged.add((key, job.fold, rec.epoch))

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        values = fold_metrics(fold, res)
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
                ("reproduction", rep, params_hash(dict(params))),
                "complete",
                None,
                reproduction_metrics(rows),
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

    def _run(self, key: RunKey, params: Mapping[str, Any] | None = None) -> str:
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
        found = self.oldest_run(wanted)
        if found is not None:
            return found
        run = self.client.create_run(self.experiment_id, tags=tags)
        run_id = run.info.run_id
        if params:
            self._params(run_id, params)
        winner = self.oldest_run(wanted)
        if winner is not None and winner != run_id:
            self.client.delete_run(run_id)
            return winner
        return run_id

    def oldest_run(self, wanted: dict[str, str]) -> str | None:
        """The id of the oldest run of the experiment with the tags ``wanted`` (None: none yet).
        Every process of a study agrees on it; a test may override it to stage a race."""
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

        items = [Param(safe_key(str(k)), str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _log(self, run_id: str, metrics: Mapping[str, float | None], step: int = 0) -> bool:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])
        return True

    def _interrupted(self, key: RunKey) -> None:
        """A run this process opened and did not end: interrupted, unless another process
        ended it meanwhile (a trial declared lost and retried, a Ray trial's driver)."""
        if self.client.get_run(self.runs[key]).info.status == "RUNNING":
            self._end(key, "interrupted", "the process stopped", {})
        self.open.discard(key)

    def _end(
        self,
        key: RunKey,
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
