"""Fetch a downloadable dataset once into a cache, checked against its SHA-256 (with pooch).

Cache directory: :func:`mlrc.paths.downloads_dir` (``$MLRC_CACHE``, default ``~/.cache/mlrc``).
A file is written under a temporary name and renamed only after its checksum matched, so an
interrupted or corrupt download never leaves a file that looks valid; a cached file whose
checksum differs is fetched again.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from mlrc import paths
from mlrc.data.base import DatasetError
from mlrc.errors import first_line

OMNIGLOT_URL = (
    "https://github.com/brendenlake/omniglot/raw/master/python/images_background_small1.zip"
)
OMNIGLOT_SHA256 = "f38eb80f801274ac2b4dff5b24289016bfaba4a7d5bb50deebf27104ad6cb8a4"


def cache_dir() -> Path:
    """Where downloads go: :func:`mlrc.paths.downloads_dir` (an empty ``MLRC_CACHE`` is unset)."""
    return paths.downloads_dir()


def sha256(path: Path) -> str:
    import pooch  # imported when used: 0.3 s, and most commands never download

    return pooch.file_hash(str(path), alg="sha256")


def _copy_local(url: str, output_file: str, _pooch: Any) -> None:
    """pooch's downloader for ``file://`` URLs (a local mirror), which pooch has none for."""
    shutil.copyfile(urllib.request.url2pathname(urllib.parse.urlsplit(url).path), output_file)


def _downloader(url: str, timeout_s: float) -> Any:
    import pooch

    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "file":
        return _copy_local
    if scheme in ("http", "https"):
        return pooch.HTTPDownloader(timeout=timeout_s)
    try:
        return pooch.downloaders.choose_downloader(url)  # ftp, sftp, doi
    except ValueError as e:
        raise DatasetError(f"{url}: download failed ({first_line(e)})") from None


def fetch(url: str, sha256_hex: str, filename: str, *, timeout_s: float = 60.0) -> Path:
    """Return the cached copy of ``url``, downloading it first if needed.

    Raises ``DatasetError`` when the download fails or its SHA-256 differs from ``sha256_hex``.
    """
    import pooch
    import requests

    target = cache_dir() / filename
    downloader = _downloader(url, timeout_s)
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel("WARNING")  # no "Downloading data from ..." lines on stderr
    try:
        pooch.retrieve(
            url,
            known_hash=f"sha256:{sha256_hex}",
            fname=target.name,
            path=target.parent,
            downloader=downloader,
        )
    except ValueError as e:  # pooch's checksum mismatch (it deleted the download)
        got = re.search(r"\bgot ([0-9a-fA-F]+)", str(e))
        raise DatasetError(
            f"{url}: SHA-256 mismatch (expected {sha256_hex}, got {got[1] if got else '?'})"
        ) from None
    except (OSError, requests.RequestException) as e:
        raise DatasetError(f"{url}: download failed ({first_line(e)})") from None
    finally:
        logger.setLevel(level)
    return target


def fetch_omniglot(url: str | None = None) -> Path:
    """The Omniglot "background small 1" zip (136 classes × 20 drawings), cached.

    The URL can be redirected to a mirror or a local copy with ``$MLRC_OMNIGLOT_URL``
    (``file://`` works); the SHA-256 is checked whatever the source.
    """
    url = url or os.environ.get("MLRC_OMNIGLOT_URL", OMNIGLOT_URL)
    return fetch(url, OMNIGLOT_SHA256, "omniglot/images_background_small1.zip")
