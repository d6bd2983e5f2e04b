"""What work cost, as the store measured it: every fold run with its epochs, wall time and device
(:func:`fold_costs`), and the test MAP@R of every tested reproduction (:func:`reproduction_values`).
From these, :mod:`mlrc.search.plan` estimates a campaign's cost and its confidence intervals."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from mlrc.store.engine import make_engine, session, sqlite_path
from mlrc.store.schema import EpochMetric, FoldRun, Study, TestResult

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["FoldCost", "ReproductionValue", "fold_costs", "missing_file", "reproduction_values"]


@dataclass(frozen=True)
class FoldCost:
    """One fold run (``mlrc_fold_run``) with its study's name, dataset and resolved preset
    (the stored configuration's ``preset``), and ``epochs``: the last epoch it recorded a
    validation for (the fold's last epoch once it finished: the last epoch is always
    validated; None: none recorded). ``wall_time_s``: seconds, over all the runs that resumed
    it; ``device_name``: the provenance's GPU or CPU model (None before schema 7)."""

    study: str
    dataset: str
    preset: dict[str, Any]
    kind: str  # search | test
    status: str  # running | complete | failed | interrupted
    reproduction: int
    epochs: int | None
    wall_time_s: float | None
    device: str | None
    device_name: str | None


@dataclass(frozen=True)
class ReproductionValue:
    """The test MAP@R (a fraction) of one tested reproduction of a study, in ``mode``."""

    study: str
    dataset: str
    preset: dict[str, Any]
    reproduction: int
    mode: str  # separated | concatenated
    map_at_r: float


def fold_costs(engine: Engine) -> list[FoldCost]:
    """Every fold run of the store with its epochs and study, in one session."""
    last = (
        select(EpochMetric.fold_run_id, func.max(EpochMetric.epoch).label("epochs"))
        .group_by(EpochMetric.fold_run_id)
        .subquery()
    )
    query = (
        select(FoldRun, Study.name, Study.dataset, Study.config, last.c.epochs)
        .join(Study, Study.id == FoldRun.study_id)
        .outerjoin(last, last.c.fold_run_id == FoldRun.id)
        .order_by(FoldRun.id)
    )
    with session(engine) as s:
        return [
            FoldCost(
                name,
                dataset,
                (config or {}).get("preset") or {},
                f.kind,
                f.status,
                f.reproduction,
                epochs,
                f.wall_time_s,
                f.device,
                (f.provenance or {}).get("device_name"),
            )
            for f, name, dataset, config, epochs in s.execute(query).all()
        ]


def reproduction_values(engine: Engine) -> list[ReproductionValue]:
    """The aggregate test MAP@R (fold −1) of every tested reproduction in the store."""
    query = (
        select(TestResult, Study.name, Study.dataset, Study.config)
        .join(Study, Study.id == TestResult.study_id)
        .where(TestResult.fold == -1)
        .order_by(Study.name, TestResult.reproduction, TestResult.mode)
    )
    with session(engine) as s:
        return [
            ReproductionValue(
                name,
                dataset,
                (config or {}).get("preset") or {},
                r.reproduction,
                r.mode,
                r.map_at_r,
            )  # fmt: skip
            for r, name, dataset, config in s.execute(query).all()
        ]


def missing_file(url: str) -> str | None:
    """The file a SQLite ``url`` names when it does not exist yet (None: it exists, or the
    store is not a SQLite file). Nothing is created."""
    path = sqlite_path(make_engine(url))
    return path if path is not None and not os.path.exists(path) else None
