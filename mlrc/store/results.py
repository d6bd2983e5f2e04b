"""What the test stage writes and reads: each reproduction's test results and retrieval view,
and the untrained baseline a study's tables open with (every such query of :mod:`mlrc.search`,
named for what it does). Writes are upserts in one transaction, re-run after a lost connection;
reads hand out :mod:`mlrc.store.records`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from mlrc.store.embeddings import write_embedding_file
from mlrc.store.engine import session, transact, upsert
from mlrc.store.records import TestResultRecord, from_row
from mlrc.store.schema import (
    METRIC_COLUMNS,
    Baseline,
    FoldRun,
    RetrievalView,
    StudyBaseline,
    TestResult,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "has_baseline",
    "link_baseline",
    "record_baseline",
    "record_reproduction",
    "reproduction_results",
    "retrieval_view",
    "test_fold_epochs",
    "test_results",
    "tested_reproductions",
]


def reproduction_results(
    engine: Engine, study_id: int, reproduction: int
) -> list[TestResultRecord]:
    """The stored test rows of one reproduction (every fold and mode)."""
    with session(engine) as s:
        query = select(TestResult).filter_by(study_id=study_id, reproduction=reproduction)
        return [from_row(TestResultRecord, r) for r in s.execute(query).scalars().all()]


def test_results(engine: Engine, study_id: int) -> list[TestResultRecord]:
    """Every stored test row of the study (all reproductions, folds and modes)."""
    with session(engine) as s:
        rows = s.execute(select(TestResult).filter_by(study_id=study_id)).scalars()
        return [from_row(TestResultRecord, r) for r in rows]


def test_fold_epochs(engine: Engine, study_id: int) -> dict[tuple[int, int], int | None]:
    """(reproduction, fold) → the best epoch its complete test fold kept (0: the untrained
    model, the epoch validation never improved on)."""
    query = select(FoldRun.reproduction, FoldRun.fold, FoldRun.best_epoch).where(
        FoldRun.study_id == study_id, FoldRun.kind == "test", FoldRun.status == "complete"
    )
    rows = transact(engine, lambda s: s.execute(query).all(), "reading test folds")
    return {(rep, fold): epoch for rep, fold, epoch in rows}


def tested_reproductions(engine: Engine, study_id: int) -> set[int]:
    """The reproductions whose test results are stored."""
    query = select(TestResult.reproduction).filter_by(study_id=study_id).distinct()
    return transact(engine, lambda s: set(s.execute(query).scalars()), "reading test results")


def record_reproduction(
    engine: Engine,
    study_id: int,
    reproduction: int,
    params: dict[str, Any],
    rows: list[tuple[str, int, dict[str, float]]],
    view: dict[str, Any] | None = None,
    embeddings: dict[str, Any] | None = None,
) -> None:
    """All rows ``(mode, fold, metrics)`` of one reproduction, in one transaction; metrics other
    than the metric columns go to ``extra``. ``view``: its retrieval view
    (:class:`~mlrc.store.schema.RetrievalView`), written in the same transaction; None: none.
    ``embeddings``: its stored test embeddings' row (:class:`~mlrc.store.schema.EmbeddingFile`
    fields), likewise. Re-run whole after a lost connection (every write is an upsert)."""

    def write(s: Session) -> None:
        for mode, fold, m in rows:
            upsert(
                s,
                TestResult,
                {"study_id": study_id, "reproduction": reproduction, "mode": mode, "fold": fold},
                params=params,
                extra={k: v for k, v in m.items() if k not in METRIC_COLUMNS},
                **{k: m[k] for k in METRIC_COLUMNS},
            )
        if view is not None:
            key = {"study_id": study_id, "reproduction": reproduction}
            upsert(s, RetrievalView, key, data=view)
        if embeddings is not None:
            write_embedding_file(s, study_id, reproduction, **embeddings)

    transact(engine, write, f"recording reproduction {reproduction}")


def retrieval_view(engine: Engine, study_id: int, reproduction: int) -> dict[str, Any] | None:
    """The stored retrieval view of one reproduction (None: none stored)."""
    with session(engine) as s:
        query = select(RetrievalView.data).filter_by(study_id=study_id, reproduction=reproduction)
        return s.execute(query).scalar_one_or_none()


# --- the untrained baseline --------------------------------------------------------------------


def has_baseline(engine: Engine, key: str) -> bool:
    """Whether the untrained baseline with key ``key`` is computed."""

    def have(s: Session) -> bool:
        return s.execute(select(Baseline.id).filter_by(key=key)).first() is not None

    return transact(engine, have, "reading the untrained baseline")


def record_baseline(engine: Engine, key: str, metrics: dict[str, float], **fields: Any) -> None:
    """The untrained baseline's rows (separated = concatenated: the trunk's own features);
    ``fields``: dataset, kind, label, trunk, config, device, code_version."""

    def write(s: Session) -> None:
        for mode in ("separated", "concatenated"):
            upsert(
                s,
                Baseline,
                {"key": key, "mode": mode},
                **fields,
                extra={k: v for k, v in metrics.items() if k not in METRIC_COLUMNS},
                **{k: metrics[k] for k in METRIC_COLUMNS},
            )

    transact(engine, write, "recording the untrained baseline")


def link_baseline(engine: Engine, study_id: int, key: str) -> None:
    """Link the study to the untrained baseline with key ``key`` (its tables' first row)."""

    def link(s: Session) -> None:  # (not upsert: its own argument is called ``key``)
        row = s.execute(select(StudyBaseline).filter_by(study_id=study_id)).scalar_one_or_none()
        if row is None:
            s.add(StudyBaseline(study_id=study_id, key=key))
        else:
            row.key = key

    transact(engine, link, "linking the untrained baseline")
