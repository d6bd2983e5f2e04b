"""A tested reproduction's test embeddings on disk: one NumPy ``.npz`` per reproduction, written
by the test stage and read back (hash checked) by ``mlrc study rescore``.

Layout (``artifacts`` is the ``--artifacts`` folder, ``p-<key>`` the configuration's folder of
:mod:`mlrc.search.artifacts`)::

    <artifacts>/<study>/p-<artifact key>/embeddings/test-rep<N>.npz

Arrays (``numpy.load(path)`` alone reads them; no pickle):

- ``separated``: folds × n × d, each fold model's raw (not normalised) test embeddings, float16
  by default (``artifacts.embeddings: float32`` keeps them as computed);
- ``labels``: n, int64, the dataset's class label of each test item;
- ``roles``: n, str, ``all`` (scored all against all) or ``query`` / ``gallery`` where the
  dataset gives its test items roles;
- ``super_labels``: n, int64, only when the dataset has super-classes (SOP's 12 categories);
- ``best_epochs``: folds, int64, the epoch each fold model was taken at (0: the untrained model,
  which the separated mean leaves out as the reference does,
  :func:`mlrc.protocol.stats.separated_mean`).

The concatenated (512-D) embedding is ``mlrc.protocol.concatenate_embeddings(list(separated))``
on the float32 of the stored rows, as the test stage computes it. The file is written to a
temporary name and renamed (a reader never sees half a file); its sha256 is stored with the
reproduction's results (``mlrc_embedding_file``), and a file whose bytes do not match is
refused, never used."""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from mlrc.search.errors import StudyError
from mlrc.store.embeddings import retrieval_of

__all__ = [
    "EMBEDDINGS_DIR",
    "ROLES",
    "file_fields",
    "file_name",
    "load_checked",
    "sha256_of",
    "write_npz",
]

log = logging.getLogger("mlrc")
EMBEDDINGS_DIR = "embeddings"  # under the configuration's folder (p-<artifact key>)
ROLES = ("all", "query", "gallery")
DTYPES = {"float16": np.float16, "float32": np.float32}


def file_name(reproduction: int) -> str:
    """``test-rep<N>.npz``."""
    return f"test-rep{reproduction}.npz"


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cast(separated: list[np.ndarray], dtype: str, what: str) -> np.ndarray:
    """The fold models' embeddings stacked as ``dtype``; float16 that would overflow (|x| >
    65504) is kept as float32 instead, with a warning (the store records the dtype)."""
    stacked = np.stack([np.asarray(e, dtype=np.float32) for e in separated])
    with np.errstate(over="ignore"):  # an overflow is seen below
        out = stacked.astype(DTYPES[dtype])
    if dtype == "float16" and not np.isfinite(out).all() and np.isfinite(stacked).all():
        log.warning("%s: embeddings exceed float16's range; stored as float32", what)
        return stacked
    return out


def write_npz(
    path: Path,
    separated: list[np.ndarray],
    labels: np.ndarray,
    roles: np.ndarray,
    super_labels: np.ndarray | None,
    dtype: str = "float16",
    best_epochs: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write the ``.npz`` at ``path`` atomically (a temporary file in its folder, flushed, then
    renamed; the folder is created) and return its store fields (:func:`file_fields` less
    ``path`` and ``params_hash``): sha256, dtype, folds, n, dim, size, and ``retrieval``
    (``query→gallery`` when ``roles`` name queries, else ``all vs all``)."""
    arrays = {
        "separated": _cast(separated, dtype, str(path)),
        "labels": np.asarray(labels, dtype=np.int64),
        "roles": np.asarray(roles, dtype="<U7"),
    }
    if super_labels is not None:
        arrays["super_labels"] = np.asarray(super_labels, dtype=np.int64)
    if best_epochs is not None:
        arrays["best_epochs"] = np.asarray(best_epochs, dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name beside it, created with the umask's permissions (as the checkpoints are)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folds, n, dim = arrays["separated"].shape
    return {
        "sha256": sha256_of(path),
        "dtype": str(arrays["separated"].dtype),
        "folds": folds,
        "n": n,
        "dim": dim,
        "size": path.stat().st_size,
        "retrieval": retrieval_of(arrays["roles"]),
    }


def file_fields(
    folder: Path, root: Path, reproduction: int, params_hash: str, arrays: dict[str, Any]
) -> dict[str, Any]:
    """Write reproduction ``reproduction``'s file under ``root`` (the configuration's folder)
    and return its ``mlrc_embedding_file`` fields, its path relative to the study's
    ``folder``. ``arrays``: :func:`write_npz`'s arguments by name."""
    path = root / EMBEDDINGS_DIR / file_name(reproduction)
    fields = write_npz(path, **arrays)
    return {"params_hash": params_hash, "path": str(path.relative_to(folder)), **fields}


def load_checked(
    path: Path, sha256: str, what: str, where: str = "", retest: str = ""
) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path`` once its sha256 equals the stored ``sha256``;
    a missing file or another hash is a one-line :class:`StudyError` naming ``what`` (the
    file is never used), ``where`` (how the folder was found, and how to point at another)
    and ``retest`` (the command that stores new files) — what works, not a rescore that
    would refuse the same file."""
    if not path.is_file():
        how = f" ({where})" if where else ""
        raise StudyError(f"{what}: stored embeddings {path} are missing (moved or deleted){how}")
    got = sha256_of(path)
    if got != sha256:
        works = f"; restore it from a copy, or {retest}" if retest else "; restore it from a copy"
        raise StudyError(
            f"{what}: {path} has sha256 {got[:16]}…, the store recorded {sha256[:16]}…: the "
            f"file was changed or damaged; refused{works}"
        )
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
