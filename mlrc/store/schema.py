"""mlrc's tables beside Optuna's, in one SQL database (SQLite or PostgreSQL).

Tables (prefix ``mlrc_``): ``study``, ``trial``, ``fold_run``, ``epoch_metric``, ``test_result``,
``baseline`` + ``study_baseline`` (the untrained "Pretrained" row), ``campaign_study`` (which
studies a campaign holds), ``study_history``, ``retrieval_view`` (the dashboard's sample
retrievals and embedding map of a reproduction), ``embedding_file`` (a reproduction's stored test
embeddings: path and sha256), ``rescored`` (metrics computed after the fact from them), ``meta``
(schema version). Metric columns are fractions in [0, 1].
Every write is idempotent: rows have natural unique keys and are upserted, so re-running
finished work writes nothing new.

``fold_run`` rows are keyed by (study, kind, params_hash, reproduction, fold): ``kind`` is
``search`` (reproduction 0) or ``test`` (reproductions 1..N); ``params_hash`` identifies the
hyperparameters, so a retried trial with the same parameters finds its finished folds.

A change to these classes is a new Alembic revision in ``mlrc/store/migrations/versions/`` and a
new :data:`SCHEMA_VERSION` (see :mod:`mlrc.store.migrate`).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Written to mlrc_meta.schema_version, which older mlrc releases check: they refuse a store of a
# newer version. 2: test_result.extra (analysis metrics); 3: fold_run.objective/code_version and
# the baseline tables; 4: the study history and fold_run.threads; 5: the retrieval views; 6: the
# study's settings; 7: fold_run.provenance; 8: the stored test embeddings and the metrics
# re-scored from them. Each version is an Alembic revision (mlrc.store.migrate.REVISIONS).
SCHEMA_VERSION = 8


class Base(DeclarativeBase):
    """The declarative base of mlrc's tables (``Base.metadata``: all of them, none of Optuna's)."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Meta(Base):
    """Key/value facts about the store: ``schema_version`` (see :data:`SCHEMA_VERSION`)."""

    __tablename__ = "mlrc_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Study(Base):
    __tablename__ = "mlrc_study"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    dataset: Mapped[str] = mapped_column(String(64))
    loss: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str | None] = mapped_column(String(64))
    preset: Mapped[str] = mapped_column(String(256))
    config: Mapped[dict] = mapped_column(JSON)
    code_version: Mapped[str] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    # what may change without changing an identity, as it stands now (schema 6; NULL: a study
    # from before): ``threads`` (torch intra-op threads of every fold), ``artifacts.keep``, and
    # ``file``: the budgets and retention its study file gave when last read (a flag's value
    # stays the study's until the file itself changes); see mlrc.search.session
    settings: Mapped[dict | None] = mapped_column(JSON)


class Trial(Base):
    __tablename__ = "mlrc_trial"
    __table_args__ = (UniqueConstraint("study_id", "number"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    number: Mapped[int] = mapped_column(Integer)  # Optuna trial number
    params: Mapped[dict] = mapped_column(JSON)
    params_hash: Mapped[str] = mapped_column(String(64))
    # running | complete | failed | pruned | interrupted
    state: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)  # mean val MAP@R over folds
    sem: Mapped[float | None] = mapped_column(Float)  # SEM of val MAP@R over folds
    # why it failed / was pruned; on a *complete* trial: why it was scored 0 (its loss or
    # embeddings went non-finite; the reference harness gives such a trial (0, 0)), see
    # NONFINITE
    reason: Mapped[str | None] = mapped_column(Text)
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=_now, onupdate=_now)


