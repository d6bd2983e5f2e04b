"""What the dashboard reads (:mod:`mlrc.report.snapshot`): the selected studies with their
trials, search fold runs, validation curves, tested reproductions and campaigns, in one session.

Every query is named for what it reads and returns plain rows (named tuples), never ORM objects
bound to a session; the one the dashboard calls is :func:`read_studies`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from mlrc.store.engine import session
from mlrc.store.schema import (
    CampaignStudy,
    EpochMetric,
    FoldRun,
    RetrievalView,
    Study,
    TestResult,
    Trial,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine, Row
    from sqlalchemy.orm import Session

__all__ = ["StoredStudies", "read_studies"]


@dataclass
class StoredStudies:
    """The rows behind one dashboard page, each list in the order the page shows it.

    ``campaigns``: study id → the campaigns it belongs to (by campaign name, then position);
    ``studies``: the named studies that exist, in the order asked for; ``trials``,
    ``fold_runs`` and ``epochs``: their trials (by study, number), search fold runs (by study,
    id) and those runs' epochs (by fold run, epoch); ``reproductions``: study id → number of
    reproductions with a test result (studies without any are absent); ``retrieval``: study id →
    the retrieval view of its best reproduction (highest concatenated test MAP@R)."""

    campaigns: dict[int, list[str]] = field(default_factory=dict)
    studies: list[Row[Any]] = field(default_factory=list)
    trials: list[Row[Any]] = field(default_factory=list)
    fold_runs: list[Row[Any]] = field(default_factory=list)
    epochs: list[Row[Any]] = field(default_factory=list)
    reproductions: dict[int, int] = field(default_factory=dict)
    retrieval: dict[int, Row[Any]] = field(default_factory=dict)


def _campaign_membership(s: Session) -> dict[int, list[str]]:
    """Study id → the campaigns it belongs to, ordered by campaign name, then position."""
    members = s.execute(
        select(CampaignStudy.study_id, CampaignStudy.campaign).order_by(
            CampaignStudy.campaign, CampaignStudy.position
        )
    ).all()
    in_campaigns: dict[int, list[str]] = {}
    for study_id, campaign in members:
        in_campaigns.setdefault(study_id, []).append(campaign)
    return in_campaigns


def _studies_named(s: Session, names: list[str]) -> list[Row[Any]]:
    """The studies among ``names`` that exist, in the order of ``names``: ``id, name, dataset,
    loss, strategy, preset, created, code_version, config, settings``."""
    found = {
        row.name: row
        for row in s.execute(
            select(
                Study.id,
                Study.name,
                Study.dataset,
                Study.loss,
                Study.strategy,
                Study.preset,
                Study.created,
                Study.code_version,
                Study.config,
                Study.settings,
            ).where(Study.name.in_(names))
        ).all()
    }
    return [found[n] for n in names if n in found]


def _trials_of(s: Session, ids: list[int]) -> list[Row[Any]]:
    """The trials of the studies ``ids``, by study and number: ``study_id, number, state, value,
    sem, params, params_hash, reason``."""
    return list(
        s.execute(
            select(
                Trial.study_id,
                Trial.number,
                Trial.state,
                Trial.value,
                Trial.sem,
                Trial.params,
                Trial.params_hash,
                Trial.reason,
            )
            .where(Trial.study_id.in_(ids))
            .order_by(Trial.study_id, Trial.number)
        ).all()
    )


def _search_fold_runs(s: Session, ids: list[int]) -> list[Row[Any]]:
    """The search fold runs of the studies ``ids``, by study and id: ``study_id, id, fold,
    trial_number, params_hash, status, best_epoch, map_at_r``."""
    return list(
        s.execute(
            select(
                FoldRun.study_id,
                FoldRun.id,
                FoldRun.fold,
                FoldRun.trial_number,
                FoldRun.params_hash,
                FoldRun.status,
                FoldRun.best_epoch,
                FoldRun.map_at_r,
            )
            .where(FoldRun.study_id.in_(ids), FoldRun.kind == "search")
            .order_by(FoldRun.study_id, FoldRun.id)
        ).all()
    )


def _search_epochs(s: Session, ids: list[int]) -> list[Row[Any]]:
    """The validated epochs of the search fold runs of the studies ``ids``, by fold run and
    epoch: ``study_id, fold_run_id, epoch, map_at_r, train_loss``."""
    return list(
        s.execute(
            select(
                FoldRun.study_id,
                EpochMetric.fold_run_id,
                EpochMetric.epoch,
                EpochMetric.map_at_r,
                EpochMetric.train_loss,
            )
            .join(EpochMetric, EpochMetric.fold_run_id == FoldRun.id)
            .where(FoldRun.study_id.in_(ids), FoldRun.kind == "search")
            .order_by(EpochMetric.fold_run_id, EpochMetric.epoch)
        ).all()
    )


def _reproductions_tested(s: Session, ids: list[int]) -> dict[int, int]:
    """Study id → how many reproductions have a test result (studies without one are absent)."""
    return dict(
        s.execute(
            select(TestResult.study_id, func.count(func.distinct(TestResult.reproduction)))
            .where(TestResult.study_id.in_(ids), TestResult.fold == -1)
            .group_by(TestResult.study_id)
        ).all()
    )


def _best_retrieval_views(s: Session, ids: list[int]) -> dict[int, Row[Any]]:
    """Study id → the retrieval view of its best reproduction among those that have one (highest
    concatenated test MAP@R, then the lowest reproduction): ``study_id, reproduction, map_at_r,
    data``. Studies without a view are absent; only the chosen views' data is read."""
    scored = s.execute(
        select(RetrievalView.id, RetrievalView.study_id, TestResult.map_at_r)
        .join(
            TestResult,
            (TestResult.study_id == RetrievalView.study_id)
            & (TestResult.reproduction == RetrievalView.reproduction),
        )
        .where(
            RetrievalView.study_id.in_(ids),
            TestResult.mode == "concatenated",
            TestResult.fold == -1,
        )
        .order_by(RetrievalView.study_id, TestResult.map_at_r.desc(), RetrievalView.reproduction)
    ).all()
    best: dict[int, int] = {}
    for view_id, study_id, _ in scored:
        best.setdefault(study_id, view_id)
    if not best:
        return {}
    rows = s.execute(
        select(
            RetrievalView.study_id,
            RetrievalView.reproduction,
            TestResult.map_at_r,
            RetrievalView.data,
        )
        .join(
            TestResult,
            (TestResult.study_id == RetrievalView.study_id)
            & (TestResult.reproduction == RetrievalView.reproduction),
        )
        .where(
            RetrievalView.id.in_(list(best.values())),
            TestResult.mode == "concatenated",
            TestResult.fold == -1,
        )
    ).all()
    return {row.study_id: row for row in rows}


def read_studies(engine: Engine, names: list[str]) -> StoredStudies:
    """Everything the dashboard shows of the studies ``names`` (unknown names are skipped), read
    in one session so the page is consistent."""
    with session(engine) as s:
        studies = _studies_named(s, names)
        ids = [st.id for st in studies]
        return StoredStudies(
            campaigns=_campaign_membership(s),
            studies=studies,
            trials=_trials_of(s, ids),
            fold_runs=_search_fold_runs(s, ids),
            epochs=_search_epochs(s, ids),
            reproductions=_reproductions_tested(s, ids),
            retrieval=_best_retrieval_views(s, ids),
        )
