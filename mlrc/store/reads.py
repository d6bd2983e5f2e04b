"""Reads for the test-result tables (:mod:`mlrc.report.tables`): which studies a selection
names, and everything a table shows of them — final test results, complete trials' reasons,
the untrained baselines they link to. Read-only; every function opens its own session and
hands out records (:mod:`mlrc.store.records`) or plain values."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select

from mlrc.store.engine import session
from mlrc.store.records import (
    BaselineRecord,
    HistoryRecord,
    StudyRecord,
    TestResultRecord,
    from_row,
)
from mlrc.store.schema import (
    Baseline,
    CampaignStudy,
    FoldRun,
    Study,
    StudyBaseline,
    StudyHistory,
    TestResult,
    Trial,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "TableInputs",
    "archived_of",
    "campaign_names",
    "campaign_study_names",
    "existing_study_names",
    "study_names",
    "table_inputs",
    "tested_study_names",
]

# NAME.old-K: a study archived by ``study run --force-new`` (:func:`mlrc.store.studies.archive_study`)
_ARCHIVED = re.compile(r"(?P<name>.+)\.old-\d+")


def archived_of(name: str) -> str | None:
    """The name of the study that an archived study ``NAME.old-K`` was replaced by (``NAME``);
    None for a study that is not archived."""
    m = _ARCHIVED.fullmatch(name)
    return m["name"] if m else None


def tested_study_names(engine: Engine, names: list[str]) -> set[str]:
    """Those of ``names`` that are studies with final test results."""
    with session(engine) as s:
        q = (
            select(Study.name)
            .join(TestResult, TestResult.study_id == Study.id)
            .where(TestResult.fold == -1, Study.name.in_(names))
            .distinct()
        )
        return set(s.execute(q).scalars())


def study_names(engine: Engine) -> list[str]:
    """Every study's name, by dataset then name."""
    with session(engine) as s:
        rows = s.execute(select(Study.name).order_by(Study.dataset, Study.name)).all()
        return [r.name for r in rows]


def campaign_study_names(engine: Engine, campaign: str) -> list[str]:
    """The names of ``campaign``'s studies by position (then name); empty for an unknown
    campaign."""
    with session(engine) as s:
        members = s.execute(
            select(Study.name)
            .join(CampaignStudy, CampaignStudy.study_id == Study.id)
            .where(CampaignStudy.campaign == campaign)
            .order_by(CampaignStudy.position, Study.name)
        ).all()
        return [m.name for m in members]


def campaign_names(engine: Engine) -> list[str]:
    """Every campaign with a study in the store, sorted."""
    with session(engine) as s:
        return sorted(s.execute(select(CampaignStudy.campaign).distinct()).scalars())


def existing_study_names(engine: Engine, names: list[str]) -> set[str]:
    """Those of ``names`` that are studies in the store."""
    with session(engine) as s:
        return set(s.execute(select(Study.name).where(Study.name.in_(names))).scalars())


@dataclass
class TableInputs:
    """What the test-result table shows of some studies, read in one transaction, as records
    (:mod:`mlrc.store.records`)."""

    # final results (fold -1), each with its study (one record per study, shared)
    results: list[tuple[StudyRecord, TestResultRecord]]
    trial_reasons: list[tuple[int, str | None]]  # (study id, reason) per complete trial
    baseline_links: dict[int, str]  # study id -> baseline key
    baselines: dict[str, list[BaselineRecord]] = field(default_factory=dict)  # key -> per mode
    history: dict[int, list[HistoryRecord]] = field(default_factory=dict)  # study id -> changes
    # study id -> (complete test fold runs, of them kept at epoch 0: the untrained model)
    test_epochs: dict[int, tuple[int, int]] = field(default_factory=dict)
    # study id -> the torch thread counts its complete fold runs recorded (several: say so)
    fold_threads: dict[int, list[int]] = field(default_factory=dict)
    # study id -> the provenance of each complete fold run (None: recorded before schema 7)
    fold_provenance: dict[int, list[dict | None]] = field(default_factory=dict)
    # study id -> "trial 0 failed: reason", "reproduction 2, fold 0 failed: reason" (in order)
    failures: dict[int, list[str]] = field(default_factory=dict)


def table_inputs(engine: Engine, names: list[str]) -> TableInputs:
    """The final test results of the studies ``names`` (studies without any are left out), the
    reasons of their complete trials, their untrained baselines and their histories."""
    with session(engine) as s:
        results = _final_results(s, names)
        ids = list({st.id: st for st, _ in results})
        links = _baseline_links(s, ids)
        return TableInputs(
            results=results,
            trial_reasons=_complete_trial_reasons(s, ids),
            baseline_links=links,
            baselines=_baselines(s, sorted(set(links.values()))),
            history=_history(s, ids),
            test_epochs=_test_epochs(s, ids),
            fold_threads=_fold_threads(s, ids),
            fold_provenance=_fold_provenances(s, ids),
            failures=_failures(s, ids),
        )