class FoldRun(Base):
    __tablename__ = "mlrc_fold_run"
    __table_args__ = (UniqueConstraint("study_id", "kind", "params_hash", "reproduction", "fold"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    kind: Mapped[str] = mapped_column(String(8))  # search | test
    params_hash: Mapped[str] = mapped_column(String(64))
    reproduction: Mapped[int] = mapped_column(Integer)  # 0 for search, 1..N for test
    fold: Mapped[int] = mapped_column(Integer)
    trial_number: Mapped[int | None] = mapped_column(Integer)  # trial that (last) ran it
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # running | complete | failed | interrupted
    reason: Mapped[str | None] = mapped_column(Text)
    best_epoch: Mapped[int | None] = mapped_column(Integer)
    # validation metrics of best_epoch (the epoch best.pt holds; 0 = the untrained model)
    map_at_r: Mapped[float | None] = mapped_column(Float)
    precision_at_1: Mapped[float | None] = mapped_column(Float)
    r_precision: Mapped[float | None] = mapped_column(Float)
    # the value the search sees: best val MAP@R over trained epochs (NULL in rows written
    # before schema 3, when epoch 0 was never best: map_at_r is that value there)
    objective: Mapped[float | None] = mapped_column(Float)
    checkpoint: Mapped[str | None] = mapped_column(Text)  # URI of the best checkpoint
    wall_time_s: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(32))  # of the run that computed it
    code_version: Mapped[str | None] = mapped_column(String(64))  # likewise
    threads: Mapped[int | None] = mapped_column(Integer)  # torch intra-op threads (schema 4)
    # what computed it (schema 7): mlrc.train.numerics.provenance, see mlrc.store.provenance
    provenance: Mapped[dict | None] = mapped_column(JSON)
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=_now, onupdate=_now)


