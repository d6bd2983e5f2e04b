"""The image dataset every loader returns: (image, label) pairs with labels 0..C−1."""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch.utils.data
from PIL import Image

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")

# An image source: a file path, encoded bytes (zip members), or an already decoded uint8 array.
Source = str | bytes | np.ndarray


class DatasetError(ValueError):
    """Bad dataset on disk: the message names the path and what is wrong with it."""


class ImageDataset(torch.utils.data.Dataset):
    """A labelled image set. ``dataset[i]`` → ``(image, label)``.

    Images are RGB ``PIL.Image`` objects, or whatever ``transform`` makes of them. Labels are
    ``int`` in 0..C−1, numbered in the class order the protocol uses (``class_names[label]``).
    ``origins[i]`` says where sample i comes from (a path, or ``zip:member``), for messages.
    An image that cannot be decoded raises ``DatasetError`` naming its origin, at first read.
    """

    def __init__(
        self,
        name: str,
        sources: Sequence[Source],
        labels: Sequence[int] | np.ndarray,
        class_names: Sequence[str],
        origins: Sequence[str] | None = None,
        transform: Callable | None = None,
    ) -> None:
        self.name = name
        self.sources = list(sources)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.class_names = list(class_names)
        self.origins = (
            list(origins)
            if origins is not None
            else [s if isinstance(s, str) else f"{name}[{i}]" for i, s in enumerate(self.sources)]
        )
        self.transform = transform
        if len(self.sources) != len(self.labels):
            raise DatasetError(f"{name}: {len(self.sources)} images but {len(self.labels)} labels")
        if len(self.sources) == 0:
            raise DatasetError(f"{name}: the dataset has no images")
        C = len(self.class_names)
        present = np.unique(self.labels)
        if present[0] != 0 or present[-1] != C - 1 or len(present) != C:
            raise DatasetError(f"{name}: labels must cover 0..{C - 1} exactly")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.sources)

    def load_image(self, i: int) -> Image.Image:
        """Decode sample i as RGB, or raise ``DatasetError`` naming where it comes from."""
        return open_image(self.sources[i], self.origins[i])

    def __getitem__(self, i: int) -> tuple[object, int]:
        image = self.load_image(i)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[i])

    def subset(self, classes: Sequence[int]) -> torch.utils.data.Subset:
        """The samples whose label is in ``classes`` (labels unchanged)."""
        idx = np.flatnonzero(np.isin(self.labels, np.asarray(classes)))
        return torch.utils.data.Subset(self, idx.tolist())

    def class_counts(self) -> np.ndarray:
        return np.bincount(self.labels, minlength=self.num_classes)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, {len(self)} images, {self.num_classes} classes)"
        )


def open_image(source: Source, origin: str) -> Image.Image:
    """Decode one image to RGB; a decoding failure is a ``DatasetError`` naming ``origin``."""
    try:
        if isinstance(source, np.ndarray):
            return Image.fromarray(source).convert("RGB")
        fp = io.BytesIO(source) if isinstance(source, bytes) else source
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(fp) as im:
                im.load()
                return im.convert("RGB")
    except FileNotFoundError:
        raise DatasetError(f"{origin}: image file is missing") from None
    except (
        OSError,
        ValueError,
        SyntaxError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as e:
        raise DatasetError(f"{origin}: unreadable or corrupt image ({e})") from None


def renumber(original_ids: Sequence[object]) -> tuple[np.ndarray, list[object]]:
    """Map arbitrary class ids to 0..C−1 in sorted order; returns (labels, sorted ids)."""
    ids, labels = np.unique(np.asarray(original_ids), return_inverse=True)
    return labels.astype(np.int64), ids.tolist()


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise DatasetError(f"{path}: {what} not found (no such directory)")
    return path


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DatasetError(f"{path}: {what} not found")
    return path


def check_image_files(paths: Sequence[str]) -> None:
    """Cheap checks at load time: every listed file exists and is not empty."""
    for p in paths:
        try:
            size = os.stat(p).st_size
        except FileNotFoundError:
            raise DatasetError(f"{p}: image file listed by the dataset is missing") from None
        if size == 0:
            raise DatasetError(f"{p}: image file is empty (0 bytes)")


def list_images(folder: Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name."""
    return sorted(
        p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
    )
