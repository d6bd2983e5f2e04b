"""One study's rows as plain data, and back: what a study file of a long campaign carries from one
machine to another (:mod:`mlrc.search.transfer` adds Optuna's side and writes the file).

:func:`study_rows` reads every mlrc row of a study — the study, its settings' history, trials,
fold runs with their epoch curves, test results, retrieval views, the untrained baseline it links
to and its campaign memberships — as JSON-ready dicts (datetimes as ISO text, no row ids; epochs
as lists in :data:`EPOCH_COLUMNS` order). Checkpoint URIs are dropped: the files stay behind.
Stored test embeddings and re-scored metrics are not carried either (``mlrc study rescore``
needs the files). :func:`restore_study_rows` writes them into a store that lacks the study, in
one transaction.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from sqlalchemy import DateTime, select

from mlrc.store.engine import get_study, transact
from mlrc.store.reconnect import StoreError
from mlrc.store.schema import (
    Baseline,
    CampaignStudy,
    EpochMetric,
    FoldRun,
    RetrievalView,
    Study,
    StudyBaseline,
    StudyHistory,
    TestResult,
    Trial,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = ["EPOCH_COLUMNS", "restore_study_rows", "study_rows"]

EPOCH_COLUMNS = ("epoch", "train_loss", "map_at_r", "precision_at_1", "r_precision")
_PER_STUDY = {  # key in the rows → table with a study_id, in the order rows are written
    "history": StudyHistory,
    "trials": Trial,
    "test_results": TestResult,
    "retrieval_views": RetrievalView,
}
_SKIP = {"id", "study_id", "fold_run_id"}


def _plain(row: Any, skip: set[str] = _SKIP) -> dict[str, Any]:
    """A row's columns (but ``skip``), datetimes as ISO text."""
    out = {}
    for col in row.__table__.columns:
        if col.name in skip:
            continue
        value = getattr(row, col.name)
        out[col.name] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out


def _model(model: type, values: dict[str, Any], **extra: Any) -> Any:
    """A new ``model`` row from :func:`_plain`'s dict (ISO text back to datetimes)."""
    cols = {c.name: c for c in model.__table__.columns}
    unknown = sorted(set(values) - set(cols))
    if unknown:
        raise StoreError(f"{model.__tablename__}: unknown columns {', '.join(unknown)}")
    kw = {
        k: dt.datetime.fromisoformat(v) if isinstance(cols[k].type, DateTime) and v else v
        for k, v in values.items()
    }
    return model(**kw, **extra)


def study_rows(engine: Engine, name: str) -> dict[str, Any]:
    """Every mlrc row of study ``name`` as plain data (see the module); a :class:`StoreError`
    when the store has no such study."""

    def read(s: Session) -> dict[str, Any]:
        st = get_study(s, name)
        if st is None:
            raise StoreError(f"no study named {name!r} in the store")
        out: dict[str, Any] = {"study": _plain(st)}
        for key, model in _PER_STUDY.items():
            rows = s.execute(select(model).filter_by(study_id=st.id).order_by(model.id))
            out[key] = [_plain(r) for r in rows.scalars()]
        out["fold_runs"] = _fold_runs(s, st.id)
        out["baseline"] = _baseline(s, st.id)
        members = s.execute(select(CampaignStudy).filter_by(study_id=st.id)).scalars()
        out["campaigns"] = [_plain(m) for m in members]
        return out

    return transact(engine, read, f"reading study {name}")


def _fold_runs(s: Session, study_id: int) -> list[dict[str, Any]]:
    """The study's fold runs (checkpoint dropped), each with its epochs as lists."""
    runs = s.execute(select(FoldRun).filter_by(study_id=study_id).order_by(FoldRun.id)).scalars()
    out = []
    for run in runs:
        epochs = s.execute(
            select(*(getattr(EpochMetric, c) for c in EPOCH_COLUMNS))
            .filter_by(fold_run_id=run.id)
            .order_by(EpochMetric.epoch)
        ).all()
        row = _plain(run, _SKIP | {"checkpoint"})
        out.append({**row, "epochs": [list(e) for e in epochs]})
    return out


def _baseline(s: Session, study_id: int) -> dict[str, Any] | None:
    """The untrained baseline the study links to: its key and rows (None: no link)."""
    key = s.execute(select(StudyBaseline.key).filter_by(study_id=study_id)).scalar()
    if key is None:
        return None
    rows = s.execute(select(Baseline).filter_by(key=key).order_by(Baseline.id)).scalars()
    return {"key": key, "rows": [_plain(r) for r in rows]}


def restore_study_rows(engine: Engine, rows: dict[str, Any]) -> int:
    """Write :func:`study_rows`' output into ``engine``'s store, in one transaction; returns the
    new study id. A :class:`StoreError` when a study of that name exists already. A baseline
    row already stored under the same key and mode is kept (baselines are shared)."""
    name = rows["study"]["name"]

    def write(s: Session) -> int:
        if get_study(s, name) is not None:
            raise StoreError(f"study {name!r} already exists in the store: not restored")
        st = _model(Study, rows["study"])
        s.add(st)
        s.flush()
        for key, model in _PER_STUDY.items():
            s.add_all(_model(model, r, study_id=st.id) for r in rows[key])
        for run in rows["fold_runs"]:
            fr = _model(FoldRun, {k: v for k, v in run.items() if k != "epochs"}, study_id=st.id)
            s.add(fr)
            s.flush()
            s.add_all(
                EpochMetric(fold_run_id=fr.id, **dict(zip(EPOCH_COLUMNS, e, strict=True)))
                for e in run["epochs"]
            )
        _restore_baseline(s, st.id, rows.get("baseline"))
        s.add_all(_model(CampaignStudy, m, study_id=st.id) for m in rows["campaigns"])
        return st.id

    return transact(engine, write, f"restoring study {name}")


def _restore_baseline(s: Session, study_id: int, baseline: dict[str, Any] | None) -> None:
    """The baseline's rows (those the store lacks) and the study's link to it."""
    if baseline is None:
        return
    key = baseline["key"]
    have = set(s.execute(select(Baseline.mode).filter_by(key=key)).scalars())
    s.add_all(_model(Baseline, r) for r in baseline["rows"] if r["mode"] not in have)
    s.add(StudyBaseline(study_id=study_id, key=key))
