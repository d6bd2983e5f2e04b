"""What the store hands out: frozen records of its rows (as Optuna's ``FrozenTrial``), built
inside the session that read them, never the ORM rows themselves (:mod:`mlrc.store.schema`),
which stay inside the store.

Each record holds a table's columns under the same names, so a caller reads ``st.config``,
``f.best_epoch`` or ``r.map_at_r`` as it would a row; it cannot write one back (the store's
named operations do that). Dictionaries (``config``, ``params``, ``extra``, ...) are the values
read, not copies.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

__all__ = [
    "BaselineRecord",
    "EmbeddingFileRecord",
    "FoldCurve",
    "FoldRunRecord",
    "HistoryRecord",
    "StudyProgress",
    "StudyRecord",
    "TestResultRecord",
    "TrialRecord",
    "from_row",
]

R = TypeVar("R")


def from_row(cls: type[R], row: Any) -> R:
    """The record ``cls`` of ``row`` (an ORM row, or anything with the record's attributes)."""
    return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class StudyRecord:
    """A study (``mlrc_study``): its identity, stored configuration and settings."""

    id: int
    name: str
    dataset: str
    loss: str
    strategy: str | None
    preset: str
    config: dict[str, Any]
    code_version: str
    created: dt.datetime
    settings: dict[str, Any] | None  # None: a study from before schema 6


@dataclass(frozen=True)
class TrialRecord:
    """A trial of a study (``mlrc_trial``): its parameters and how it ended."""

    id: int
    study_id: int
    number: int
    params: dict[str, Any]
    params_hash: str
    state: str  # running | complete | failed | pruned | interrupted
    value: float | None
    sem: float | None
    reason: str | None
    updated: dt.datetime


@dataclass(frozen=True)
class FoldRunRecord:
    """A fold run (``mlrc_fold_run``), keyed by (study, kind, params_hash, reproduction, fold)."""

    id: int
    study_id: int
    kind: str  # search | test
    params_hash: str
    reproduction: int
    fold: int
    trial_number: int | None
    seed: int
    status: str  # running | complete | failed | interrupted
    reason: str | None
    best_epoch: int | None
    map_at_r: float | None
    precision_at_1: float | None
    r_precision: float | None
    objective: float | None
    checkpoint: str | None
    wall_time_s: float | None
    device: str | None
    code_version: str | None
    threads: int | None
    provenance: dict[str, Any] | None
    updated: dt.datetime


@dataclass(frozen=True)
class FoldCurve:
    """A search fold run and its validation curve: (epoch, value) at each validated epoch,
    epoch 0 (the untrained model) included, epochs ascending; ``objective``: the fold's value
    (best over trained epochs) when it completed."""

    params_hash: str
    fold: int
    trial_number: int | None
    status: str  # running | complete | failed | interrupted | stopped
    reason: str | None
    objective: float | None
    points: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class TestResultRecord:
    """A test result (``mlrc_test_result``) of one reproduction, mode and fold (−1: aggregate)."""

    __test__ = False  # not a pytest test class

    id: int
    study_id: int
    reproduction: int
    mode: str  # separated | concatenated
    fold: int
    map_at_r: float
    precision_at_1: float
    r_precision: float
    params: dict[str, Any]
    extra: dict[str, Any] | None


@dataclass(frozen=True)
class EmbeddingFileRecord:
    """A tested reproduction's stored test embeddings (``mlrc_embedding_file``): the ``.npz``
    file's path relative to the study's folder, its sha256, dtype, shape and size in bytes."""

    study_id: int
    reproduction: int
    params_hash: str
    path: str
    sha256: str
    dtype: str
    folds: int
    n: int
    dim: int
    size: int
    retrieval: str  # "query→gallery" or "all vs all"


@dataclass(frozen=True)
class BaselineRecord:
    """One mode of an untrained baseline (``mlrc_baseline``): the tables' first row."""

    id: int
    key: str
    dataset: str
    kind: str  # pretrained | random_init
    label: str
    trunk: str
    mode: str
    map_at_r: float
    precision_at_1: float
    r_precision: float
    extra: dict[str, Any] | None
    config: dict[str, Any]
    device: str | None
    code_version: str | None
    created: dt.datetime


@dataclass(frozen=True)
class HistoryRecord:
    """A change of a study's settings (``mlrc_study_history``): ``old`` → ``new`` as text."""

    id: int
    study_id: int
    time: dt.datetime
    field: str
    old: str | None
    new: str | None
    code_version: str | None


@dataclass(frozen=True)
class StudyProgress:
    """What the store holds of one study's progress: its stored configuration, its trials'
    ``(state, reason)`` in order, the number of reproductions tested, its test fold runs'
    ``(status, reproduction, fold, reason)`` in order and its trials' numbers (as ``trials``)."""

    config: dict[str, Any]
    trials: list[tuple[str, str | None]]
    reproductions: int
    test_folds: list[tuple[str, int, int, str | None]]
    numbers: list[int] = field(default_factory=list)
