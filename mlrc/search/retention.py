"""Checkpoint retention (``artifacts.keep``): which files of a fold's folder stay once the
fold's result is stored. The test stage retrains from scratch and the search never reads a
finished fold's checkpoint again, so by default (``resume``) a fold holds ``last.pt`` only while
it runs, and the study keeps the ``best.pt`` of one reproduction's folds: the one
``mlrc study export-model`` exports by default (the best concatenated test MAP@R); ``best``
keeps the ``best.pt`` of every test reproduction and of the best trial's folds; ``all`` keeps
every file (mlrc before 0.3).

A file goes only after the store commit that makes it unnecessary (the fold's result, the
reproduction's test rows, the trial that is now better), and a fold row forgets its checkpoint
before the file is deleted — a kill in between leaves a file for ``mlrc gc``, never a row
pointing at nothing that is still needed. Running folds are never touched.

The stored test embeddings (``embeddings/test-rep<N>.npz``, :mod:`mlrc.search.embeddings`) are
results, not checkpoints: every policy keeps them while the study lives (``mlrc study rescore``
reads them), and ``mlrc gc`` counts their bytes as kept; an archived study's go with its
folder, counted as freed."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrc import store
from mlrc.config.identity import params_hash
from mlrc.search.artifacts import (
    COLLECTED_SETTING,
    Freed,
    artifact_root,
    file_size,
    files_beyond,
    fold_folder,
    remove_files,
    remove_tree,
    study_folder,
)
from mlrc.store import embeddings, history, results, studies, trials

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from mlrc.search.session import StudySession

__all__ = [
    "Freed",
    "StudyGc",
    "collect",
    "collect_study",
    "gc",
    "kept",
    "release_fold",
]

log = logging.getLogger("mlrc")

EVERYTHING = frozenset({"*"})


def kept(
    keep: str, kind: str, status: str, *, best_trial: bool, tested: bool, exported: bool = False
) -> frozenset[str]:
    """The names of the files a fold's folder keeps under policy ``keep`` (:data:`EVERYTHING`:
    all of them). ``best_trial``: the fold belongs to the best trial so far, or to a trial still
    running (another worker's, which may become the best); ``tested``: its reproduction's test
    rows are stored (a test fold's ``best.pt`` is read until then); ``exported``: its
    reproduction is the one ``mlrc study export-model`` exports by default (every policy keeps
    its ``best.pt``). A running or interrupted fold keeps everything: it resumes from its
    ``last.pt``."""
    if status in ("running", "interrupted") or keep == "all":
        return EVERYTHING
    if kind == "test" and not tested:
        return frozenset({"best.pt"})
    if kind == "test" and status == "complete" and (keep == "best" or exported):
        return frozenset({"best.pt"})
    if keep == "best" and status == "complete" and best_trial:
        return frozenset({"best.pt"})
    return frozenset()


def exported_reproduction(engine: Engine, study_id: int) -> tuple[int, str] | None:
    """(reproduction, params hash) that ``mlrc study export-model`` exports by default: the
    highest concatenated test MAP@R, the lowest number on a tie (None: nothing tested)."""
    rows = [
        r
        for r in results.test_results(engine, study_id)
        if r.mode == "concatenated" and r.fold == -1
    ]
    if not rows:
        return None
    best = min(rows, key=lambda r: (-r.map_at_r, r.reproduction))
    return best.reproduction, params_hash(best.params)


def release_fold(
    ctx: StudySession, kind: str, key: dict[str, Any], folder: Path, what: str
) -> None:
    """Right after a fold's result is stored: drop what the policy no longer needs (a search
    fold under ``best`` keeps its ``best.pt`` until its trial is known not to be the best)."""
    keep = kept(ctx.resolved.keep, kind, "complete", best_trial=True, tested=False)
    _apply(ctx.engine, key, folder, keep, what, dry_run=False)


def collect(ctx: StudySession) -> list[Freed]:
    """Apply the study's policy to all its finished folds (after a trial or a reproduction)."""
    if ctx.resolved.keep == "all":
        return []
    return collect_study(ctx.engine, ctx.study_id, ctx.artifact_root, ctx.resolved.keep)


def collect_study(
    engine: Engine, study_id: int, root: Path, keep: str, dry_run: bool = False
) -> list[Freed]:
    """The files of the study's finished folds under ``root`` that policy ``keep`` does not
    need, removed (``dry_run``: only listed)."""
    best = trials.best_trial_hash(engine, study_id)
    # a running trial (another worker's) may become the best: its finished folds wait
    contenders = {best} | trials.running_trial_hashes(engine, study_id)
    tested = results.tested_reproductions(engine, study_id)
    exported = exported_reproduction(engine, study_id)
    freed: list[Freed] = []
    for row in trials.fold_runs(engine, study_id):
        names = kept(
            keep,
            row.kind,
            row.status,
            best_trial=row.params_hash in contenders,
            tested=row.reproduction in tested,
            exported=row.kind == "test" and (row.reproduction, row.params_hash) == exported,
        )
        key = {
            "study_id": study_id,
            "kind": row.kind,
            "params_hash": row.params_hash,
            "reproduction": row.reproduction,
            "fold": row.fold,
        }
        what = f"{row.kind} fold {row.fold} of {row.params_hash}"
        folder = fold_folder(root, row.kind, row.params_hash, row.reproduction, row.fold)
        freed += _apply(engine, key, folder, names, what, dry_run)
    return freed


def _apply(
    engine: Engine,
    key: dict[str, Any],
    folder: Path,
    keep: frozenset[str],
    what: str,
    dry_run: bool,
) -> list[Freed]:
    """Remove the files of ``folder`` not named in ``keep`` (the row forgets ``best.pt`` first),
    then the folder and its parents up to the kind's folder when they are left empty."""
    if keep is EVERYTHING:
        return []
    freed = files_beyond(folder, keep)
    if dry_run or not freed:
        return freed
    if any(f.path.name == "best.pt" for f in freed):
        trials.forget_checkpoint(engine, key, what)
    remove_files(freed, folder, levels=3 if key["kind"] == "test" else 2)
    return freed


ARCHIVED = re.compile(r"\.old-\d+$")  # NAME.old-K: a study archived by --force-new


@dataclass
class StudyGc:
    """What ``mlrc gc`` freed (or would free) for one study."""

    study: str
    policy: str  # resume | best | all | archived
    freed: list[Freed]
    # its stored test embeddings, kept under every policy (their sizes on disk now)
    embeddings: list[Freed] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes freed."""
        return sum(f.size for f in self.freed)

    @property
    def embeddings_size(self) -> int:
        """Bytes of stored test embeddings kept."""
        return sum(f.size for f in self.embeddings)


def stored_embeddings(engine: Engine, study_id: int, folder: Path) -> list[Freed]:
    """The study's stored test-embedding files that exist under its ``folder``, with sizes."""
    paths = [folder / f.path for f in embeddings.embedding_files(engine, study_id)]
    return [Freed(p, file_size(p)) for p in paths if p.is_file()]


def gc(
    engine: Engine,
    artifacts: Path,
    names: list[str] | None = None,
    keep: str | None = None,
    dry_run: bool = False,
) -> list[StudyGc]:
    """Free the artifacts that no study needs: all of an archived study's (``NAME.old-K``: its
    results are in the store, its checkpoints are never read again), and the finished folds'
    files that each study's policy (the last ``artifacts.keep`` in its history, else
    ``resume``; ``keep`` overrides it) does not keep. Only the folders of the studies' own
    configurations are touched: other folders under a study's (another store's study of the
    same name, say) are left alone. ``names``: these studies only (unknown: StoreError). The
    stored test embeddings of a live study stay (:attr:`StudyGc.embeddings` counts them)."""
    rows = studies.studies(engine)
    if names:
        missing = sorted(set(names) - {r.name for r in rows})
        if missing:
            raise store.StoreError(
                f"no study {', '.join(map(repr, missing))} in {store.redact(str(engine.url))}"
            )
        rows = [r for r in rows if r.name in names]
    out = []
    for row in rows:
        root = artifact_root(study_folder(artifacts, row.name), row.config)
        if ARCHIVED.search(row.name):
            freed = collect_study(engine, row.id, root, "resume", dry_run)
            freed += remove_tree(
                study_folder(artifacts, row.name), dry_run, {f.path for f in freed}
            )
            out.append(StudyGc(row.name, "archived", freed))
            continue
        own = history.last_values(engine, row.id).get("artifacts.keep") or "resume"
        policy = keep or own
        freed = collect_study(engine, row.id, root, policy, dry_run)
        if freed and not dry_run and policy != own:  # a missing model's message names gc
            studies.record_setting(engine, row.id, COLLECTED_SETTING, {"keep": policy})
        kept = stored_embeddings(engine, row.id, study_folder(artifacts, row.name))
        out.append(StudyGc(row.name, policy, freed, kept))
    return out
