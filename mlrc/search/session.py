"""A study session: a study opened by this process, as one :class:`StudySession` that the search,
the test stage and the backends work through. The study is connected, registered (or checked against
the store) and locked on SQLite, its dataset and split loaded. What makes two studies "the same" is
:mod:`mlrc.config.identity`'s; where their files live is :mod:`mlrc.search.artifacts`'s."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import Timeout

from mlrc import __version__, data, store
from mlrc.config import (
    BUDGETS,
    SETTINGS,
    ResolvedStudy,
    budgets,
    file_settings,
    identity_change,
    with_settings,
)
from mlrc.config.identity import code_version, random_augmentation
from mlrc.config.load import ConfigError
from mlrc.config.ranks import check_ranks
from mlrc.config.splits import build_split
from mlrc.data.base import ImageDataset
from mlrc.protocol.splits import Split
from mlrc.search.artifacts import (
    ARTIFACTS_SETTING,
    archive_study,
    artifact_root,
    fold_folder,
    study_folder,
)
from mlrc.search.errors import StudyError
from mlrc.search.pruning import measured_risk
from mlrc.search.retention import collect_study
from mlrc.search.tracking import Tracker, open_tracker, study_run
from mlrc.search.warm_start import check_warm_start
from mlrc.store import history, studies
from mlrc.train import threads as cpu
from mlrc.train.launch import rank_devices

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

log = logging.getLogger("mlrc")


@dataclass
class StudySession:
    """A study opened by this process: everything its search, test stage and backends need,
    built once (:func:`open_study`, :func:`build_session`). ``artifacts``: the study's folder
    (:func:`~mlrc.search.artifacts.study_folder`)."""

    resolved: ResolvedStudy
    url: str
    engine: Engine
    artifacts: Path
    device: str
    dataset: ImageDataset
    split: Split
    study_id: int
    progress: bool = True
    tracker: Tracker = dataclass_field(default_factory=Tracker)  # MLflow/W&B runs (none by default)
    threads: int | None = None  # torch intra-op threads of every fold: the study's (stored)
    # the devices of a fold's K ranks (rank r on devices[r]); empty: one process on ``device``
    devices: tuple[str, ...] = ()
    # what starts a fold's K ranks: (spec, devices, threads, on_validation) → result; None:
    # torchrun's launcher on this node (mlrc.train.launch.train_fold_ranks)
    launcher: Callable[..., Any] | None = None
    # the study's lock file on SQLite (:class:`~mlrc.store.HeldFile`: its check()), held by
    # open_study; None on PostgreSQL (the advisory lock of each claim) and in other processes
    lock: Any = None

    @property
    def name(self) -> str:
        """The study's name (also its Optuna study's)."""
        return self.resolved.study.name

    @property
    def artifact_root(self) -> Path:
        """``<study folder>/p-<artifact key>``: this configuration's folds."""
        return artifact_root(self.artifacts, self.resolved.fingerprint())

    def fold_dir(self, kind: str, params_hash: str, reproduction: int, fold: int) -> Path:
        """A fold's folder: ``<artifact root>/<kind>/<params hash>/[rep<N>/]fold<k>``."""
        return fold_folder(self.artifact_root, kind, params_hash, reproduction, fold)


# --- opening a study ---------------------------------------------------------------------------


