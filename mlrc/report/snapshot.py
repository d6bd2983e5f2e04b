"""What one dashboard page shows, read from the store in one go: a :class:`Snapshot` of the selected
studies and the test-result summary of :mod:`mlrc.report.tables`. Each study is a
:class:`StudyData`: its trials as :class:`TrialRow`, its search fold runs as :class:`FoldCurve`, the
retrieval view of its best reproduction as :class:`Retrieval`. For Optuna's figures, study by study,
its trials as Optuna stored them (:class:`OptunaReader`, :class:`OptunaTrials`).

The queries are :mod:`mlrc.store.snapshot`'s; this module only shapes their rows. The one other
source is the dataset, for the retrieval view's thumbnails (:func:`thumbnails`): opened from the
study's stored configuration on the machine that builds the page, if it can be.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import io
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlrc import data, store
from mlrc.config.presets import objective_label
from mlrc.errors import first_line
from mlrc.report.legend import pruning_label, risk_text
from mlrc.report.tables import collect, is_nonfinite, is_traditional, select_studies, summarize
from mlrc.report.values import model_sizes
from mlrc.store import reads
from mlrc.store.optuna_tables import has_optuna_tables
from mlrc.store.snapshot import StoredStudies, read_studies

if TYPE_CHECKING:
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial
    from sqlalchemy.engine import Engine

__all__ = [
    "THUMBNAIL_PX",
    "FoldCurve",
    "OptunaReader",
    "OptunaTrials",
    "Retrieval",
    "Snapshot",
    "StudyData",
    "TrialRow",
    "open_store",
    "read",
    "thumbnails",
]

THUMBNAIL_PX = 64  # the longer side of a retrieval view's thumbnails
log = logging.getLogger("mlrc")


@dataclass
class TrialRow:
    """One trial as the page shows it: state, mean validation MAP@R ± SEM, parameters."""

    number: int
    state: str
    value: float | None
    sem: float | None
    params: dict
    params_hash: str
    reason: str | None

    @property
    def nonfinite(self) -> bool:
        """Complete but scored 0: its loss or embeddings went non-finite (``reason`` says so)."""
        return is_nonfinite(self.state, self.reason)


@dataclass
class FoldCurve:
    """One search fold run: its validation MAP@R per epoch and its best (early-stop) epoch."""

    fold_run_id: int
    fold: int
    trial: int | None  # the trial that (last) ran it
    params_hash: str
    status: str
    best_epoch: int | None
    best_map_at_r: float | None
    epochs: list[int] = field(default_factory=list)
    map_at_r: list[float] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)


@dataclass
class Retrieval:
    """The retrieval view of a study's best reproduction (stored by the test stage, see
    :class:`mlrc.store.schema.RetrievalView`) and its thumbnails: dataset index → ``data:`` URI; empty,
    with ``unavailable`` saying why, when the dataset cannot be opened here."""

    reproduction: int
    map_at_r: float  # its concatenated (512-D) test MAP@R
    data: dict
    images: dict[int, str] = field(default_factory=dict)
    unavailable: str | None = None


@dataclass
class StudyData:
    """One study's section of the page: what it is, its trials and its search fold curves."""

    name: str
    dataset: str
    loss: str
    strategy: str | None
    preset: str
    created: dt.datetime | None
    code_version: str
    budget: int | None
    campaigns: list[str]
    trials: list[TrialRow]
    curves: list[FoldCurve]
    reproductions: int
    retrieval: Retrieval | None = None
    test_set_selection: bool = False  # traditional protocol: its epoch chosen on the test set
    value_label: str = "val MAP@R"  # what its search maximises (objective_label)
    curve_label: str = "val MAP@R"  # what its fold curves show, per epoch
    archived: bool = False  # archived by --force-new (NAME.old-K): replaced by study NAME
    pruning: str = ""  # its pruning rules and their measured risk ("" when it prunes nothing)
    sizes: tuple[int, int] | None = None  # (fold models, embedding size), None: not recorded


@dataclass
class Snapshot:
    """What one page shows, read in one go from the store."""

    where: str  # the store's URL without password
    scope: str  # "all studies", "campaign X, study a"
    campaigns: list[str]  # the selected campaigns
    studies: list[StudyData]
    summary: Any  # pandas DataFrame from mlrc.report.tables.summarize (test results)
    all_campaigns: list[str]  # every campaign in the store (links of the live page)
    read_at: dt.datetime


@dataclass(frozen=True)
class OptunaTrials:
    """A study's trials as Optuna stored them (frozen records, in order), its directions and
    metric names; or, when they cannot be read, only ``note`` saying why."""

    trials: tuple[FrozenTrial, ...] = ()
    directions: tuple[StudyDirection, ...] = ()
    metric_names: tuple[str, ...] | None = None
    note: str | None = None


