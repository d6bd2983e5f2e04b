"""The Weights & Biases tracker: one W&B run per trial and per test reproduction, grouped by
study (``import wandb`` here is the installed library: imports are absolute)."""

from __future__ import annotations

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
)

if TYPE_CHECKING:
    from mlrc.search.folds import FoldJob
    from mlrc.train import EpochRecord, FoldResult

__all__ = ["WandbTracker"]


class WandbTracker(BestEffort):
    """W&B runs in project ``PROJECT``, grouped by study (``group``): one per trial and one per
    test reproduction, with a deterministic id (``{key}-trial-{n}``), so that every process of a
    study resumes the same run. Per-epoch metrics use a step metric per fold
    (``fold{k}/epoch``): W&B's own step must only grow within a run."""

    name = "W&B"

    def __init__(self, project: str) -> None:
        super().__init__(project)
        self.tags: dict[str, str] = {}
        self.runs: dict[RunKey, Any] = {}

    def start_study(self, study: StudyRun) -> None:
        self.tags = dict(study.tags)

    def _run(self, key: RunKey, params: Mapping[str, Any] | None = None) -> Any:
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
        key = run_key(job, trial_number)
        if key is None:
            return
        prefix = f"fold{job.fold}"

        def log_epoch() -> None:
            run = self._run(key)
            run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/epoch")
            run.log({f"{prefix}/epoch": rec.epoch, **epoch_metrics(prefix, rec)})

        self._call(f"logging epoch {rec.epoch} of {key[0]} {key[1]}", log_epoch)

    def fold_finished(self, number: int, fold: int, res: FoldResult) -> None:
        values = fold_metrics(fold, res)
        self._call(
            f"logging fold {fold} of trial {number}",
            lambda: self._run(("trial", number, "")).summary.update(values),
        )

    def _finish(self, key: RunKey, state: str, summary: dict[str, Any]) -> None:
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
            key = ("reproduction", rep, params_hash(dict(params)))
            self._run(key).config.update(dict(params), allow_val_change=True)
            self._finish(key, "complete", reproduction_metrics(rows))

        self._call(f"logging test reproduction {rep}", finish)

    def close(self) -> None:
        for key in list(self.runs):
            self._call(
                f"closing {key[0]} {key[1]}", lambda key=key: self._finish(key, "interrupted", {})
            )
