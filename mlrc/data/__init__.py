"""Datasets (one registry), with labels renumbered 0..C−1 in the protocol's class order."""

from mlrc.data.base import DatasetError, ImageDataset, check_dataset
from mlrc.data.datasets import DATASETS, NEEDS_ROOT, available, build

__all__ = [
    "DATASETS",
    "NEEDS_ROOT",
    "DatasetError",
    "ImageDataset",
    "available",
    "build",
    "check_dataset",
]
