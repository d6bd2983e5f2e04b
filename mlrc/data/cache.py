"""Decoded-image cache: every image decoded and resized once, kept in a memory-mapped file.

``decoded_cache(ds, resize, cache_dir)`` returns a dataset whose images are the ones
``torchvision.transforms.Resize(resize)`` makes of ``ds``'s images (that very transform, so the
pixels are identical), stored as uint8 RGB. Decoding a CUB-sized JPEG and resizing it is most of
the cost of a training step's input pipeline; the cache pays it once per dataset and resize.

Same tensors as without the cache: ``Resize(resize)`` returns an image unchanged when its shorter
edge already equals ``resize`` (torchvision ≥ 0.13 checks the output size first), so the
protocol's ``train_transform``/``eval_transform`` (``Resize → RandomResizedCrop/CenterCrop → …``)
give, for the same torch RNG state, bit-identical tensors on the cached dataset.

Files in ``cache_dir`` (named by a key, see ``cache_key``)::

    <dataset>-r<resize>-<key>.u8          all images back to back, row-major H × W × 3 uint8
    <dataset>-r<resize>-<key>.index.npy   int64 (n, 3): byte offset, height, width per image

Disk cost: ``resize² · aspect · 3`` bytes per image (aspect = longer / shorter edge), e.g.
256 × 341 × 3 ≈ 262 KB for a 4:3 CUB photo, ≈ 3.1 GB for CUB-200-2011's 11,788 images at
resize 256 (about 3× the JPEGs). Pages are shared by every process that maps the file (the OS
page cache), so DataLoader workers and concurrent trials do not each hold a copy.

The key hashes the dataset name, ``resize``, the Pillow/torchvision versions and each image's
identity: for a file path its absolute path, size and mtime (ns); for encoded bytes, a hash of
the bytes; for an array, a hash of its shape, dtype and bytes. Changed files → new key → a new
cache is built (older ones are left alone; remove them by hand). A cache is built under a
temporary name and renamed into place only when complete (data first, index last), so a killed
build never leaves a cache that is later trusted; temporary files of dead builds are removed.
Processes that need the same missing cache at once build it once: the others wait on a lock
(``.<dataset>-r<resize>-<key>.lock``, an empty file left in place) and then map it.

Evaluation crops: ``eval_crops(ds, resize, crop, cache_dir)`` keeps what the protocol's
deterministic evaluation transform makes of every image, ``Resize(resize) → CenterCrop(crop)``
(torchvision's own transforms: identical pixels), as one uint8 ``(n, crop, crop, 3)`` array in
``<dataset>-eval-r<resize>-c<crop>-<key>.u8`` (index beside it, as above), built by the same
rules. Given a decoded cache of the same ``resize`` it reads the cached images (``Resize`` leaves
them as they are: no JPEG is decoded); its key derives from the decoded cache's, so it names the
same images whichever way it was built. Disk: ``crop² · 3`` bytes per image (≈ 1.8 GB for
CUB-200-2011 at crop 227). Validation, the test stage and the untrained baseline read these
crops: evaluating never decodes nor resizes.

Disk said up front: :func:`estimate_cache_bytes` gives both sizes from image headers alone, and a
build that would leave less than ``DISK_MARGIN`` free on the cache's disk is refused with one
line (:class:`~mlrc.data.base.DatasetError`) before anything is written.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import PIL
import torchvision
from filelock import FileLock
from PIL import Image
from torchvision import transforms as T
from tqdm.auto import tqdm

from mlrc import paths
from mlrc.data.base import DatasetError, ImageDataset, Source
from mlrc.data.estimate import estimate_cache_bytes, index_bytes
from mlrc.errors import alive

R = TypeVar("R")  # what ordered_map's function returns

FORMAT_VERSION = 1
DISK_MARGIN = 1 << 30  # bytes a build leaves free on the cache's disk, beyond its own size
STALE_TEMP_S = 24 * 3600  # a temporary file untouched this long is a dead build's, whatever host
_TEMP = re.compile(r"^\.(?P<final>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")


def default_cache_dir() -> Path:
    """``$MLRC_CACHE/decoded``: :func:`mlrc.paths.decoded_dir`."""
    return paths.decoded_dir()


def decoded_cache(
    ds: ImageDataset,
    resize: int,
    cache_dir: Path | str,
    progress: bool = True,
    workers: int | None = None,
) -> CachedImageDataset:
    """``ds`` with every image decoded, ``Resize(resize)``-d (shorter edge = ``resize`` px) and
    memory-mapped from ``cache_dir`` (built there on first use; see the module docstring).

    Labels, class names, origins, roles, super-labels and transform are ``ds``'s; sources are
    read-only uint8 ``(H, W, 3)`` views into the mapped file. An undecodable image raises
    ``DatasetError`` naming its origin, and leaves no cache behind; so does a disk too small for
    it (size estimated from the image headers, see :func:`check_room`). ``workers`` threads
    decode while building (default: the CPU count, at most 8); the images are written in order,
    a few at a time, so building needs little memory whatever the dataset's size.
    """
    if resize <= 0:
        raise ValueError(f"resize must be a positive number of pixels, not {resize}")
    key = cache_key(ds, resize)
    resizer = T.Resize(resize)
    paths, opened = _ensure(
        cache_paths(Path(cache_dir), ds.name, resize, key),
        len(ds),
        lambda i: np.asarray(resizer(ds.load_image(i))),
        lambda: estimate_cache_bytes(ds, resize).decoded,
        f"decoding {ds.name} (resize {resize})",
        progress,
        workers,
    )
    return CachedImageDataset(ds, *paths, *opened, resize=resize, key=key)


def eval_crops(
    ds: ImageDataset,
    resize: int,
    crop: int,
    cache_dir: Path | str,
    progress: bool = True,
    workers: int | None = None,
) -> EvalCropsDataset:
    """``ds`` with every image ``Resize(resize) → CenterCrop(crop)``-ed (the protocol's evaluation
    crop, torchvision's transforms) and memory-mapped from ``cache_dir`` as one uint8
    ``(n, crop, crop, 3)`` array (built there on first use; see the module docstring).

    ``ds`` may be a decoded cache of the same ``resize`` (its images are read, no JPEG decoded;
    another ``resize`` is a ``ValueError``) or the original dataset (decoded while building).
    Labels, class names, origins, roles, super-labels and transform are ``ds``'s; errors as
    :func:`decoded_cache`.
    """
    if resize <= 0 or crop <= 0:
        raise ValueError(
            f"resize and crop must be positive numbers of pixels, not {resize}, {crop}"
        )
    if isinstance(ds, CachedImageDataset):
        if ds.resize != resize:
            raise ValueError(
                f"{ds.name}: eval crops at resize {resize} from a decoded cache at resize "
                f"{ds.resize} would resize twice; give the original dataset"
            )
        base_key = ds.key
    else:
        base_key = cache_key(ds, resize)
    key = hashlib.blake2b(
        f"mlrc-evalcrops/{FORMAT_VERSION}/{crop}/{base_key}".encode(), digest_size=16
    ).hexdigest()
    cropper = T.Compose([T.Resize(resize), T.CenterCrop(crop)])
    paths, opened = _ensure(
        cache_paths(Path(cache_dir), f"{ds.name}-eval", resize, key, crop),
        len(ds),
        lambda i: np.asarray(cropper(pil_image(ds, i))),
        lambda: len(ds) * crop * crop * 3 + index_bytes(len(ds)),
        f"cropping {ds.name} (resize {resize}, crop {crop})",
        progress,
        workers,
    )
    return EvalCropsDataset(ds, *paths, *opened, resize=resize, key=key, crop=crop)


def _ensure(
    paths: tuple[Path, Path],
    n: int,
    make: Callable[[int], np.ndarray],
    needed: Callable[[], int],
    desc: str,
    progress: bool,
    workers: int | None,
) -> tuple[tuple[Path, Path], tuple[np.ndarray, np.ndarray]]:
    """Open the cache at ``paths``, building it first (under its lock, after checking that
    ``needed()`` bytes fit on its disk) from ``make(i)`` for i < ``n`` if it is missing."""
    data_path, index_path = paths
    data_path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(data_path.parent)
    opened = _open(data_path, index_path)
    if opened is None:
        with _build_lock(data_path.with_name(f".{data_path.stem}.lock")):
            opened = _open(data_path, index_path)  # built by another process while we waited?
            if opened is None:
                check_room(data_path.parent, needed())
                build_files(n, make, desc, data_path, index_path, progress, workers)
                opened = _open(data_path, index_path)
        if opened is None:
            raise DatasetError(f"{data_path}: decoded cache unreadable right after building it")
    return paths, opened


def pil_image(ds: ImageDataset, i: int) -> Image.Image:
    """Sample i of ``ds`` as an RGB PIL image, whatever :meth:`CachedImageDataset.as_arrays`."""
    return (
        ImageDataset.load_image(ds, i) if isinstance(ds, CachedImageDataset) else ds.load_image(i)
    )


class CachedImageDataset(ImageDataset):
    """An ``ImageDataset`` whose sources are views into a decoded cache's memory-mapped file
    (images resized to ``resize``; ``key`` names the cache).

    ``load_image`` gives RGB PIL images as any dataset's; :meth:`as_arrays` gives the same
    dataset whose ``load_image`` returns the read-only uint8 ``(H, W, 3)`` view itself (no copy,
    no PIL), for the transforms made for arrays (:mod:`mlrc.data.transforms`). Pickles small
    (the file paths, not the pixels): a spawned DataLoader worker maps the file again instead of
    receiving a copy of every image."""

    arrays = False

    def __init__(
        self,
        ds: ImageDataset,
        data_path: Path,
        index_path: Path,
        data: np.ndarray,
        index: np.ndarray,
        resize: int = 0,
        key: str = "",
    ) -> None:
        super().__init__(
            ds.name,
            _views(data, index),
            ds.labels,
            ds.class_names,
            ds.origins,
            ds.transform,
            roles=ds.roles,
            super_labels=ds.super_labels,
        )
        self.cache_files = (data_path, index_path)
        self.resize, self.key = resize, key

    def load_image(self, i: int) -> Image.Image | np.ndarray:
        """Sample i as an RGB PIL image, or (:meth:`as_arrays`) its uint8 HWC view."""
        return self.sources[i] if self.arrays else super().load_image(i)

    def as_arrays(self) -> CachedImageDataset:
        """This dataset with ``load_image`` giving the uint8 ``(H, W, 3)`` views themselves."""
        other = copy.copy(self)
        other.arrays = True
        return other

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "sources": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        opened = _open(*self.cache_files)
        if opened is None:
            raise DatasetError(f"{self.cache_files[0]}: decoded cache is gone or incomplete")
        self.sources = _views(*opened)


class EvalCropsDataset(CachedImageDataset):
    """A dataset's evaluation crops (:func:`eval_crops`): every source a read-only uint8
    ``(crop, crop, 3)`` view of ``Resize(resize) → CenterCrop(crop)`` of the original image."""

    def __init__(
        self,
        ds: ImageDataset,
        data_path: Path,
        index_path: Path,
        data: np.ndarray,
        index: np.ndarray,
        resize: int = 0,
        key: str = "",
        crop: int = 0,
    ) -> None:
        super().__init__(ds, data_path, index_path, data, index, resize, key)
        self.crop = crop


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk that holds (or would hold) ``folder``."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:  # not made yet: its disk
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_room(folder: Path, needed: int) -> None:
    """Refuse (``DatasetError``, one line) a cache of ``needed`` bytes in ``folder`` when its
    disk has less than ``needed + DISK_MARGIN`` free."""
    free = free_bytes(folder)
    if free < needed + DISK_MARGIN:
        raise DatasetError(
            f"{folder}: not enough disk for the decoded image cache ({size_text(needed)} "
            f"needed + {size_text(DISK_MARGIN)} margin, {size_text(free)} free): set MLRC_CACHE "
            "to a bigger disk or decoded_cache: false"
        )


def size_text(n: int) -> str:
    """``n`` bytes as people read them: ``3.1 GiB``, ``12 MiB``."""
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def cache_key(ds: ImageDataset, resize: int) -> str:
    """Hex digest naming the cache of ``ds`` at ``resize`` (see the module docstring)."""
    h = hashlib.blake2b(digest_size=16)
    header = f"mlrc-decoded/{FORMAT_VERSION}/{ds.name}/{resize}/{len(ds)}/"
    h.update(f"{header}Pillow {PIL.__version__}/torchvision {torchvision.__version__}".encode())
    for i, source in enumerate(ds.sources):
        h.update(image_identity(source, ds.origins[i]))
    return h.hexdigest()


def cache_paths(
    cache_dir: Path, name: str, resize: int, key: str, crop: int | None = None
) -> tuple[Path, Path]:
    """(data file, index file) of one cache (``crop``: of evaluation crops)."""
    size = f"r{resize}" if crop is None else f"r{resize}-c{crop}"
    stem = f"{re.sub(r'[^A-Za-z0-9_-]+', '_', name)}-{size}-{key}"
    return cache_dir / f"{stem}.u8", cache_dir / f"{stem}.index.npy"


def image_identity(source: Source, origin: str) -> bytes:
    """What names one image in a cache key (see the module docstring): a file by its absolute
    path, size and mtime; encoded bytes or an array by a hash of their content."""
    if isinstance(source, str | os.PathLike):
        path = os.path.abspath(source)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise DatasetError(f"{origin}: image file is missing") from None
        return f"\0path\0{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    if isinstance(source, bytes):
        return b"\0bytes\0" + hashlib.blake2b(source, digest_size=16).digest()
    a = np.ascontiguousarray(source)
    digest = hashlib.blake2b(a.data, digest_size=16).hexdigest()
    return f"\0array\0{a.shape}\0{a.dtype.str}\0{digest}".encode()


def _views(data: np.ndarray, index: np.ndarray) -> list[np.ndarray]:
    return [data[o : o + h * w * 3].reshape(h, w, 3) for o, h, w in index.tolist()]


def _open(data_path: Path, index_path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(flat uint8 memmap, index), or None when the cache is absent or not consistent."""
    try:
        index = np.load(index_path, allow_pickle=False)
        size = data_path.stat().st_size
    except (OSError, ValueError, EOFError):
        return None
    if index.ndim != 2 or index.shape[1] != 3 or len(index) == 0:
        return None
    offset, h, w = (int(v) for v in index[-1])
    if size != offset + h * w * 3:
        return None
    return np.memmap(data_path, dtype=np.uint8, mode="r").view(np.ndarray), index


@contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``path`` (an empty file, kept): one build of a cache at a time
    per host, the others wait and then use it. Released by the OS if the builder dies."""
    lock = FileLock(path, thread_local=False, preserve_lock_file=True, fallback_to_soft=False)
    with lock:
        yield


def build_files(
    n: int,
    make: Callable[[int], np.ndarray],
    desc: str,
    data_path: Path,
    index_path: Path,
    progress: bool,
    workers: int | None,
) -> None:
    """Write the cache under temporary names, then rename data and index into place."""
    tmp_data, tmp_index = temp_name(data_path), temp_name(index_path)
    try:
        with open(tmp_data, "wb") as f:
            threads = workers or min(8, os.cpu_count() or 1)
            index = _write_images(n, make, f, desc, progress, threads)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp_index, "wb") as f:
            np.save(f, index)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_data, data_path)
        os.replace(tmp_index, index_path)  # last: the index's presence marks a complete cache
    finally:
        for p in (tmp_data, tmp_index):
            p.unlink(missing_ok=True)


def _write_images(
    n: int,
    make: Callable[[int], np.ndarray],
    f: BinaryIO,
    desc: str,
    progress: bool,
    threads: int,
) -> np.ndarray:
    """Append ``make(i)`` (uint8 H × W × 3) for each i < ``n`` to ``f``; returns the (n, 3)
    index."""
    index = np.zeros((n, 3), dtype=np.int64)
    offset = 0
    # open_image's warnings.catch_warnings is not thread-safe: racing threads may restore one
    # another's filter lists. Every list they see holds this outer "error" filter, and leaving
    # this block restores the caller's filters whatever the interleaving.
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        images = ordered_map(make, range(n), threads)
        bar = tqdm(images, total=n, desc=desc, unit="img", disable=None if progress else True)
        for i, a in enumerate(bar):
            f.write(np.ascontiguousarray(a, dtype=np.uint8).data)
            index[i] = offset, a.shape[0], a.shape[1]
            offset += a.shape[0] * a.shape[1] * 3
    return index


def ordered_map(fn: Callable[[int], R], items: Iterable[int], threads: int) -> Iterator[R]:
    """``fn(i)`` for each of ``items`` in order, computed by ``threads`` threads at most
    2 × threads ahead of the consumer (Pillow releases the GIL while decoding and resizing)."""
    if threads <= 1:
        yield from (fn(i) for i in items)
        return
    with ThreadPoolExecutor(threads) as pool:
        pending: deque[Future] = deque()
        try:
            for i in items:
                pending.append(pool.submit(fn, i))
                if len(pending) >= 2 * threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def temp_name(path: Path) -> Path:
    host = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "host"
    return path.with_name(f".{path.name}.{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _remove_stale_temps(cache_dir: Path) -> None:
    """Delete temporary files of builds that died: same host and process gone, or old."""
    host = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "host"
    for p in cache_dir.glob(".*.tmp"):
        m = _TEMP.match(p.name)
        if m is None:
            continue
        try:
            old = time.time() - p.stat().st_mtime > STALE_TEMP_S
        except FileNotFoundError:
            continue
        if old or (m["host"] == host and not alive(int(m["pid"]))):
            p.unlink(missing_ok=True)