class EpochMetric(Base):
    __tablename__ = "mlrc_epoch_metric"
    __table_args__ = (UniqueConstraint("fold_run_id", "epoch"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    fold_run_id: Mapped[int] = mapped_column(ForeignKey("mlrc_fold_run.id"))
    epoch: Mapped[int] = mapped_column(Integer)
    train_loss: Mapped[float | None] = mapped_column(Float)  # mean over the epoch's iterations
    map_at_r: Mapped[float] = mapped_column(Float)
    precision_at_1: Mapped[float] = mapped_column(Float)
    r_precision: Mapped[float] = mapped_column(Float)


class StudyHistory(Base):
    """A change of what a study's file may change without changing its numbers: its budgets
    (``search.trials``, ``test.reproductions``) and its checkpoint retention
    (``artifacts.keep``); ``old`` → ``new`` as text, with the code version that saw it."""

    __tablename__ = "mlrc_study_history"
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    time: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    field: Mapped[str] = mapped_column(String(64))
    old: Mapped[str | None] = mapped_column(String(256))
    new: Mapped[str | None] = mapped_column(String(256))
    code_version: Mapped[str | None] = mapped_column(String(64))


class TestResult(Base):
    __test__ = False  # not a pytest test class
    __tablename__ = "mlrc_test_result"
    __table_args__ = (UniqueConstraint("study_id", "reproduction", "mode", "fold"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    reproduction: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))  # separated | concatenated
    fold: Mapped[int] = mapped_column(Integer)  # −1: the aggregate (mean of folds / 512-D)
    map_at_r: Mapped[float] = mapped_column(Float)
    precision_at_1: Mapped[float] = mapped_column(Float)
    r_precision: Mapped[float] = mapped_column(Float)
    params: Mapped[dict] = mapped_column(JSON)
    # analysis metrics beside MAP@R: recall_at_1/2/4/8, nmi, map_at_1000 (fractions),
    # spectral_decay, pi_ratio, metrix_utilization (squared distance on unit vectors)
    extra: Mapped[dict | None] = mapped_column(JSON)


class RetrievalView(Base):
    """What the dashboard's retrieval view shows of one tested reproduction, computed by the test
    stage from the 512-D concatenated test embeddings while they exist (checkpoints may be
    deleted right after): sample queries with their k nearest test items, and a 2-D map of the
    test embeddings. ``data`` (JSON): ``{"k", "n", "queries": [{"index", "label", "name",
    "neighbours": [{"index", "label", "name", "same"}, ...]}, ...], "map": {"method", "index",
    "x", "y", "label"}}``; ``index`` is a dataset index, ``label`` a dataset class label
    (see :func:`mlrc.protocol.retrieval.retrieval_view`). Schema 5."""

    __tablename__ = "mlrc_retrieval_view"
    __table_args__ = (UniqueConstraint("study_id", "reproduction"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    reproduction: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict] = mapped_column(JSON)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class EmbeddingFile(Base):
    """One tested reproduction's test embeddings on disk (schema 8): a NumPy ``.npz`` written by
    the test stage (:mod:`mlrc.search.embeddings`). ``path``: relative to the study's artifact
    folder (``<artifacts>/<study>``), so an archived or moved folder still finds it; ``sha256``:
    of the file's bytes, checked before every use; ``dtype`` float16 or float32; ``folds`` ×
    ``n`` × ``dim`` the shape of its ``separated`` array; ``size`` in bytes; ``retrieval``: how
    the test stage ranked its rows, ``query→gallery`` (the dataset's roles) or ``all vs all``."""

    __tablename__ = "mlrc_embedding_file"
    __table_args__ = (UniqueConstraint("study_id", "reproduction"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    reproduction: Mapped[int] = mapped_column(Integer)
    params_hash: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    folds: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(Integer)
    retrieval: Mapped[str] = mapped_column(String(16))  # "query→gallery" or "all vs all"
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class Rescored(Base):
    """A metric computed after the fact from a reproduction's stored test embeddings (schema 8;
    ``mlrc study rescore``): one value (a fraction) per (reproduction, mode, fold, metric) as in
    :class:`TestResult` (fold −1: the separated mean or the 512-D row); ``metric`` the metric's
    column key (``ndcg_at_10``); ``sha256`` of the embedding file it was computed from."""

    __tablename__ = "mlrc_rescored"
    __table_args__ = (UniqueConstraint("study_id", "reproduction", "mode", "fold", "metric"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    reproduction: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))  # separated | concatenated
    fold: Mapped[int] = mapped_column(Integer)
    metric: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    sha256: Mapped[str] = mapped_column(String(64))
    code_version: Mapped[str | None] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class Baseline(Base):
    """An untrained model on a study's test classes: the tables' first row of a dataset block.

    ``kind`` ``pretrained`` (the ImageNet trunk alone, as the reference harness's
    "untrained_trunk", epoch −1) or ``random_init`` (a trunk trained from scratch by the preset,
    randomly initialised, seeded). Computed once per ``key`` (a hash of what defines its numbers:
    dataset, trunk, weights, eval transform, split) and shared by the studies that use it
    (:class:`StudyBaseline`). ``separated`` and ``concatenated`` hold the same trunk features, as
    the reference does for untrained status; a single value, no confidence interval."""

    __tablename__ = "mlrc_baseline"
    __table_args__ = (UniqueConstraint("key", "mode"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64))
    dataset: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # pretrained | random_init
    label: Mapped[str] = mapped_column(String(128))  # row label, e.g. "Pretrained (bninception)"
    trunk: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(16))  # separated | concatenated
    map_at_r: Mapped[float] = mapped_column(Float)
    precision_at_1: Mapped[float] = mapped_column(Float)
    r_precision: Mapped[float] = mapped_column(Float)
    extra: Mapped[dict | None] = mapped_column(JSON)  # analysis metrics, as test_result.extra
    config: Mapped[dict] = mapped_column(JSON)  # what the key hashes
    device: Mapped[str | None] = mapped_column(String(32))
    code_version: Mapped[str | None] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class StudyBaseline(Base):
    """Which baseline (``mlrc_baseline.key``) belongs to a study's dataset block."""

    __tablename__ = "mlrc_study_baseline"
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"), unique=True)
    key: Mapped[str] = mapped_column(String(64))


class CampaignStudy(Base):
    """Membership of a study in a campaign (a grid of studies: dataset × loss [× strategy])."""

    __tablename__ = "mlrc_campaign_study"
    __table_args__ = (UniqueConstraint("campaign", "study_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    campaign: Mapped[str] = mapped_column(String(256), index=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("mlrc_study.id"))
    position: Mapped[int] = mapped_column(Integer)  # order in the campaign file (table rows)
    campaign_config: Mapped[dict] = mapped_column(JSON)  # the campaign file, resolved


METRIC_COLUMNS = ("map_at_r", "precision_at_1", "r_precision")
NONFINITE = "non-finite"  # reasons of trials scored 0 start with it (state complete, value 0)
