"""A study's files on disk: the folder layout, archiving, and removing what retention frees.

Layout (``artifacts`` is the ``--artifacts`` folder)::

    <artifacts>/<study>/p-<artifact key>/<kind>/<params hash>/[rep<N>/]fold<k>/{last,best}.pt

The ``p-<artifact key>`` level (:func:`mlrc.config.identity.artifact_key`) keeps the folds of
different configurations apart: a new store never adopts another configuration's checkpoints.
Which files a fold keeps is :mod:`mlrc.search.retention`'s decision; this module only lists and
removes them. Nothing here opens the store except :func:`archive_study`, which renames a study's
rows through it and moves its folder last, inside the same transaction.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrc.config.identity import artifact_key
from mlrc.errors import alive
from mlrc.store import studies

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = [
    "ARTIFACTS_SETTING",
    "COLLECTED_SETTING",
    "DEFAULT_ARTIFACTS",
    "Freed",
    "archive_study",
    "artifact_root",
    "files_beyond",
    "fold_folder",
    "remove_files",
    "remove_tree",
    "moved_hint",
    "study_folder",
    "where_artifacts",
]

DEFAULT_ARTIFACTS = Path("mlrc-artifacts")  # the --artifacts folder when none is given
# the study setting that records where its artifacts are (the absolute --artifacts folder of
# its last run or test), so that report, rescore and export-model find them without being told
ARTIFACTS_SETTING = "artifacts.dir"
# the study setting that records what `mlrc gc` collected of it ({"keep": its policy}), so that
# a missing checkpoint's message names gc and not the study's own retention
COLLECTED_SETTING = "artifacts.collected"


def where_artifacts(settings: dict[str, Any] | None, given: Path | None) -> tuple[Path, str]:
    """The ``--artifacts`` folder of a study with ``settings``, and how it was found, for
    messages: ``given`` (the command line's) first, else the folder the store recorded, else
    :data:`DEFAULT_ARTIFACTS`."""
    if given is not None:
        return Path(given), f"--artifacts {given}"
    recorded = (settings or {}).get(ARTIFACTS_SETTING)
    if recorded:
        return Path(recorded), f"the store records its artifacts under {recorded}"
    return DEFAULT_ARTIFACTS, f"the default --artifacts {DEFAULT_ARTIFACTS}"


def moved_hint(how: str, given: Path | None) -> str:
    """What to do when a study's file is not where ``how`` (:func:`where_artifacts`) says."""
    if given is not None:
        return f"{how}: give --artifacts the folder that holds the study's folder"
    return f"{how}; if the folder moved, point at it with --artifacts NEW_FOLDER"


def study_folder(artifacts: Path, name: str) -> Path:
    """``<artifacts>/<study>``: everything a study writes."""
    return Path(artifacts) / name


def artifact_root(folder: Path, fingerprint: dict[str, Any]) -> Path:
    """``<study folder>/p-<artifact key>``: the folds of the configuration ``fingerprint``
    (``ResolvedStudy.fingerprint()`` or a stored ``mlrc_study.config``)."""
    return folder / f"p-{artifact_key(fingerprint)}"


def fold_folder(root: Path, kind: str, params_hash: str, reproduction: int, fold: int) -> Path:
    """``<root>/<kind>/<params hash>/[rep<N>/]fold<k>`` (root: :func:`artifact_root`)."""
    rep = f"rep{reproduction}" if kind == "test" else ""
    return root / kind / params_hash / rep / f"fold{fold}"


def archive_study(engine: Engine, name: str, artifacts: Path) -> str:
    """Rename a stored study, its Optuna study and its folder (``artifacts/NAME``) to
    ``NAME.old-K`` (the first free K) and point its checkpoint paths there; nothing is deleted.
    The folder moves last, inside the store's transaction: a failure before it rolls the rows
    back. Returns the new name."""
    return studies.archive_study(engine, name, Path(artifacts), move=os.replace)


@dataclass(frozen=True)
class Freed:
    """A file that retention removed (or would remove, on a dry run), with its size in bytes."""

    path: Path
    size: int


def file_size(path: Path) -> int:
    """``path``'s size in bytes; 0 when it is gone."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def files_beyond(folder: Path, keep: Collection[str]) -> list[Freed]:
    """The files of ``folder`` whose names are not in ``keep``, sorted (none when the folder is
    gone: another worker may have collected it a moment ago). A checkpoint being written by a
    live process is kept (:func:`in_flight`), and so the folder with it."""
    if not folder.is_dir():
        return []
    try:
        doomed = [
            f
            for f in sorted(folder.iterdir())
            if f.is_file() and f.name not in keep and not in_flight(f)
        ]
    except FileNotFoundError:
        return []
    return [Freed(f, file_size(f)) for f in doomed]


_TEMP = re.compile(r"\..+\.tmp-(.+)-(\d+)")  # mlrc.train.checkpoint's: .NAME.tmp-HOST-PID


def in_flight(f: Path) -> bool:
    """Is ``f`` a checkpoint's temp file whose writer may be alive (on another host, or a live
    pid here)? Two workers train one fold when a trial was declared lost and its retry runs:
    the first one's clean-up must not pull the second's write from under it."""
    m = _TEMP.fullmatch(f.name)
    return m is not None and (m[1] != socket.gethostname() or alive(int(m[2])))


def remove_files(freed: list[Freed], folder: Path, levels: int) -> None:
    """Delete ``freed`` (another worker may be deleting them too), then ``folder`` and up to
    ``levels - 1`` of its parents while they are left empty."""
    for f in freed:
        f.path.unlink(missing_ok=True)
    for d in [folder, *folder.parents][:levels]:
        try:
            os.rmdir(d)
        except OSError:  # not empty (or gone): stop here
            return


def remove_tree(folder: Path, dry_run: bool, exclude: set[Path]) -> list[Freed]:
    """Every file under ``folder`` (but ``exclude``), removed with the folder unless a dry run."""
    if not folder.is_dir():
        return []
    freed = [Freed(f, file_size(f)) for f in sorted(folder.rglob("*")) if f.is_file()]
    freed = [f for f in freed if f.path not in exclude]
    if not dry_run:
        shutil.rmtree(folder, ignore_errors=True)
    return freed