def rank_plan(
    resolved: ResolvedStudy,
    device: str,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> tuple[str, ...]:
    """The devices of a fold's ranks for ``procs`` processes per trial (None: the preset's
    ``processes_per_trial``): ``()`` for one process on ``device``, else one per rank
    (:func:`mlrc.train.launch.rank_devices`). ``ConfigError`` in one line when the study cannot
    be split so (:func:`mlrc.config.ranks.check_ranks`) or the devices do not allow it."""
    k = procs or resolved.preset.processes_per_trial
    if k == 1 and not devices:
        _same_ranks(resolved, k)
        return ()
    check_ranks(resolved, k, "--procs-per-trial" if procs else "")
    try:
        planned = rank_devices(device, k, devices)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _same_ranks(resolved, k)
    return tuple(planned) if k > 1 else ()


def _same_ranks(resolved: ResolvedStudy, k: int) -> None:
    """``ConfigError`` when ``k`` processes per trial compute other numbers than the study's
    own ``processes_per_trial`` (random augmentation: each rank draws from its own stream)."""
    studied = resolved.preset.processes_per_trial
    if k != studied and random_augmentation(resolved.preset.image.model_dump(mode="json")):
        raise ConfigError(
            f"--procs-per-trial {k}: study {resolved.study.name!r} trains with random "
            f"augmentation, which each process draws from its own stream, so {k} processes "
            f"compute other numbers than its processes_per_trial: {studied}; set "
            "processes_per_trial in the study file (another study) or leave out --procs-per-trial"
        )


@contextmanager
def open_study(
    resolved: ResolvedStudy,
    url: str,
    artifacts: str | Path,
    device: str = "cpu",
    progress: bool = True,
    force_new: bool = False,
    budgets_used: Iterable[str] = BUDGETS,
    threads: int | None = None,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> Iterator[StudySession]:
    """Connect, register (or check) the study, load the dataset; hold a lock for SQLite.
    ``force_new``: a stored study of the same name with another configuration is archived
    (:func:`archive_study`) and this one starts afresh; otherwise that is refused. ``threads``:
    ``--threads`` (None: this process's, see :func:`register_study`). ``procs``/``devices``:
    ``--procs-per-trial``/``--devices`` (None: the preset's ``processes_per_trial``, and
    :func:`rank_plan`'s devices), checked before anything is stored."""
    ranks = rank_plan(resolved, device, procs, devices)
    engine = store.connect(url)
    with sqlite_lock(engine, resolved.study.name) as lock:
        if force_new:
            old = studies.stored_config(engine, resolved.study.name)
            if old is not None and identity_change(old, resolved.fingerprint()) is not None:
                new_name = archive_study(engine, resolved.study.name, Path(artifacts))
                log.warning("the stored study %r was archived as %r", resolved.study.name, new_name)
        check_warm_start(engine, resolved)  # a refused warm start leaves nothing stored
        ctx = build_session(
            resolved, url, artifacts, device, progress, engine, budgets_used, threads, len(ranks)
        )
        ctx.devices, ctx.lock = ranks, lock
        for warning in data.check_dataset(ctx.dataset, ctx.split.trainval_classes):
            log.warning("%s", warning)  # one-image training classes, duplicate files
        try:
            yield ctx
        finally:
            ctx.tracker.close()  # tracked runs this process left open: interrupted


def build_session(
    resolved: ResolvedStudy,
    url: str,
    artifacts: str | Path,
    device: str = "cpu",
    progress: bool = True,
    engine: Engine | None = None,
    budgets_used: Iterable[str] = BUDGETS,
    threads: int | None = None,
    procs: int = 1,
) -> StudySession:
    """Register (or check) the study and load its dataset and split, without any lock (for a
    process that works for a study someone else holds: a Ray trial or fold task). The session
    works to the study's settings as stored (:func:`register_study`). ``procs`` K > 1: every
    fold's batches must split into K ranks (checked on the split, before registering)."""
    engine = engine or store.connect(url)
    ds = data.build(
        resolved.study.dataset.name,
        root=resolved.study.dataset.root,
        **resolved.study.dataset.params,
    )
    split = split_of(resolved, ds)  # before registering: a bad split file stores nothing
    counts = [len(f.train_classes) for f in split.folds]  # a fold's smaller batches must split
    check_ranks(resolved, procs, "processes per trial", counts)
    folder = study_folder(Path(artifacts), resolved.study.name)
    study_id, settings = _register(engine, resolved, budgets_used, threads, folder)
    # where its artifacts are: report, rescore and export-model find them without --artifacts
    studies.record_setting(engine, study_id, ARTIFACTS_SETTING, str(Path(artifacts).resolve()))
    resolved = with_settings(resolved, settings)
    ctx = StudySession(
        resolved,
        url,
        engine,
        folder,
        device,
        ds,
        split,
        study_id,
        progress,
        threads=settings["threads"],
    )
    cpu.apply_threads(ctx.threads)  # the study's, for all it computes (folds set it again)
    # this process's handle on the study's tracked runs
    ctx.tracker = open_tracker(resolved.study.tracking, study_run(resolved, len(split.folds)))
    return ctx


def split_of(resolved: ResolvedStudy, ds: ImageDataset) -> Split:
    """The study's split of ``ds``: MLRC's (the preset's ``folds`` and ``split_scheme``), or
    its ``split:`` (predefined or a split file) checked against the dataset's classes."""
    return build_split(
        resolved.split,
        ds,
        resolved.preset.folds,
        resolved.preset.split_scheme,
        f"{resolved.source or 'study'}: split",
    )


@contextmanager
def sqlite_lock(engine: Engine, name: str) -> Iterator[store.HeldFile | None]:
    """One process per study on a SQLite file: a second one is refused, never interleaved. The
    block gets the lock file held (None: PostgreSQL, an in-memory database)."""
    database = store.sqlite_path(engine)
    if database is None:
        yield None
        return
    path = Path(f"{database}.{name}.lock")
    if not path.parent.is_dir():  # filelock would create it
        raise StudyError(f"{path}: cannot create the study's lock file (No such file or directory)")

    def write_pid(fd: int) -> None:  # the holder's pid, for the message a second process gets
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)

    # a kernel lock, released when the process dies; its file removed when the command ends
    with ExitStack() as held:
        try:
            lock = held.enter_context(
                store.removed_lock_file(str(path), blocking=False, on_acquired=write_pid)
            )
        except Timeout:  # before OSError: filelock's Timeout is a TimeoutError
            try:
                pid = path.read_text().strip() or "?"
            except OSError:
                pid = "?"
            raise StudyError(
                f"study {name!r} is already running on {engine.url.database} (pid {pid}); "
                "SQLite allows one process per study — use a PostgreSQL URL for parallel workers"
            ) from None
        except OSError as e:
            raise StudyError(
                f"{path}: cannot create the study's lock file ({e.strerror})"
            ) from None
        yield lock


def register_study(
    engine: Engine,
    resolved: ResolvedStudy,
    budgets_used: Iterable[str] = BUDGETS,
    threads: int | None = None,
) -> int:
    """The study's row id, the row created if new (its settings: the budgets and retention it
    resolves to, ``threads`` or this process's ``--threads`` or
    :func:`~mlrc.train.threads.study_threads`); a stored study of the same name with another
    configuration is a :class:`StudyError` naming the first difference. A stored study's settings change as :func:`settle` says, recorded in its
    history (its retention only where its artifacts are known: :func:`build_session`)."""
    return _register(engine, resolved, budgets_used, threads, None)[0]


def _register(
    engine: Engine,
    resolved: ResolvedStudy,
    budgets_used: Iterable[str],
    threads: int | None,
    artifacts: Path | None,
) -> tuple[int, dict[str, Any]]:
    """:func:`register_study`, with the study's settings as they stand after it (the budgets
    too); ``artifacts``: the study's folder (None: its retention is left as stored)."""
    config = resolved.fingerprint()
    study = resolved.study
    threads = threads or cpu.requested_threads()
    initial = {
        "artifacts.keep": resolved.keep,
        "threads": threads or cpu.study_threads(),
        "file": file_settings(resolved),
    }
    if (risk := measured_risk(resolved)) is not None:  # pruning: its replay risk travels with it
        initial["pruning_risk"] = risk
    study_id, stored = studies.ensure_study(
        engine,
        study.name,
        dataset=study.dataset.name,
        loss=study.loss.name,
        strategy=study.strategy.name if study.strategy else None,
        preset=study.preset,
        config=config,
        code_version=__version__,
        settings=initial,
    )
    if (changed := identity_change(stored, config)) is not None:
        raise StudyError(
            f"study {study.name!r} already exists in the store with a different "
            f"configuration ({changed}); give the study a new name, or pass --force-new to "
            "archive the stored one as NAME.old-K and start afresh"
        )
    fields = (*budgets_used, *(("artifacts.keep",) if artifacts is not None else ()))
    if artifacts is not None:
        _check_retention(engine, study_id, resolved, fields, threads, artifacts)
    out: dict[str, Any] = {}

    def diff(stored: dict, settings: dict | None, last: dict) -> tuple[list, Any, Any]:
        changes, new_config, new_settings = settle(
            stored, settings, last, resolved, fields, threads
        )
        out.update(new_settings or settings)
        out.update(budgets(new_config or stored))
        return changes, new_config, new_settings

    changes = history.record_changes(engine, study_id, diff, code_version())
    for field, old, new in changes:
        log.warning("study %r: %s %s → %s (recorded in its history)", study.name, field, old, new)
    return study_id, out


KEEP_ORDER = ("resume", "best", "all")  # retention policies, from keeping least to most


def settle(
    config: dict[str, Any],
    settings: dict[str, Any] | None,
    last: dict[str, str | None],
    resolved: ResolvedStudy,
    fields: Iterable[str],
    threads: int | None,
) -> tuple[list[tuple], dict[str, Any] | None, dict[str, Any] | None]:
    """What a run changes of a stored study's settings: (changes, configuration to store or
    None, settings to store or None). Of ``fields`` (the budgets this run works to, and
    ``artifacts.keep`` where considered), a value given on the command line
    (``resolved.given``) becomes the study's; else a value of the study file that differs from
    the one it gave last time (a file edit) does; else the study's stands — a flag's absence is
    no change. ``threads`` (``--threads``), when given, is the study's from then on. A study
    from before schema 6 (``settings`` None) starts at its stored budgets, its last recorded
    retention, and the file as it is now."""
    fields = tuple(fields)
    now_file = file_settings(resolved)
    legacy = settings is None
    if settings is None:
        keep = last.get("artifacts.keep") or "resume"
        settings = {"artifacts.keep": keep, "threads": None, "file": dict(now_file)}
    new_settings = {**settings, "file": dict(settings.get("file") or {})}
    was = {**budgets(config), "artifacts.keep": settings["artifacts.keep"]}
    now = dict(was)
    for f in fields:
        if f in resolved.given:
            now[f] = resolved.given[f]
        elif now_file[f] != new_settings["file"].get(f, now_file[f]):
            now[f] = now_file[f]
        new_settings["file"][f] = now_file[f]
    new_settings["artifacts.keep"] = now["artifacts.keep"]
    changes = [(f, was[f], now[f]) for f in SETTINGS if was[f] != now[f]]
    old_threads = settings.get("threads")
    new_settings["threads"] = threads or old_threads or cpu.study_threads()
    if new_settings["threads"] != old_threads:
        changes.append(("threads", old_threads, new_settings["threads"]))
    if "pruning_risk" in new_settings and now["search.trials"] != was["search.trials"]:
        new_settings["pruning_risk"] = measured_risk(resolved, now["search.trials"])
    new_config = None
    if any(f in BUDGETS for f, _, _ in changes):
        new_config = {
            **config,
            "trials": now["search.trials"],
            "reproductions": now["test.reproductions"],
        }
    return changes, new_config, None if new_settings == settings and not legacy else new_settings


def _check_retention(
    engine: Engine,
    study_id: int,
    resolved: ResolvedStudy,
    fields: tuple[str, ...],
    threads: int | None,
    artifacts: Path,
) -> None:
    """Lowering a study's retention deletes the checkpoints it kept: only on the command line
    (``--keep``), which logs what it deletes; a study file that lowers it while such files
    exist is a :class:`StudyError` saying what they are and how to go on."""
    config, settings, last = history.stored_settings(engine, study_id)
    changes, _, _ = settle(config, settings, last, resolved, fields, threads)
    for field, old, new in changes:
        if field != "artifacts.keep" or KEEP_ORDER.index(new) >= KEEP_ORDER.index(old):
            continue
        root = artifact_root(artifacts, config)
        doomed = collect_study(engine, study_id, root, new, dry_run=True)
        if not doomed:
            return
        what = f"{len(doomed)} kept checkpoint files ({sum(f.size for f in doomed) / 1e6:.1f} MB)"
        name = resolved.study.name
        if field in resolved.given:
            log.warning("study %r: --keep %s deletes %s under %s", name, new, what, root)
            return
        raise StudyError(
            f"study {name!r}: the study file lowers artifacts.keep {old} → {new}, which would "
            f"delete {what} under {root}; to do so, give --keep {new} on the command line "
            f"(or delete them first: mlrc gc --study {name} --keep {new}); to keep them, set "
            f"artifacts.keep: {old} in the file"
        )