def _final_results(s: Session, names: list[str]) -> list[tuple[StudyRecord, TestResultRecord]]:
    q = (
        select(Study, TestResult)
        .join(TestResult, TestResult.study_id == Study.id)
        .where(TestResult.fold == -1, Study.name.in_(names))
    )
    studies: dict[int, StudyRecord] = {}  # as the session's identity map: one per study
    out = []
    for st, tr in s.execute(q).all():
        record = studies.setdefault(st.id, from_row(StudyRecord, st))
        out.append((record, from_row(TestResultRecord, tr)))
    return out


def _complete_trial_reasons(s: Session, study_ids: list[int]) -> list[tuple[int, str | None]]:
    q = select(Trial.study_id, Trial.reason).where(
        Trial.study_id.in_(study_ids), Trial.state == "complete"
    )
    return [(study_id, reason) for study_id, reason in s.execute(q).all()]


def _failures(s: Session, study_ids: list[int]) -> dict[int, list[str]]:
    """Per study, its failed trials and failed test folds, each with its reason."""
    out: dict[int, list[str]] = {}
    q = select(Trial).where(Trial.study_id.in_(study_ids), Trial.state == "failed")
    for t in s.execute(q.order_by(Trial.study_id, Trial.number)).scalars():
        out.setdefault(t.study_id, []).append(f"trial {t.number} failed: {t.reason or '?'}")
    q = select(FoldRun).where(
        FoldRun.study_id.in_(study_ids), FoldRun.kind == "test", FoldRun.status == "failed"
    )
    for f in s.execute(q.order_by(FoldRun.study_id, FoldRun.reproduction, FoldRun.fold)).scalars():
        line = f"reproduction {f.reproduction}, fold {f.fold} failed: {f.reason or '?'}"
        out.setdefault(f.study_id, []).append(line)
    return out


def _baseline_links(s: Session, study_ids: list[int]) -> dict[int, str]:
    q = select(StudyBaseline.study_id, StudyBaseline.key).where(
        StudyBaseline.study_id.in_(study_ids)
    )
    return dict(s.execute(q).all())


def _baselines(s: Session, keys: list[str]) -> dict[str, list[BaselineRecord]]:
    out: dict[str, list[BaselineRecord]] = {}
    for b in s.execute(select(Baseline).where(Baseline.key.in_(keys))).scalars():
        out.setdefault(b.key, []).append(from_row(BaselineRecord, b))
    return out


def _history(s: Session, study_ids: list[int]) -> dict[int, list[HistoryRecord]]:
    out: dict[int, list[HistoryRecord]] = {}
    q = select(StudyHistory).where(StudyHistory.study_id.in_(study_ids))
    for h in s.execute(q.order_by(StudyHistory.time, StudyHistory.id)).scalars():
        out.setdefault(h.study_id, []).append(from_row(HistoryRecord, h))
    return out


def _fold_threads(s: Session, study_ids: list[int]) -> dict[int, list[int]]:
    q = (
        select(FoldRun.study_id, FoldRun.threads)
        .where(FoldRun.study_id.in_(study_ids), FoldRun.status == "complete")
        .where(FoldRun.threads.is_not(None))
        .distinct()
    )
    out: dict[int, list[int]] = {}
    for study_id, threads in s.execute(q).all():
        out.setdefault(study_id, []).append(threads)
    return {k: sorted(v) for k, v in out.items()}


def _fold_provenances(s: Session, study_ids: list[int]) -> dict[int, list[dict | None]]:
    """Per study: the provenance of each of its complete fold runs (search and test, by id;
    None where a run recorded none)."""
    q = (
        select(FoldRun.study_id, FoldRun.provenance)
        .where(FoldRun.study_id.in_(study_ids), FoldRun.status == "complete")
        .order_by(FoldRun.id)
    )
    out: dict[int, list[dict | None]] = {}
    for study_id, prov in s.execute(q).all():
        out.setdefault(study_id, []).append(prov)
    return out


def _test_epochs(s: Session, study_ids: list[int]) -> dict[int, tuple[int, int]]:
    """Per study: its complete test fold runs, and how many of them kept epoch 0."""
    q = select(FoldRun.study_id, FoldRun.best_epoch).where(
        FoldRun.study_id.in_(study_ids), FoldRun.kind == "test", FoldRun.status == "complete"
    )
    out: dict[int, tuple[int, int]] = {}
    for study_id, epoch in s.execute(q).all():
        done, zero = out.get(study_id, (0, 0))
        out[study_id] = (done + 1, zero + (epoch == 0))
    return out
