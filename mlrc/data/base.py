"""The dataset interface and registry: :class:`ImageDataset`, its registration metadata
(:class:`DatasetInfo`), the registry ``DATASETS`` with ``register``/``build``, and the image and
file checks the loaders share. An :class:`ImageDataset` holds the (image, label) pairs with labels
0..C−1 that every loader returns.

A dataset's factory is ``factory(root=None, **params) -> ImageDataset``: ``root`` is the folder
(or file) the study's ``dataset.root`` names; the built-ins live in :mod:`mlrc.data.on_disk` and
:mod:`mlrc.data.glyphs`, others register through the entry-point group ``mlrc.datasets``.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data
from PIL import Image, ImageFile

from mlrc.registry import Entry, Registry

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")

# An image source: a file path, encoded bytes (zip members), or an already decoded uint8 array.
Source = str | bytes | np.ndarray

# Largest image decoded (Pillow's default limit, ≈ 256 MiB as RGB), enforced whatever
# ``PIL.Image.MAX_IMAGE_PIXELS`` says: a bigger one is refused before any pixel is decoded.
MAX_IMAGE_PIXELS = 89_478_485

# The role of an item in a query/gallery benchmark (In-Shop's ``evaluation_status``): training
# images, and the test classes' queries and the gallery they rank.
ROLES = ("train", "query", "gallery")

# Transparent pixels are composited onto this colour (RGB drops alpha, so some colour is needed).
BACKGROUND = (255, 255, 255)

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")


class DatasetError(ValueError):
    """Bad dataset on disk: the message names the path and what is wrong with it."""


class ImageDataset(torch.utils.data.Dataset):
    """A labelled image set. ``dataset[i]`` → ``(image, label)``.

    Images are RGB ``PIL.Image`` objects, or whatever ``transform`` makes of them. Labels are
    ``int`` in 0..C−1, numbered in the class order the protocol uses (``class_names[label]``).
    ``origins[i]`` says where sample i comes from (a path, or ``zip:member``), for messages.
    An image that cannot be decoded raises ``DatasetError`` naming its origin, at first read.

    ``roles`` (None, or one of :data:`ROLES` per item): a query/gallery benchmark's roles, as
    In-Shop's ``list_eval_partition.txt`` or an image folder's ``query/`` and ``gallery/``
    trees give them; every query class has a gallery image (``roles_source``, the file or folder
    that gave the roles, is named when one has none). ``super_labels`` (None, or an int ≥ 0 per
    item): a coarser class of each item (SOP's 12 super-classes, ``super_class_id − 1``).
    """

    def __init__(
        self,
        name: str,
        sources: Sequence[Source],
        labels: Sequence[int] | np.ndarray,
        class_names: Sequence[str],
        origins: Sequence[str] | None = None,
        transform: Callable | None = None,
        *,
        roles: Sequence[str] | np.ndarray | None = None,
        super_labels: Sequence[int] | np.ndarray | None = None,
        roles_source: str | None = None,
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
        self.roles = None if roles is None else _checked_roles(self, roles, roles_source or name)
        # the file or folder that gave the roles (None without roles), for messages
        self.roles_source = None if roles is None else (roles_source or name)
        # entries of the dataset's folder that are not read as images (a nested folder, a stray
        # file), named in a warning by :func:`check_dataset`; a loader sets them
        self.ignored: list[str] = []
        self.super_labels = None if super_labels is None else _checked_super(self, super_labels)

    @property
    def partition(self) -> list[str] | None:
        """In-Shop's older name for :attr:`roles`, as a list (None without roles)."""
        return None if self.roles is None else self.roles.tolist()

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


def _checked_roles(ds: ImageDataset, roles: Sequence[str] | np.ndarray, where: str) -> np.ndarray:
    """``roles`` as a str array, one of :data:`ROLES` per item; every query class has a gallery
    image (else one line: ``query class 'X' has no gallery image in WHERE``)."""
    out = np.asarray(roles, dtype=object).astype(str)
    if out.shape != ds.labels.shape:
        raise DatasetError(f"{ds.name}: {len(out)} roles for {len(ds.labels)} images")
    unknown = np.flatnonzero(~np.isin(out, ROLES))
    if len(unknown):
        i = int(unknown[0])
        raise DatasetError(
            f"{ds.origins[i]}: role {str(out[i])!r} is not one of {', '.join(ROLES)} ({where})"
        )
    in_gallery = set(ds.labels[out == "gallery"].tolist())
    lone = sorted(set(ds.labels[out == "query"].tolist()) - in_gallery)
    if lone:
        more = f" (and {len(lone) - 1} more query classes)" if len(lone) > 1 else ""
        name = ds.class_names[lone[0]]
        raise DatasetError(f"query class {name!r} has no gallery image in {where}{more}")
    return out


def _checked_super(ds: ImageDataset, super_labels: Sequence[int] | np.ndarray) -> np.ndarray:
    """``super_labels`` as int64, one integer ≥ 0 per item."""
    raw = np.asarray(super_labels)
    if raw.shape != ds.labels.shape:
        raise DatasetError(f"{ds.name}: {len(raw)} super-class labels for {len(ds.labels)} images")
    if raw.dtype.kind not in "iu" or (len(raw) and raw.min() < 0):
        raise DatasetError(f"{ds.name}: super-class labels must be integers ≥ 0")
    return raw.astype(np.int64)


def open_image(source: Source, origin: str) -> Image.Image:
    """Decode one image to RGB; a decoding failure is a ``DatasetError`` naming ``origin``.

    Truncated files are errors (never padded with gray), images over ``MAX_IMAGE_PIXELS`` are
    refused before decoding, and every mode is converted by ``to_rgb``.
    """
    _refuse_truncated_images()
    try:
        if isinstance(source, np.ndarray):
            return to_rgb(Image.fromarray(source))
        fp = io.BytesIO(source) if isinstance(source, bytes) else source
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(fp) as im:
                _check_size(im, origin)
                im.load()
                return to_rgb(im)
    except DatasetError:
        raise
    except FileNotFoundError:
        raise DatasetError(f"{origin}: image file is missing") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DatasetError(f"{origin}: image too large to decode safely ({e})") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise DatasetError(f"{origin}: unreadable or corrupt image ({e})") from None


def to_rgb(im: Image.Image) -> Image.Image:
    """A new RGB image from any Pillow mode.

    16-bit grayscale is scaled to 8 bits (Pillow's own conversion clips it to 255: white);
    transparency (alpha, a palette or key colour) is composited onto ``BACKGROUND``;
    everything else (CMYK, L, 1, P, YCbCr, …) uses Pillow's conversion.
    """
    if im.mode in _SIXTEEN_BIT_MODES:
        a = np.asarray(im).astype(np.uint32)
        return Image.fromarray(((a * 255 + 32767) // 65535).astype(np.uint8)).convert("RGB")
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        background = Image.new("RGBA", im.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, im.convert("RGBA")).convert("RGB")
    return im.convert("RGB")


def _check_size(im: Image.Image, origin: str) -> None:
    width, height = im.size
    if width * height > MAX_IMAGE_PIXELS:
        raise DatasetError(
            f"{origin}: image too large to decode safely ({width}x{height} = "
            f"{width * height} pixels, over the limit of {MAX_IMAGE_PIXELS} pixels)"
        )


def _refuse_truncated_images() -> None:
    """Undo ``ImageFile.LOAD_TRUNCATED_IMAGES = True`` (set by some other code), with a warning."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        warnings.warn(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES was True; mlrc set it back to False so that a "
            "truncated image is an error instead of an image padded with gray",
            RuntimeWarning,
            stacklevel=3,
        )


def renumber(original_ids: Sequence[object]) -> tuple[np.ndarray, list[object]]:
    """Map arbitrary class ids to 0..C−1 in sorted order; returns (labels, sorted ids)."""
    ids, labels = np.unique(np.asarray(original_ids), return_inverse=True)
    return labels.astype(np.int64), ids.tolist()


def require_dir(path: Path, what: str) -> Path:
    if path.exists() and not path.is_dir():
        raise DatasetError(f"{path}: {what} is not a directory")
    if not path.is_dir():
        raise DatasetError(f"{path}: {what} not found (no such directory)")
    return path


def require_file(path: Path, what: str) -> Path:
    if path.is_dir():
        raise DatasetError(f"{path}: {what} is a directory, not a file")
    if not path.is_file():
        raise DatasetError(f"{path}: {what} not found")
    return path


_bad_files: ContextVar[list[tuple[str, str]] | None] = ContextVar("bad_files", default=None)


@contextmanager
def listing_bad_files() -> Iterator[list[tuple[str, str]]]:
    """Within it, the loaders' load-time checks of single files (missing, empty, unreadable in
    a zip) record ``(origin, message)`` in the list it yields instead of raising, and the
    dataset keeps those files (they fail to decode): ``mlrc data check`` lists every bad file."""
    found: list[tuple[str, str]] = []
    token = _bad_files.set(found)
    try:
        yield found
    finally:
        _bad_files.reset(token)


def bad_file(origin: str, problem: str) -> None:
    """A bad image file: a :class:`DatasetError` ``origin: problem``, or recorded inside
    :func:`listing_bad_files`."""
    found = _bad_files.get()
    if found is None:
        raise DatasetError(f"{origin}: {problem}")
    found.append((origin, f"{origin}: {problem}"))


def check_image_files(paths: Sequence[str]) -> None:
    """Cheap checks at load time: every listed file exists and is not empty."""
    for p in paths:
        try:
            size = os.stat(p).st_size
        except FileNotFoundError:
            bad_file(p, "image file listed by the dataset is missing")
            continue
        if size == 0:
            bad_file(p, "image file is empty (0 bytes)")


def is_hidden(parts: Sequence[str]) -> bool:
    """A path part is hidden (``.name``, e.g. macOS ``._x.jpg``) or macOS zip metadata."""
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


def list_images(folder: Path) -> list[Path]:
    """Image files directly inside ``folder`` (hidden ones skipped), sorted by name."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not is_hidden([p.name])
    )


# --- checks that warn (a study still runs) -----------------------------------------------------

MAX_WARNINGS_PER_CHECK = 20


def check_dataset(ds: ImageDataset, train_classes: Sequence[int] | None = None) -> list[str]:
    """Warnings about a dataset that loads but can mislead a study, one line each.

    * a training class with a single image (it gives no positive pair; fine in test classes);
      ``train_classes`` are labels (0..C−1), ``None`` means every class;
    * the same image listed twice (same file, or files with identical bytes), naming both;
    * what the dataset's folder holds but its loader does not read (:attr:`ImageDataset.ignored`:
      a nested folder, a stray file), in one line.

    Only files of equal size are read (and hashed), so the check is cheap on real datasets.
    Each kind of warning is capped at ``MAX_WARNINGS_PER_CHECK`` lines plus a count line.
    """
    return ignored_warning(ds) + _single_image_classes(ds, train_classes) + _duplicate_images(ds)


def ignored_warning(ds: ImageDataset) -> list[str]:
    """One line naming what the dataset's folder holds but the loader does not read (nested
    folders, stray files): they are not images of the study."""
    ignored = getattr(ds, "ignored", [])
    if not ignored:
        return []
    shown = ", ".join(ignored[:MAX_WARNINGS_PER_CHECK])
    more = (
        f" and {len(ignored) - MAX_WARNINGS_PER_CHECK} more"
        if len(ignored) > MAX_WARNINGS_PER_CHECK
        else ""
    )
    return [
        f"{ds.name}: not read (only <class>/<image> files are images of the dataset): {shown}{more}"
    ]


def _capped(lines: list[str], name: str, what: str) -> list[str]:
    if len(lines) <= MAX_WARNINGS_PER_CHECK:
        return lines
    more = len(lines) - MAX_WARNINGS_PER_CHECK
    return [*lines[:MAX_WARNINGS_PER_CHECK], f"{name}: … and {more} more {what}"]


def _single_image_classes(ds: ImageDataset, train_classes: Sequence[int] | None) -> list[str]:
    counts = ds.class_counts()
    classes = range(ds.num_classes) if train_classes is None else sorted(set(train_classes))
    unknown = [c for c in classes if not 0 <= c < ds.num_classes]
    if unknown:
        raise ValueError(
            f"{ds.name}: train_classes {unknown} are not labels 0..{ds.num_classes - 1}"
        )
    _, first = np.unique(ds.labels, return_index=True)  # labels cover 0..C−1
    return _capped(
        [
            f"{ds.name}: training class {ds.class_names[c]!r} has a single image "
            f"({ds.origins[first[c]]}): it gives no positive pair"
            for c in classes
            if counts[c] == 1
        ],
        ds.name,
        "training classes with a single image",
    )


def _duplicate_images(ds: ImageDataset) -> list[str]:
    by_key: dict[object, list[int]] = defaultdict(list)
    for i, source in enumerate(ds.sources):
        by_key[_cheap_key(source)].append(i)
    lines = []
    for candidates in by_key.values():
        if len(candidates) < 2:
            continue
        by_digest: dict[bytes, list[int]] = defaultdict(list)
        for i in candidates:
            by_digest[_digest(ds.sources[i])].append(i)
        for same in by_digest.values():
            lines += [_duplicate_line(ds, same[0], j) for j in same[1:]]
    return _capped(lines, ds.name, "duplicate images")


def _duplicate_line(ds: ImageDataset, i: int, j: int) -> str:
    a, b = (ds.class_names[ds.labels[k]] for k in (i, j))
    where = f"both in class {a!r}" if a == b else f"in different classes {a!r} and {b!r}"
    if ds.origins[i] == ds.origins[j]:
        return f"{ds.name}: duplicate image: {ds.origins[i]} is listed twice ({where})"
    return f"{ds.name}: duplicate image: {ds.origins[j]} is identical to {ds.origins[i]} ({where})"


def _cheap_key(source: Source) -> object:
    """Equal for identical images; cheap (a stat, a length, a shape)."""
    if isinstance(source, str | os.PathLike):
        try:
            return ("file", os.stat(source).st_size)
        except OSError:
            return ("unreadable", source)  # reported when the image is loaded
    if isinstance(source, bytes):
        return ("file", len(source))
    return ("array", source.shape, source.dtype.str)


def _digest(source: Source) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    if isinstance(source, str | os.PathLike):
        try:
            with open(source, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            h.update(os.fsencode(source))
    elif isinstance(source, bytes):
        h.update(source)
    else:
        h.update(np.ascontiguousarray(source).data)
    return h.digest()


# --- the registry --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DatasetInfo(Entry):
    """What mlrc knows about a dataset without loading it: its parameters, their defaults and
    declared types (the fields of :class:`mlrc.registry.Entry`)."""


DATASETS: Registry[ImageDataset] = Registry("dataset", group="mlrc.datasets", entry=DatasetInfo)

available = DATASETS.available
info: Callable[[str], DatasetInfo] = DATASETS.info

# the datasets read from a folder (or file) the user names: ``root`` is required
NEEDS_ROOT = frozenset({"image_folder", "cub200", "cars196", "sop", "inshop"})


def register(
    name: str, **meta: Any
) -> Callable[[Callable[..., ImageDataset]], Callable[..., ImageDataset]]:
    """Decorator for ``factory(root=None, **params) -> ImageDataset``."""
    return DATASETS.register(name, **meta)


def build(name: str, root: str | Path | None = None, **kwargs: object) -> ImageDataset:
    """Load dataset ``name`` from ``root`` (``glyphs`` needs none; ``omniglot`` downloads one)."""
    return DATASETS.build(name, root=root, **kwargs)
