"""The fast input pipeline gives torchvision's pixels: evaluation crops computed once, the
cached-array training transform, the disk a cache takes said (and checked) up front."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_cache import SIZES, files, jpeg_dataset, photo
from torchvision import transforms as T
from torchvision.transforms import functional as F

from mlrc import data
from mlrc.data import cache
from mlrc.data.base import DatasetError, ImageDataset
from mlrc.data.cache import decoded_cache, eval_crops
from mlrc.data.estimate import estimate_cache_bytes
from mlrc.data.transforms import (
    ArrayToUint8Input,
    CachedTrainTransform,
    ToUint8Input,
    cached_train_transform,
    eval_transform,
    to_trunk_input,
    train_transform,
)
from mlrc.train import View, build_model, embed
from mlrc.train.setup import eval_inputs, fold_inputs

BGR = {"mean": [104.0, 117.0, 128.0], "std": [1.0, 1.0, 1.0], "input_range": 255, "bgr": True}
RGB = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "input_range": 1, "bgr": False}


def torchvision_crop(ds: ImageDataset, i: int, resize: int, crop: int) -> np.ndarray:
    """The reference: torchvision's Resize → CenterCrop on the original image."""
    return np.asarray(T.CenterCrop(crop)(T.Resize(resize)(ds.load_image(i))))


# --- evaluation crops ----------------------------------------------------------------------------


@pytest.mark.parametrize(("resize", "crop"), [(256, 227), (64, 80)])  # 80 > 64: CenterCrop pads
def test_eval_crops_are_torchvisions_center_crops(tmp_path, resize, crop):
    ds = jpeg_dataset(tmp_path / "img")
    from_originals = eval_crops(ds, resize, crop, tmp_path / "a", progress=False, workers=2)
    cached = decoded_cache(ds, resize, tmp_path / "b", progress=False)
    from_cache = eval_crops(cached.as_arrays(), resize, crop, tmp_path / "b", progress=False)
    for crops in (from_originals, from_cache):
        assert crops.labels.tolist() == ds.labels.tolist() and crops.origins == ds.origins
        for i in range(len(ds)):
            expected = torchvision_crop(ds, i, resize, crop)
            assert crops.sources[i].shape == (crop, crop, 3)
            assert np.array_equal(crops.sources[i], expected), i
            assert np.array_equal(np.asarray(crops.load_image(i)), expected)  # PIL by default
    # the same images, the same key, whichever way the crops were built
    assert [p.name for p in from_originals.cache_files] == [p.name for p in from_cache.cache_files]


def test_eval_crops_of_arrays_and_bytes_sources(tmp_path):
    glyphs = data.build("glyphs")
    picked = np.flatnonzero(glyphs.labels < 2)
    arrays = ImageDataset(
        "glyphs", [glyphs.sources[i] for i in picked], glyphs.labels[picked], ["a", "b"]
    )
    jpegs = jpeg_dataset(tmp_path / "img", SIZES[:3])
    zipped = ImageDataset("zipped", [Path(p).read_bytes() for p in jpegs.sources], [0, 1, 0], "ab")
    for ds in (arrays, zipped):
        crops = eval_crops(ds, 36, 32, tmp_path / "c", progress=False)
        for i in range(len(ds)):
            assert np.array_equal(crops.sources[i], torchvision_crop(ds, i, 36, 32)), (ds.name, i)


def test_eval_crops_built_once_new_key_for_a_changed_file(tmp_path, monkeypatch):
    builds: list[int] = []
    real = cache.build_files
    monkeypatch.setattr(cache, "build_files", lambda *a, **k: (builds.append(1), real(*a, **k))[1])
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    first = eval_crops(ds, 64, 56, tmp_path / "c", progress=False)
    again = eval_crops(ds, 64, 56, tmp_path / "c", progress=False)
    assert len(builds) == 1 and again.cache_files == first.cache_files
    assert re.fullmatch(r"cub-like-eval-r64-c56-[0-9a-f]{32}\.u8", first.cache_files[0].name)
    eval_crops(ds, 64, 48, tmp_path / "c", progress=False)  # another crop: other crops
    assert len(builds) == 2
    photo(Path(ds.sources[1]), SIZES[1], seed=99)  # new content
    changed = eval_crops(ds, 64, 56, tmp_path / "c", progress=False)
    assert len(builds) == 3 and changed.cache_files[0] != first.cache_files[0]
    assert np.array_equal(changed.sources[1], torchvision_crop(ds, 1, 64, 56))
    assert not np.array_equal(changed.sources[1], first.sources[1])
    assert len(files(tmp_path / "c")) == 6  # three crops, data + index each; the old one kept


