"""What replay and in-fold stopping read of a study's search besides its trials
(:func:`mlrc.store.trials.study_trials`): every search fold run with its validation curve
(:class:`FoldCurve`), in one read."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from sqlalchemy import select

from mlrc.store.engine import transact
from mlrc.store.records import FoldCurve
from mlrc.store.schema import METRIC_COLUMNS, EpochMetric, FoldRun

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = ["search_curves"]


def search_curves(engine: Engine, study_id: int, metric: str = "map_at_r") -> list[FoldCurve]:
    """Every search fold run of the study with its validation ``metric`` (a fraction) at each
    validated epoch, epoch 0 (the untrained model) included, epochs ascending."""
    if metric not in METRIC_COLUMNS:
        raise ValueError(f"metric {metric!r} is not one of {', '.join(METRIC_COLUMNS)}")

    def read(s: Session) -> list[FoldCurve]:
        runs = (
            s.execute(select(FoldRun).filter_by(study_id=study_id, kind="search")).scalars().all()
        )
        ids = [r.id for r in runs]
        points: dict[int, list[tuple[int, float]]] = defaultdict(list)
        if ids:
            rows = s.execute(
                select(EpochMetric.fold_run_id, EpochMetric.epoch, getattr(EpochMetric, metric))
                .where(EpochMetric.fold_run_id.in_(ids))
                .order_by(EpochMetric.fold_run_id, EpochMetric.epoch)
            )
            for run_id, epoch, value in rows:
                points[run_id].append((epoch, value))
        return [
            FoldCurve(
                r.params_hash,
                r.fold,
                r.trial_number,
                r.status,
                r.reason,
                r.objective,
                tuple(points[r.id]),
            )
            for r in runs
        ]

    return transact(engine, read, "reading the search's validation curves")
