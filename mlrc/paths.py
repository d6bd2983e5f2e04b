"""Every folder mlrc keeps cached files in, under one root (the bottom layer: stdlib only).

The root is ``$MLRC_CACHE`` when that variable is set and not empty (``~`` expanded, made
absolute against the current folder), else ``~/.cache/mlrc``. An empty value counts as unset:
``MLRC_CACHE=""`` means ``~/.cache/mlrc``, never the current folder. Every function reads the
environment when called, so a process (or a test) that changes ``MLRC_CACHE`` is followed at once.

- :func:`downloads_dir`: the root itself: downloaded datasets, ``<dataset>/<file>``;
- :func:`weights_dir`: ``weights/``: pretrained trunk weights (BN-Inception, ResNet);
- :func:`timm_weights_dir`: ``weights/timm/``: timm weights a preset gives by URL;
- :func:`decoded_dir`: ``decoded/``: decoded images and evaluation crops (memory-mapped);
- :func:`checked_dir`: ``checked/``: the pre-flight's memory of images that decoded;
- :func:`workers_dir`: ``workers/``: lock files of this host's mlrc workers (CPU shares);
- :func:`logs_dir`: ``logs/``: tracebacks of failed commands.

Nothing here creates a folder; the code that writes one does.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "cache_root",
    "checked_dir",
    "decoded_dir",
    "downloads_dir",
    "logs_dir",
    "timm_weights_dir",
    "weights_dir",
    "workers_dir",
]

CACHE_ENV = "MLRC_CACHE"  # the environment variable naming the root


def cache_root() -> Path:
    """The absolute root of every cache folder: ``$MLRC_CACHE`` if set and not empty, else
    ``~/.cache/mlrc``."""
    value = os.environ.get(CACHE_ENV, "")
    root = Path(value).expanduser() if value else Path.home() / ".cache" / "mlrc"
    return root.absolute()


def downloads_dir() -> Path:
    """Downloaded dataset files, one sub-folder per dataset (``omniglot/…zip``): the root itself."""
    return cache_root()


def weights_dir() -> Path:
    """Downloaded pretrained trunk weights, named ``<name>-<sha256 prefix>.pth``."""
    return cache_root() / "weights"


def timm_weights_dir() -> Path:
    """timm trunk weights downloaded from a preset's ``pretrained: {url: …}`` (checked)."""
    return weights_dir() / "timm"


def decoded_dir() -> Path:
    """The decoded-image cache: resized uint8 images and evaluation crops, memory-mapped."""
    return cache_root() / "decoded"


def checked_dir() -> Path:
    """The pre-flight's memory of images that decoded: ``images-<dataset>.npy`` key sets."""
    return cache_root() / "checked"


def workers_dir() -> Path:
    """Lock files of the mlrc workers on this host (CPU-share accounting), one per process."""
    return cache_root() / "workers"


def logs_dir() -> Path:
    """Tracebacks of failed commands: ``mlrc-YYYYmmdd-HHMMSS-PID.log``."""
    return cache_root() / "logs"