def test_eval_crops_pickle_small_and_refuse_a_cache_of_another_resize(tmp_path):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:4])
    crops = eval_crops(ds, 256, 227, tmp_path / "c", progress=False).as_arrays()
    blob = pickle.dumps(crops)
    assert len(blob) < 10_000 < sum(a.nbytes for a in crops.sources)
    copy = pickle.loads(blob)
    assert copy.arrays and isinstance(copy.load_image(0), np.ndarray)
    assert all(np.array_equal(a, b) for a, b in zip(copy.sources, crops.sources, strict=True))
    cached = decoded_cache(ds, 64, tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="resize twice"):
        eval_crops(cached, 256, 227, tmp_path / "c", progress=False)


@pytest.mark.parametrize("spec", [BGR, RGB])
def test_array_input_is_to_uint8_input(spec):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (31, 29, 3), dtype=np.uint8)
    expected = ToUint8Input(spec)(Image.fromarray(a))
    for pic in (a, Image.fromarray(a)):
        got = ArrayToUint8Input(spec)(pic)
        assert torch.equal(got, expected) and got.stride() == expected.stride()


# --- the training transform on cached arrays -----------------------------------------------------


@pytest.mark.parametrize("spec", [BGR, RGB])
@pytest.mark.parametrize("flip", [True, False])
def test_cached_train_transform_is_bit_identical_to_torchvision(tmp_path, spec, flip):
    """Same tensors (values and strides) and the same torch RNG state after each call as
    ``train_transform(..., uint8=True)`` on the cached images, for many seeds and shapes."""
    sizes = [*SIZES, (227, 300), (300, 227), (260, 260)]  # incl. images the crop fills exactly
    ds = jpeg_dataset(tmp_path / "img", sizes)
    for resize, crop, scale in (
        (256, 227, (0.16, 1.0)),
        (240, 227, (0.9, 1.0)),
        (64, 48, (0.08, 1.0)),
    ):
        cached = decoded_cache(ds, resize, tmp_path / "c", progress=False)
        args = (resize, crop, scale, (0.75, 1.33), flip, spec)
        reference, fast = train_transform(*args, uint8=True), cached_train_transform(*args)
        for i in range(len(ds)):
            for seed in range(12):
                torch.manual_seed(seed)
                expected = reference(cached.load_image(i))
                state = torch.get_rng_state()
                torch.manual_seed(seed)
                got = fast(cached.as_arrays().load_image(i))
                assert torch.equal(got, expected), (resize, i, seed)
                assert got.stride() == expected.stride()
                assert torch.equal(torch.get_rng_state(), state)


def test_cached_train_transform_refuses_an_image_not_resized():
    fast = cached_train_transform(256, 227, (0.16, 1.0), (0.75, 1.33), True, BGR)
    with pytest.raises(ValueError, match="not resized to 256"):
        fast(np.zeros((300, 400, 3), dtype=np.uint8))


def test_uint8_tensor_resize_is_not_pil_so_training_crops_stay_in_pil(tmp_path):
    """Decides where the training crop's resize runs: torchvision's uint8 tensor
    ``resized_crop`` (bilinear, antialias) is NOT PIL's bilinear resize bit for bit, so
    ``CachedTrainTransform`` resizes in PIL. If this fails, a torchvision release made them
    equal: the resize may then move to uint8 tensors (and to the device) at no cost in numbers."""
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    differ, max_diff = 0, 0
    for i in range(len(ds)):
        im = T.Resize(256)(ds.load_image(i))
        x = F.pil_to_tensor(im)
        for seed in range(5):
            torch.manual_seed(seed)
            top, left, h, w = T.RandomResizedCrop.get_params(im, (0.16, 1.0), (0.75, 1.33))
            pil = F.pil_to_tensor(F.resized_crop(im, top, left, h, w, [227, 227]))
            tensor = F.resized_crop(x, top, left, h, w, [227, 227], antialias=True)
            assert tensor.dtype == torch.uint8 and tensor.shape == pil.shape
            differ += not torch.equal(tensor, pil)
            max_diff = max(max_diff, int((tensor.int() - pil.int()).abs().max()))
    assert differ > 0 and max_diff >= 1, "uint8 tensor resize now equals PIL's: see docstring"


# --- disk said up front --------------------------------------------------------------------------


def test_estimate_is_the_bytes_the_caches_write(tmp_path):
    jpegs = jpeg_dataset(tmp_path / "img")
    zipped = ImageDataset(
        "zipped", [Path(p).read_bytes() for p in jpegs.sources], jpegs.labels, "ab"
    )
    glyphs = data.build("glyphs")
    for ds, resize, crop in ((jpegs, 256, 227), (zipped, 100, 90), (glyphs, 36, 32)):
        est = estimate_cache_bytes(ds, resize, crop)
        out = tmp_path / f"c-{ds.name}"
        cached = decoded_cache(ds, resize, out, progress=False)
        crops = eval_crops(cached, resize, crop, out, progress=False)
        written = [os.path.getsize(p) for p in (*cached.cache_files, *crops.cache_files)]
        assert est.decoded == sum(written[:2]) and est.eval_crops == sum(written[2:]), ds.name
        assert est.total == sum(written)
    assert estimate_cache_bytes(jpegs, 256).eval_crops == 0


