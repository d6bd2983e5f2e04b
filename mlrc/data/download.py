"""Fetch a downloadable dataset once into a cache, checked against its SHA-256.

Cache directory: ``$MLRC_CACHE`` or ``~/.cache/mlrc``. A file is written under a temporary name
and renamed only after its checksum matched, so an interrupted or corrupt download never leaves
a file that looks valid.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from pathlib import Path

from mlrc.data.base import DatasetError

OMNIGLOT_URL = (
    "https://github.com/brendenlake/omniglot/raw/master/python/images_background_small1.zip"
)
OMNIGLOT_SHA256 = "f38eb80f801274ac2b4dff5b24289016bfaba4a7d5bb50deebf27104ad6cb8a4"


def cache_dir() -> Path:
    return Path(os.environ.get("MLRC_CACHE", Path.home() / ".cache" / "mlrc")).expanduser()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(url: str, sha256_hex: str, filename: str, *, timeout_s: float = 60.0) -> Path:
    """Return the cached copy of ``url``, downloading it first if needed.

    Raises ``DatasetError`` when the download fails or its SHA-256 differs from ``sha256_hex``.
    """
    target = cache_dir() / filename
    if target.is_file():
        if sha256(target) == sha256_hex:
            return target
        target.unlink()  # a stale or tampered cache entry: fetch again
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r, open(partial, "wb") as out:
            shutil.copyfileobj(r, out, 1 << 20)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise DatasetError(f"{url}: download failed ({e})") from None
    got = sha256(partial)
    if got != sha256_hex:
        partial.unlink(missing_ok=True)
        raise DatasetError(f"{url}: SHA-256 mismatch (expected {sha256_hex}, got {got})")
    os.replace(partial, target)
    return target


def fetch_omniglot(url: str | None = None) -> Path:
    """The Omniglot "background small 1" zip (136 classes × 20 drawings), cached.

    The URL can be redirected to a mirror or a local copy with ``$MLRC_OMNIGLOT_URL``
    (``file://`` works); the SHA-256 is checked whatever the source.
    """
    url = url or os.environ.get("MLRC_OMNIGLOT_URL", OMNIGLOT_URL)
    return fetch(url, OMNIGLOT_SHA256, "omniglot/images_background_small1.zip")
