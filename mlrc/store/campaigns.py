"""What a campaign writes and reads: its membership (``mlrc_campaign_study``: one row per study,
in campaign order, with the campaign's configuration) and each study's progress (every query of
:mod:`mlrc.search.campaign_runner`, named for what it does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select

from mlrc.store.engine import get_study, session, transact, upsert
from mlrc.store.optuna_tables import running_trial_workers
from mlrc.store.records import StudyProgress
from mlrc.store.schema import CampaignStudy, FoldRun, TestResult, Trial

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "Running",
    "StudyProgress",
    "last_campaign_config",
    "record_campaign",
    "running_units",
    "stored_configs",
    "study_progress",
]


def stored_configs(engine: Engine, names: list[str]) -> dict[str, dict[str, Any]]:
    """The configuration stored for each of the studies ``names`` that exists (one session)."""
    configs = {}
    with session(engine) as s:
        for name in names:
            row = get_study(s, name)
            if row is not None:
                configs[name] = row.config
    return configs


def record_campaign(
    engine: Engine, name: str, members: list[tuple[int, int]], config: dict[str, Any]
) -> None:
    """Record campaign ``name``'s membership in one transaction: one row per ``(study_id,
    position)`` of ``members`` with the campaign's ``config``; studies not in ``members`` leave
    it."""
    ids = [study_id for study_id, _ in members]

    def write(s: Session) -> None:
        s.execute(
            delete(CampaignStudy).where(
                CampaignStudy.campaign == name, CampaignStudy.study_id.not_in(ids)
            )
        )
        for study_id, position in members:
            upsert(
                s,
                CampaignStudy,
                {"campaign": name, "study_id": study_id},
                position=position,
                campaign_config=config,
            )

    transact(engine, write, f"recording campaign {name}")


def last_campaign_config(engine: Engine, name: str) -> dict[str, Any] | None:
    """The configuration recorded by the last ``campaign run`` of ``name`` (None: unknown)."""
    with session(engine) as s:
        row = s.execute(
            select(CampaignStudy)
            .filter_by(campaign=name)
            .order_by(CampaignStudy.id.desc())
            .limit(1)
        ).scalar_one_or_none()
        return None if row is None else row.campaign_config


def study_progress(engine: Engine, name: str) -> StudyProgress | None:
    """The progress of study ``name`` as stored (None: no such study), read in one session."""
    with session(engine) as s:
        st = get_study(s, name)
        if st is None:
            return None
        trials = s.execute(
            select(Trial.state, Trial.reason, Trial.number)
            .filter_by(study_id=st.id)
            .order_by(Trial.number)
        ).all()
        reps = s.execute(
            select(func.count(func.distinct(TestResult.reproduction))).filter_by(
                study_id=st.id, fold=-1
            )
        ).scalar()
        folds = s.execute(
            select(FoldRun)
            .filter_by(study_id=st.id, kind="test")
            .order_by(FoldRun.reproduction, FoldRun.fold)
        ).scalars()
        test_folds = [(f.status, f.reproduction, f.fold, f.reason) for f in folds]
        return StudyProgress(
            st.config, [(t[0], t[1]) for t in trials], reps, test_folds, [t[2] for t in trials]
        )


@dataclass(frozen=True)
class Running:
    """A unit of work a worker holds: a search trial (``trial``) or a test fold
    (``reproduction``, ``fold``). ``worker``: ``host:pid`` as recorded (the trial's Optuna user
    attribute ``worker``, else its running fold's; a test fold's provenance while it runs),
    None when nothing says. ``seen``: its last sign of life as the database returned it (a
    trial's last heartbeat; a test fold's row was last written), None when unknown."""

    kind: str  # trial | test fold
    trial: int | None
    reproduction: int | None
    fold: int | None
    worker: str | None
    seen: Any


def running_units(engine: Engine, name: str) -> list[Running]:
    """What runs of study ``name`` as the store records it (a crashed worker's rows stay
    ``running`` until a worker recovers them): its running trials, by number, then its running
    test folds, by reproduction and fold. Empty for an unknown study."""
    with session(engine) as s:
        st = get_study(s, name)
        if st is None:
            return []
        numbers = (
            s.execute(
                select(Trial.number)
                .filter_by(study_id=st.id, state="running")
                .order_by(Trial.number)
            )
            .scalars()
            .all()
        )
        folds = (
            s.execute(
                select(FoldRun)
                .filter_by(study_id=st.id, status="running")
                .order_by(FoldRun.kind, FoldRun.reproduction, FoldRun.fold)
            )
            .scalars()
            .all()
        )
        fold_worker = {f.trial_number: _worker(f.provenance) for f in folds if f.kind == "search"}
        tests = [
            Running("test fold", None, f.reproduction, f.fold, _worker(f.provenance), f.updated)
            for f in folds
            if f.kind == "test"
        ]
    optuna = running_trial_workers(engine, name) if numbers else {}
    trials = []
    for n in numbers:
        worker, beat = optuna.get(n, (None, None))
        trials.append(Running("trial", n, None, None, worker or fold_worker.get(n), beat))
    return trials + tests


def _worker(provenance: dict[str, Any] | None) -> str | None:
    """The ``worker`` a running fold run's provenance records (None: not recorded)."""
    value = (provenance or {}).get("worker") if isinstance(provenance, dict) else None
    return None if value is None else str(value)