def test_a_cache_that_would_not_fit_is_refused_in_one_line(tmp_path, monkeypatch):
    ds = jpeg_dataset(tmp_path / "img", SIZES[:3])
    need = estimate_cache_bytes(ds, 64).decoded
    monkeypatch.setattr(cache, "free_bytes", lambda folder: need + cache.DISK_MARGIN - 1)
    with pytest.raises(DatasetError) as e:
        decoded_cache(ds, 64, tmp_path / "c", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "c") in msg
    assert "set MLRC_CACHE to a bigger disk or decoded_cache: false" in msg
    assert "needed" in msg and "free" in msg
    assert files(tmp_path / "c") == []  # nothing written
    monkeypatch.setattr(cache, "free_bytes", lambda folder: need + cache.DISK_MARGIN)
    decoded_cache(ds, 64, tmp_path / "c", progress=False)  # just fits
    crop_need = estimate_cache_bytes(ds, 64, 56).eval_crops
    monkeypatch.setattr(cache, "free_bytes", lambda folder: crop_need + cache.DISK_MARGIN - 1)
    with pytest.raises(DatasetError, match="not enough disk"):
        eval_crops(ds, 64, 56, tmp_path / "c", progress=False)


# --- a fold's inputs with decoded_cache: the very same tensors -----------------------------------


@pytest.fixture
def glyph_fold(glyphs_ds, tmp_path, monkeypatch):
    """(plain preset, cached preset, dataset, train, val, test classes, input spec)."""
    from mlrc.config import load_preset
    from mlrc.protocol import mlrc_split

    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    split = mlrc_split(glyphs_ds.labels, scheme="mlrc")
    fold = split.folds[0]
    plain, cached = load_preset("cpu"), load_preset("cpu", {"decoded_cache": True})
    spec = build_model(plain).trunk.input_spec
    classes = (fold.train_classes, fold.val_classes, split.test_classes)
    return plain, cached, glyphs_ds, *classes, spec


def test_fold_and_eval_inputs_give_the_same_tensors_with_decoded_cache(glyph_fold):
    plain, cached, ds, train, val, test, spec = glyph_fold
    d0, train0, val0 = fold_inputs(plain, ds, train, val, spec)
    d1, train1, val1 = fold_inputs(cached, ds, train, val, spec)
    assert isinstance(val1.ds, cache.EvalCropsDataset) and d1 is val1.ds
    assert isinstance(train1.transform, CachedTrainTransform)
    im = plain.image
    for a, b, seeds in ((train0, train1, range(3)), (val0, val1, [0])):
        assert np.array_equal(a.labels, b.labels) and len(a) == len(b)
        for i in range(0, len(a), 7):
            for seed in seeds:
                torch.manual_seed(seed)
                x = a[i][0]
                torch.manual_seed(seed)
                assert torch.equal(b[i][0], x), (i, seed)
    # the memory-bank sampler's view: the training classes through the validation transform
    bank0, bank1 = View(d0, train, val0.transform), View(d1, train, val1.transform)
    assert all(torch.equal(bank0[i][0], bank1[i][0]) for i in range(0, len(bank0), 5))
    # the test stage's and the baseline's views, against the float eval transform they used
    for classes in (test, train + val):
        before = View(ds, classes, eval_transform(im.resize, im.crop, spec))
        after = eval_inputs(cached, ds, classes, spec)
        assert np.array_equal(before.indices, after.indices)
        for i in range(0, len(before), 9):
            assert torch.equal(to_trunk_input(after[i][0], spec), before[i][0]), i
    assert sorted(
        p.name.split("-")[1] for p in (Path(os.environ["MLRC_CACHE"]) / "decoded").glob("*.u8")
    ) == ["eval", "r36"]


def test_test_stage_embeddings_are_unchanged_by_the_eval_crops(glyph_fold):
    """embed() of eval_inputs (uint8 crops, normalised on the batch) = embed() of the float
    eval transform the test stage and the baseline used before: bit for bit."""
    plain, cached, ds, _, _, test, spec = glyph_fold
    torch.manual_seed(0)
    model = build_model(plain)
    im = plain.image
    before = embed(model, View(ds, test, eval_transform(im.resize, im.crop, spec)), 64, "cpu")
    for preset in (plain, cached):
        after = embed(model, eval_inputs(preset, ds, test, spec), 64, "cpu")
        assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])


