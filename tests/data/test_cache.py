"""Decoded-image cache: identical transform outputs, built once, invalidated, atomic builds."""

from __future__ import annotations

import os
import pickle
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from mlrc import data
from mlrc.data import cache
from mlrc.data.base import DatasetError, ImageDataset
from mlrc.data.cache import decoded_cache
from mlrc.data.transforms import eval_transform, train_transform

BGR_255 = {"mean": [104.0, 117.0, 128.0], "std": [1.0, 1.0, 1.0], "input_range": 255, "bgr": True}
SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (256, 300)]  # (w, h)
DEAD_PID = 4_194_305  # above Linux's largest pid_max (2**22): never a live process


def photo(path: Path, size: tuple[int, int], seed: int) -> Path:
    """A smooth random colour image (low-resolution noise upsampled), saved as a JPEG."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(small).resize(size, Image.Resampling.BICUBIC).save(path, quality=90)
    return path


def jpeg_dataset(folder: Path, sizes=SIZES) -> ImageDataset:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [str(photo(folder / f"{i}.jpg", s, i)) for i, s in enumerate(sizes)]
    return ImageDataset("cub-like", paths, [i % 2 for i in range(len(paths))], ["a", "b"])


def files(folder: Path) -> list[str]:
    """Names in ``folder``, less the (empty) build locks."""
    return sorted(p.name for p in folder.iterdir() if p.suffix != ".lock")


def assert_same_tensors(plain: ImageDataset, cached: ImageDataset, transform, seeds) -> None:
    for i in range(len(plain)):
        for seed in seeds:
            torch.manual_seed(seed)
            expected = transform(plain.load_image(i))
            torch.manual_seed(seed)
            assert torch.equal(transform(cached.load_image(i)), expected), (i, seed)


# --- same tensors ------------------------------------------------------------------------------


def test_reference_transforms_give_identical_tensors_on_jpegs(tmp_path):
    ds = jpeg_dataset(tmp_path / "img")
    cached = decoded_cache(ds, 256, tmp_path / "cache", progress=False)
    train = train_transform(256, 227, (0.16, 1.0), (0.75, 1.33), True, BGR_255)
    assert_same_tensors(ds, cached, train, seeds=range(3))
    assert_same_tensors(ds, cached, eval_transform(256, 227, BGR_255), seeds=[0])
    for i in range(len(SIZES)):  # shorter edge 256, exactly as Resize(256) makes it
        assert cached.load_image(i).size == T.Resize(256)(ds.load_image(i)).size
        assert min(cached.sources[i].shape[:2]) == 256


def test_bytes_sources_give_identical_tensors(tmp_path):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    zipped = ImageDataset(
        "zipped", [Path(p).read_bytes() for p in ds.sources], ds.labels, ["a", "b"]
    )
    cached = decoded_cache(zipped, 256, tmp_path / "cache", progress=False)
    train = train_transform(256, 227, (0.16, 1.0), (0.75, 1.33), True, BGR_255)
    assert_same_tensors(zipped, cached, train, seeds=range(3))


def test_glyphs_array_sources_give_identical_tensors(tmp_path):
    glyphs = data.build("glyphs")
    picked = np.flatnonzero(glyphs.labels < 3)  # 3 classes × 16 typefaces
    ds = ImageDataset(
        "glyphs",
        [glyphs.sources[i] for i in picked],
        glyphs.labels[picked],
        glyphs.class_names[:3],
        [glyphs.origins[i] for i in picked],
    )
    cached = decoded_cache(ds, 36, tmp_path, progress=False)
    spec = {"mean": [0.5] * 3, "std": [0.5] * 3, "input_range": 1, "bgr": False}
    train = train_transform(36, 32, (0.5, 1.0), (0.75, 1.33), False, spec)
    assert_same_tensors(ds, cached, train, seeds=range(2))
    assert cached.origins == ds.origins and cached.class_names == ds.class_names
    assert np.array_equal(cached.labels, ds.labels)
    assert all(a.shape == (36, 36, 3) for a in cached.sources)


# --- built once, shared, invalidated -------------------------------------------------------------


@pytest.fixture
def count_builds(monkeypatch) -> list[int]:
    builds: list[int] = []
    real = cache.build_files

    def counting(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "build_files", counting)
    return builds


def test_second_call_reuses_the_cache(tmp_path, count_builds):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    filters = list(warnings.filters)
    decoded_cache(ds, 64, tmp_path / "cache", progress=False, workers=3)
    assert warnings.filters == filters  # decoding threads leave the caller's filters as they were
    (data_file,) = (tmp_path / "cache").glob("*.u8")
    mtime = data_file.stat().st_mtime_ns
    again = decoded_cache(ds, 64, tmp_path / "cache", progress=False)
    assert len(count_builds) == 1 and data_file.stat().st_mtime_ns == mtime
    assert len(files(tmp_path / "cache")) == 2  # data + index, no temporary files
    assert not again.sources[0].flags.writeable
    decoded_cache(ds, 80, tmp_path / "cache", progress=False)  # another resize: another cache
    assert len(count_builds) == 2 and len(files(tmp_path / "cache")) == 4


def test_changed_file_builds_a_new_cache_that_shows_the_new_image(tmp_path, count_builds):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    before = decoded_cache(ds, 64, tmp_path / "cache", progress=False)
    old_pixels = np.array(before.sources[1])
    photo(Path(ds.sources[1]), SIZES[1], seed=99)  # new content
    after = decoded_cache(ds, 64, tmp_path / "cache", progress=False)
    assert len(count_builds) == 2 and len(files(tmp_path / "cache")) == 4  # old one kept
    new_pixels = np.asarray(T.Resize(64)(ds.load_image(1)))
    assert np.array_equal(after.sources[1], new_pixels)
    assert not np.array_equal(after.sources[1], old_pixels)
    stat = os.stat(ds.sources[2])  # same bytes, newer mtime: rebuilt too
    os.utime(ds.sources[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    decoded_cache(ds, 64, tmp_path / "cache", progress=False)
    assert len(count_builds) == 3


def test_pickles_as_file_names_not_pixels(tmp_path):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:4])
    cached = decoded_cache(ds, 256, tmp_path / "cache", progress=False)
    blob = pickle.dumps(cached)
    assert len(blob) < 10_000 < sum(a.nbytes for a in cached.sources)
    copy = pickle.loads(blob)
    assert all(np.array_equal(a, b) for a, b in zip(copy.sources, cached.sources, strict=True))


# --- errors and interrupted builds ---------------------------------------------------------------


def test_corrupt_image_names_the_file_and_leaves_no_cache(tmp_path):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:4])
    bad = Path(ds.sources[2])
    bad.write_bytes(bad.read_bytes()[:200] + b"garbage" * 10)
    with pytest.raises(DatasetError, match=re.escape(str(bad))):
        decoded_cache(ds, 64, tmp_path / "cache", progress=False, workers=2)
    assert files(tmp_path / "cache") == []


def test_killed_builds_leave_nothing_that_is_trusted(tmp_path, count_builds):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    data_file, index_file = cache.cache_paths(cache_dir, ds.name, 64, cache.cache_key(ds, 64))
    dead = re.sub(r"\.\d+\.(\w+)\.tmp$", rf".{DEAD_PID}.\1.tmp", cache.temp_name(data_file).name)
    (cache_dir / dead).write_bytes(b"half an image")  # killed mid-build
    live = cache.temp_name(index_file)  # this process's: a build in progress, kept
    live.write_bytes(b"")
    data_file.write_bytes(b"\0" * 1000)  # killed between renaming data and index
    cached = decoded_cache(ds, 64, cache_dir, progress=False)
    assert len(count_builds) == 1
    assert sorted(files(cache_dir)) == sorted([data_file.name, index_file.name, live.name])
    assert np.array_equal(cached.sources[0], np.asarray(T.Resize(64)(ds.load_image(0))))
    with open(data_file, "r+b") as f:  # truncated data behind a complete index: rebuilt
        f.truncate(100)
    decoded_cache(ds, 64, cache_dir, progress=False)
    assert len(count_builds) == 2


def test_concurrent_callers_build_once(tmp_path, count_builds):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])

    def build(_: int) -> ImageDataset:
        return decoded_cache(ds, 64, tmp_path / "cache", progress=False)

    with ThreadPoolExecutor(3) as pool:  # flock excludes separate opens, threads included
        results = list(pool.map(build, range(3)))
    assert len(count_builds) == 1 and len(files(tmp_path / "cache")) == 2
    assert all(np.array_equal(r.sources[2], results[0].sources[2]) for r in results)
