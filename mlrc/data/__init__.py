"""Datasets (one registry), with labels renumbered 0..C−1 in the protocol's class order.

``register``, ``build``, ``DATASETS`` and ``DatasetInfo`` (:mod:`mlrc.data.base`) are the plug-in
API; the built-ins register when their modules are imported here (:mod:`mlrc.data.on_disk`,
:mod:`mlrc.data.glyphs`).
"""

from mlrc.data import glyphs, on_disk  # noqa: F401  (importing them registers the built-ins)
from mlrc.data.base import (
    DATASETS,
    NEEDS_ROOT,
    ROLES,
    DatasetError,
    DatasetInfo,
    ImageDataset,
    available,
    build,
    check_dataset,
    ignored_warning,
    info,
    register,
)

__all__ = [
    "DATASETS",
    "NEEDS_ROOT",
    "ROLES",
    "DatasetError",
    "DatasetInfo",
    "ImageDataset",
    "available",
    "build",
    "check_dataset",
    "ignored_warning",
    "info",
    "register",
]