def test_memory_bank_fold_is_the_same_with_decoded_cache(glyphs_ds, tmp_path, monkeypatch):
    """A memory-bank sampler embeds the training classes through the validation transform of
    the fold's dataset (the eval crops under decoded_cache): the same fold, number for number."""
    from conftest import train_tiny_fold

    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    runs = [
        train_tiny_fold(
            glyphs_ds,
            tmp_path / str(flag),
            iterations=3,
            sampler="greedy_coreset",
            preset_overrides={"decoded_cache": flag},
        )
        for flag in (False, True)
    ]
    assert runs[0].status == "complete", runs[0].reason
    assert [vars(h) for h in runs[1].history] == [vars(h) for h in runs[0].history]


def test_data_summary_says_the_disk_the_cache_takes(tmp_path, monkeypatch):
    """One line: decoded 36 px glyphs (64 × 64 → 36 × 36) and 32 px crops, 1776 images each,
    in $MLRC_CACHE/decoded, with the free space there; the preset's switch said when off."""
    from typer.testing import CliRunner

    from mlrc.cli import app

    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "free_bytes", lambda folder: 5 * (1 << 30))
    r = CliRunner().invoke(app, ["data", "summary", "glyphs", "--preset", "cpu"])
    assert r.exit_code == 0, r.output
    images, crops = 1776 * 36 * 36 * 3, 1776 * 32 * 32 * 3  # 6.6 MiB, 5.2 MiB (+ indexes)
    line = next(x for x in r.output.splitlines() if x.startswith("decoded cache"))
    assert line == (
        f"decoded cache (preset cpu, resize 36, crop 32): {(images + crops) / 2**20:.0f} MiB "
        f"({images / 2**20:.0f} MiB images + {crops / 2**20:.0f} MiB evaluation crops) in "
        f"{tmp_path / 'cache' / 'decoded'}, 5.0 GiB free there; off in preset cpu "
        "(decoded_cache: false)"
    )
    r = CliRunner().invoke(app, ["data", "summary", "glyphs", "--preset", "nope"])
    assert r.exit_code != 0 and "--preset" in r.output


# --- augment_on_device: the same crops and flips, resized where the batch goes ------------------


@pytest.mark.parametrize("spec", [BGR, RGB])
def test_device_crops_are_the_pil_crops_up_to_interpolation_noise(tmp_path, spec):
    """The same draws (RNG state after each image equal), the same boxes and flips: the
    device's tensor resize differs from PIL's by rounding (a few levels), never more."""
    from torch.utils.data import default_collate

    from mlrc.data.transforms import DeviceCrop, DeviceCropTransform, batch_to_trunk_input

    ds = jpeg_dataset(tmp_path / "img")
    cached = decoded_cache(ds, 256, tmp_path / "c", progress=False).as_arrays()
    args = (256, 227, (0.16, 1.0), (0.75, 1.33), True, spec)
    cpu, device = cached_train_transform(*args), DeviceCropTransform(*args, canvas=400)
    expected, items = [], []
    for seed in range(4):
        for i in range(len(ds)):
            torch.manual_seed(seed)
            expected.append(cpu(cached.load_image(i)))
            state = torch.get_rng_state()
            torch.manual_seed(seed)
            items.append((device(cached.load_image(i)), i))
            assert torch.equal(torch.get_rng_state(), state)
    batch, _ = default_collate(items)
    assert isinstance(batch, DeviceCrop) and batch.canvas.shape == (len(items), 3, 400, 400)
    got = batch_to_trunk_input(batch, spec, "cpu")
    want = torch.stack([to_trunk_input(x, spec) for x in expected])
    assert got.shape == want.shape and got.dtype == torch.float32
    diff = (
        (got - want).abs()
        * 255
        / float(spec["input_range"])
        * torch.tensor(spec["std"]).view(3, 1, 1)
    )  # in 0–255 levels
    assert not torch.equal(got, want)  # interpolation noise: not the same numbers
    assert diff.mean() < 0.5 and diff.max() <= 2.01, (diff.mean(), diff.max())  # here: ≤ 1 level


def test_fold_with_augment_on_device_trains_close_to_the_cpu_fold(glyphs_ds, tmp_path, monkeypatch):
    from conftest import train_tiny_fold

    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    plain = train_tiny_fold(glyphs_ds, tmp_path / "plain", iterations=4)
    for cached in (True, False):
        res = train_tiny_fold(
            glyphs_ds,
            tmp_path / f"device-{cached}",
            iterations=4,
            preset_overrides={"augment_on_device": True, "decoded_cache": cached},
        )
        assert res.status == "complete", res.reason
        assert res.history[0].map_at_r == plain.history[0].map_at_r  # validation: unchanged
        assert res.history[1].train_loss == pytest.approx(plain.history[1].train_loss, rel=0.05)
        assert res.history[1].train_loss != plain.history[1].train_loss
