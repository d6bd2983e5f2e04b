"""How much disk a dataset's decoded cache and evaluation crops take, from image headers only
(no pixel decoded): what ``mlrc data summary`` and the pre-flight state before a build."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mlrc.data.base import DatasetError, ImageDataset, Source

__all__ = [
    "CacheEstimate",
    "estimate_cache_bytes",
    "image_size",
    "index_bytes",
    "resized_long_edges",
]


@dataclass(frozen=True)
class CacheEstimate:
    """Bytes on disk of a dataset's decoded cache and evaluation crops (files, index included)."""

    decoded: int
    eval_crops: int

    @property
    def total(self) -> int:
        return self.decoded + self.eval_crops


def estimate_cache_bytes(ds: ImageDataset, resize: int, crop: int | None = None) -> CacheEstimate:
    """What :func:`decoded_cache` at ``resize`` and :func:`eval_crops` at (``resize``, ``crop``)
    write for ``ds``, from image headers only (no pixel decoded; arrays by their shape):
    ``H' · W' · 3`` per image, ``(H', W')`` the size ``Resize(resize)`` gives (shorter edge
    ``resize``, longer ``⌊resize · long / short⌋``: ≈ ``resize² · aspect · 3``), plus
    ``crop² · 3`` per image (0 without ``crop``). An unreadable header is a ``DatasetError``."""
    decoded = sum(resize * long * 3 for long in resized_long_edges(ds, resize))
    crops = len(ds) * crop * crop * 3 + index_bytes(len(ds)) if crop else 0
    return CacheEstimate(decoded + index_bytes(len(ds)), crops)


def resized_long_edges(ds: ImageDataset, resize: int) -> list[int]:
    """The longer edge of each image after ``Resize(resize)`` (torchvision's sizes: shorter edge
    ``resize``, longer ``⌊resize · long / short⌋``), from the image headers (arrays: shapes)."""
    edges = []
    for source, origin in zip(ds.sources, ds.origins, strict=True):
        w, h = image_size(source, origin)
        edges.append(int(resize * max(w, h) / min(w, h)))
    return edges


def image_size(source: Source, origin: str) -> tuple[int, int]:
    """(width, height) of one image from its header (arrays: their shape)."""
    if isinstance(source, np.ndarray):
        return int(source.shape[1]), int(source.shape[0])
    fp = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with Image.open(fp) as im:
            return im.size
    except FileNotFoundError:
        raise DatasetError(f"{origin}: image file is missing") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise DatasetError(f"{origin}: unreadable or corrupt image ({e})") from None


def index_bytes(n: int) -> int:
    """Bytes of a cache's index file for ``n`` images."""
    return 128 + n * 3 * 8  # an .npy header and int64 (n, 3)
