"""Decode every image of a dataset once to find the ones that cannot be read.

:func:`decode_failures` is the one decoding loop: ``mlrc data check`` lists what it finds, and a
study's pre-flight (:mod:`mlrc.train.preflight`) refuses to start on it. :func:`verify_images`
is the pre-flight's: it remembers the images that decoded, so a rerun decodes only what changed.

The memory is a set of 64-bit keys in ``$MLRC_CACHE/checked/images-<dataset>.npy`` (sorted
``uint64``; ``MLRC_CACHE`` defaults to ``~/.cache/mlrc``), one key per image that decoded: a
hash of the image's identity as the decoded-image cache (:mod:`mlrc.data.cache`) names it (a
file: its absolute path, size and mtime in ns; encoded bytes such as a zip member: a hash of
the bytes; an array: a hash of its shape, dtype and bytes) and of the Pillow version. A changed
file (new size or mtime) or another Pillow gives a new key, so it is decoded again. Images that
fail are never remembered. The file is rewritten whole under a lock (its content merged with
what another process wrote meanwhile) and renamed into place, so a killed run leaves the old
set; a lost or unreadable file only means decoding again.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

from mlrc import paths
from mlrc.data.base import DatasetError, ImageDataset
from mlrc.data.cache import ordered_map

__all__ = ["Verified", "checked_dir", "decode_failures", "image_keys", "verify_images"]

FORMAT_VERSION = 1


def decode_failures(
    ds: ImageDataset,
    indices: Sequence[int] | None = None,
    *,
    progress: bool = True,
    desc: str | None = None,
    threads: int | None = None,
) -> Iterator[tuple[int, str]]:
    """``(i, message)`` for each image ``i`` of ``indices`` (default: all) that
    ``ds.load_image`` cannot decode (its ``DatasetError``: the origin and the reason), in
    index order. Every image is decoded in full and converted to RGB, as training reads it.

    ``threads`` decode at once (default: the CPU count, at most 8; Pillow releases the GIL);
    ``progress``: a tqdm bar (``desc``, default ``checking <dataset>``) on stderr."""
    from tqdm.auto import tqdm

    indices = range(len(ds)) if indices is None else indices
    threads = threads or min(8, os.cpu_count() or 1)

    def decode(i: int) -> str | None:
        try:
            ds.load_image(i)
        except DatasetError as e:
            return str(e)
        return None

    # open_image's warnings.catch_warnings is not thread-safe (threads may restore one another's
    # filter lists); every list they see holds this outer filter, and leaving the block restores
    # the caller's (as mlrc.data.cache does when it builds a cache).
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        results = ordered_map(decode, indices, threads)
        bar = tqdm(
            zip(indices, results, strict=True),
            total=len(indices),
            desc=desc or f"checking {ds.name}",
            unit="img",
            disable=None if progress else True,  # None: off when stderr is not a terminal
        )
        for i, message in bar:
            if message is not None:
                yield i, message


def checked_dir() -> Path:
    """``$MLRC_CACHE/checked``: :func:`mlrc.paths.checked_dir`."""
    return paths.checked_dir()


def image_keys(ds: ImageDataset) -> np.ndarray:
    """One ``uint64`` per image of ``ds``: its identity and the Pillow version, hashed (see the
    module docstring). A listed file that is gone is a ``DatasetError`` naming it."""
    from mlrc.data.cache import image_identity  # the decoded cache's notion of "same image"

    salt = f"mlrc-checked/{FORMAT_VERSION}/Pillow {PIL.__version__}/".encode()
    keys = np.empty(len(ds), dtype=np.uint64)
    for i, source in enumerate(ds.sources):
        digest = hashlib.blake2b(
            salt + image_identity(source, ds.origins[i]), digest_size=8
        ).digest()
        keys[i] = int.from_bytes(digest, "little")
    return keys


@dataclass
class Verified:
    """What :func:`verify_images` did: images decoded now, images known good from an earlier
    run, and the failures (index, message) in index order."""

    decoded: int = 0
    cached: int = 0
    failures: list[tuple[int, str]] = field(default_factory=list)


def verify_images(
    ds: ImageDataset,
    cache_dir: Path | None = None,
    *,
    progress: bool = True,
    threads: int | None = None,
    bar_over: int = 0,
) -> Verified:
    """Decode every image of ``ds`` not already known to decode (see the module docstring),
    remember the ones that did, and return what happened. ``progress``: a bar while decoding
    more than ``bar_over`` images."""
    cache_dir = checked_dir() if cache_dir is None else Path(cache_dir)
    path = cache_dir / f"images-{re.sub(r'[^A-Za-z0-9_-]+', '_', ds.name)}.npy"
    keys = image_keys(ds)
    known = _read_keys(path)
    todo = np.flatnonzero(~np.isin(keys, known)).tolist() if len(known) else list(range(len(ds)))
    out = Verified(decoded=len(todo), cached=len(ds) - len(todo))
    if not todo:
        return out
    bar = progress and len(todo) > bar_over
    desc = f"pre-flight: decoding {ds.name}"
    out.failures = list(decode_failures(ds, todo, progress=bar, desc=desc, threads=threads))
    bad = {i for i, _ in out.failures}
    good = keys[[i for i in todo if i not in bad]]
    if len(good):
        _add_keys(path, good)
    return out


def _read_keys(path: Path) -> np.ndarray:
    try:
        keys = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return np.empty(0, dtype=np.uint64)
    return keys if keys.dtype == np.uint64 and keys.ndim == 1 else np.empty(0, dtype=np.uint64)


def _add_keys(path: Path, keys: np.ndarray) -> None:
    """Merge ``keys`` into the set at ``path`` (under a lock; written whole, then renamed). A
    cache folder that cannot be written only costs the next run its decoding."""
    from filelock import FileLock

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path.with_name(f".{path.name}.lock"), thread_local=False):
            merged = np.union1d(_read_keys(path), keys).astype(np.uint64)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.save(f, merged)
            os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"{path}: cannot remember the checked images ({e})", stacklevel=3)