class OptunaReader:
    """Optuna's tables in the store, read study by study (:meth:`read`); Optuna's storage is
    opened once, read-only, when the store has its tables."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url, self.engine = url, engine
        self._storage: Any = None

    def _open(self) -> Any:
        if self._storage is None:
            if not has_optuna_tables(self.engine):
                return None
            # read-only: never create Optuna's tables from a dashboard
            self._storage = store.optuna_storage(self.url, skip_table_creation=True)
        return self._storage

    def read(self, name: str) -> OptunaTrials:
        """The Optuna study ``name``'s trials, or a note: no Optuna tables, no such study, or
        tables that cannot be read."""
        import optuna  # heavy: only the pages that show a study's trials need it

        try:
            storage = self._open()
            if storage is None:
                return OptunaTrials(note="no Optuna tables in this store")
            ostudy = optuna.load_study(study_name=name, storage=storage)
            trials = tuple(ostudy.get_trials(deepcopy=False))
            directions, names = tuple(ostudy.directions), ostudy.metric_names
        except KeyError:
            return OptunaTrials(note=f"no Optuna study named {name} in this store")
        except Exception as e:  # e.g. Optuna's tables written by another Optuna version
            return OptunaTrials(note=f"Optuna's tables cannot be read ({first_line(e)})")
        return OptunaTrials(trials, directions, tuple(names) if names is not None else None)


def open_store(url: str) -> Engine:
    """The store's engine. Unlike the other commands the dashboard never creates a database:
    a SQLite URL naming a missing file is an error (a typo would show an empty store)."""
    return store.connect(url, read_only=True)


def read(
    engine: Engine,
    studies: list[str] | None = None,
    campaigns: list[str] | None = None,
    archived: bool = False,
) -> Snapshot:
    """Read the selected studies, in the order of the report's tables
    (:func:`mlrc.report.tables.select_studies`: each campaign's studies by position, then the
    named studies; with neither, every study; an archived study as there, ``archived`` keeps
    them all). Unknown names raise ``ReportError``."""
    names = select_studies(engine, studies, campaigns, archived)
    stored = read_studies(engine, names)
    data = _study_data(stored)
    summary = summarize(collect(engine, studies, campaigns, archived=archived))
    summary = summary[summary["study"].isin([st.name for st in data]) | summary["baseline"]]
    return Snapshot(
        store.redact(str(engine.url)),
        _scope(studies, campaigns),
        list(dict.fromkeys(campaigns or [])),
        data,
        summary,
        sorted({c for cs in stored.campaigns.values() for c in cs}),
        dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None),
    )


def _scope(studies: list[str] | None, campaigns: list[str] | None) -> str:
    """The page's title: "campaign X, study a", or "all studies" when nothing is selected."""
    parts = [f"campaign {c}" for c in dict.fromkeys(campaigns or [])]
    parts += [f"study {n}" for n in dict.fromkeys(studies or [])]
    return ", ".join(parts) or "all studies"


def _study_data(stored: StoredStudies) -> list[StudyData]:
    """The stored rows shaped as one :class:`StudyData` per study, in the stored order."""
    trials = _trials(stored)
    curves = _curves(stored)
    return [
        StudyData(
            st.name,
            st.dataset,
            st.loss,
            st.strategy,
            st.preset,
            st.created,
            st.code_version,
            _budget(st.config),
            stored.campaigns.get(st.id, []),
            _with_trial_numbers(trials[st.id], list(curves[st.id].values())),
            list(curves[st.id].values()),
            stored.reproductions.get(st.id, 0),
            _retrieval(stored.retrieval.get(st.id), st.config),
            is_traditional(st.config),
            objective_label(st.config),
            "test MAP@R §" if is_traditional(st.config) else "val MAP@R",
            reads.archived_of(st.name) is not None,
            _pruning(st.config, st.settings),
            _sizes(st.config),
        )
        for st in stored.studies
    ]


def _sizes(config: Any) -> tuple[int, int] | None:
    """(fold models, embedding size) of a study's configuration, None where it does not say."""
    sizes = model_sizes(config)
    k, d = sizes["fold_models"], sizes["embedding_size"]
    return None if k is None or d is None else (k, d)


def _trials(stored: StoredStudies) -> dict[int, list[TrialRow]]:
    """Study id → its trials, by number."""
    trials: dict[int, list[TrialRow]] = {st.id: [] for st in stored.studies}
    for t in stored.trials:
        trials[t.study_id].append(
            TrialRow(t.number, t.state, t.value, t.sem, t.params or {}, t.params_hash, t.reason)
        )
    return trials


def _curves(stored: StoredStudies) -> dict[int, dict[int, FoldCurve]]:
    """Study id → fold run id → its curve (validated epochs in order), by fold run id."""
    curves: dict[int, dict[int, FoldCurve]] = {st.id: {} for st in stored.studies}
    for f in stored.fold_runs:
        curves[f.study_id][f.id] = FoldCurve(
            f.id, f.fold, f.trial_number, f.params_hash, f.status, f.best_epoch, f.map_at_r
        )
    for e in stored.epochs:
        c = curves[e.study_id][e.fold_run_id]
        c.epochs.append(e.epoch)
        c.map_at_r.append(e.map_at_r)
        c.train_loss.append(e.train_loss)
    return curves


def _with_trial_numbers(trials: list[TrialRow], curves: list[FoldCurve]) -> list[TrialRow]:
    """Fold runs written without a trial number get the latest trial with their parameters."""
    by_hash = {t.params_hash: t.number for t in trials}
    for c in curves:
        if c.trial is None:
            c.trial = by_hash.get(c.params_hash)
    return trials


def _budget(config: dict | None) -> int | None:
    """The study's search budget from its stored configuration (None: unknown)."""
    try:
        return (
            config["study"]["search"].get("trials") or config["preset"]["search"]["trials"]
        ) or None
    except (KeyError, TypeError, AttributeError):
        return None


def _retrieval(row: Any, config: dict | None) -> Retrieval | None:
    """A study's stored retrieval view with its thumbnails (None: no view stored)."""
    if row is None:
        return None
    view = Retrieval(row.reproduction, row.map_at_r, row.data)
    wanted = [q["index"] for q in row.data.get("queries", [])]
    wanted += [n["index"] for q in row.data.get("queries", []) for n in q.get("neighbours", [])]
    try:
        ref = config["study"]["dataset"]
    except (KeyError, TypeError):
        view.unavailable = "the study's stored configuration names no dataset"
        return view
    view.images, view.unavailable = thumbnails(ref, wanted)
    return view


def thumbnails(ref: dict, indices: list[int]) -> tuple[dict[int, str], str | None]:
    """Thumbnails (≤ :data:`THUMBNAIL_PX` px, PNG or JPEG, whichever is smaller, as ``data:``
    URIs) of the items ``indices`` of the dataset ``ref`` (a study's ``dataset``: name, root,
    params); ``({}, why)`` when the dataset or one of the images cannot be read here."""
    key = json.dumps(ref, sort_keys=True, default=str)
    try:
        return {i: _thumbnail(key, int(i)) for i in dict.fromkeys(indices)}, None
    except Exception as e:  # noqa: BLE001 — any dataset trouble: the page says so in one line
        name = ref.get("name", "?") if isinstance(ref, dict) else "?"
        log.debug("retrieval thumbnails of %s: %s", name, e)
        return {}, f"dataset {name!r} cannot be read on this machine: {first_line(e)}"


@functools.lru_cache(maxsize=4)
def _dataset(key: str) -> data.ImageDataset:
    """The dataset of a study's stored ``dataset`` (as JSON), kept for the next pages."""
    ref = json.loads(key)
    return data.build(ref["name"], root=ref.get("root"), **(ref.get("params") or {}))


@functools.lru_cache(maxsize=8192)
def _thumbnail(key: str, index: int) -> str:
    """Item ``index`` of the dataset ``key`` as a small image ``data:`` URI."""
    from PIL import Image

    ds = _dataset(key)
    if not 0 <= index < len(ds):
        raise IndexError(f"image {index} is not in the dataset ({len(ds)} images)")
    im = ds.load_image(index).convert("RGB")
    im.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX), Image.Resampling.LANCZOS)
    encoded = []
    for fmt, mime, options in (
        ("PNG", "png", {"optimize": True}),
        ("JPEG", "jpeg", {"quality": 85}),
    ):
        buf = io.BytesIO()
        im.save(buf, format=fmt, **options)
        encoded.append((len(buf.getvalue()), mime, buf.getvalue()))
    _, mime, raw = min(encoded)
    return f"data:image/{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def _pruning(config: dict | None, settings: dict | None) -> str:
    """ "wilcoxon(p=0.3) + stop …; on the corpus (6 studies): …", or "" without pruning."""
    label = pruning_label(config, settings)
    if label == "none":
        return ""
    risk = risk_text((settings or {}).get("pruning_risk"))
    return f"{label}{'; ' + risk if risk else ''}"
