"""``mlrc data bench``: a fold's input pipeline timed on a folder of JPEGs a user brings (and on a
built-in dataset), the JSON it prints, the GPU figure it compares with, one-line errors. Speeds
are measured in ``bench/``, never asserted here: only that the figures exist and are positive."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from mlrc import data
from mlrc.cli import app
from mlrc.config import load_preset
from mlrc.data.transforms import to_trunk_input
from mlrc.train.embed import View
from mlrc.train.gpu_demand import GPU_ESTIMATES, gpu_demand
from mlrc.train.setup import fold_inputs
from mlrc.train.throughput import (
    CacheTiming,
    Rate,
    Throughput,
    measure,
    plain_eval_transform,
    plain_train_transform,
    trunk_input_spec,
)

runner = CliRunner()


@pytest.fixture
def jpegs(tmp_path, monkeypatch):
    """32 classes × 3 JPEGs of 80 × 60 px (enough classes for the reference's 4 folds), and an
    empty decoded-image cache of its own."""
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    root = tmp_path / "photos"
    for c in range(32):
        (root / f"class{c:02d}").mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c:02d}" / f"{i}.jpg", quality=90)
    return root


def bench_json(*args: str) -> dict:
    r = runner.invoke(app, ["data", "bench", *args, "--seconds", "0.3", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_json_of_a_folder_of_jpegs_has_the_figures(jpegs):
    out = bench_json(str(jpegs), "--workers", "1")
    for part in ("train", "eval"):
        assert set(out[part]) == {"img_per_s", "per_core", "first_batch_s"}
        assert all(v > 0 for v in out[part].values()), out[part]
        assert out["later_first_batch_s"][part] > 0
    assert set(out["cache"]) == {"build_s", "bytes"}
    # the reference preset's decoded cache: 96 images resized to 256 × 341 px, uint8 RGB
    assert out["cache"]["bytes"] >= 96 * 256 * 341 * 3 and out["cache"]["build_s"] > 0
    assert out["cache_built"] is True and out["workers"] == 1 and out["cores"] == 1
    assert out["gpu"]["estimate"] is True and out["gpu"]["img_per_s"] == 2500
    assert "1 CPU workers feed" in out["verdict"] and out["verdict"].endswith("-bound")

    again = bench_json(str(jpegs), "--workers", "0")  # the cache is there: opened, same bytes
    assert again["cache_built"] is False and again["cache"]["bytes"] == out["cache"]["bytes"]
    assert again["cores"] == 1 and again["train"]["per_core"] == again["train"]["img_per_s"]


def test_a_registered_dataset_without_cache_and_a_trunk_without_gpu_figure():
    out = bench_json("glyphs", "--preset", "cpu", "--plain")
    assert out["cache"] == {"build_s": out["cache"]["build_s"], "bytes": 0}
    assert out["train"]["img_per_s"] > 0 and out["eval"]["img_per_s"] > 0
    assert out["gpu"] is None and "no GPU figure" in out["verdict"]
    for part in ("train", "eval"):  # --plain: per core, the fold's and the plain chain's
        assert set(out["plain"][part]) == {"fold_per_core", "plain_per_core", "ratio"}
        assert all(v > 0 for v in out["plain"][part].values()), out["plain"]


def test_the_plain_chain_gives_the_folds_pixels(jpegs):
    """What --plain and bench/data.py compare with is the same transform: from the same torch
    RNG state, the plain chain's float tensors equal the fold's uint8 images (decoded cache,
    evaluation crops) once normalised as on the device — and differ from another draw."""
    p = load_preset("reference")
    spec = trunk_input_spec(p)
    ds = data.build("image_folder", root=jpegs)
    classes = list(range(ds.num_classes))
    _, train_set, val_set = fold_inputs(p, ds, classes, classes, spec)
    plain_train = View(ds, classes, plain_train_transform(p, spec))
    plain_val = View(ds, classes, plain_eval_transform(p, spec))
    for i in (0, 5, 50):
        torch.manual_seed(i)
        fold = to_trunk_input(train_set[i][0], spec)
        torch.manual_seed(i)
        assert torch.equal(fold, plain_train[i][0])
        assert not torch.equal(fold, plain_train[i][0])  # the RNG moved on: another crop
        assert torch.equal(to_trunk_input(val_set[i][0], spec), plain_val[i][0])


def test_augment_on_device_counts_images_not_pairs(jpegs):
    """With augment_on_device a batch's images are a DeviceCrop (canvas, params) pair: the
    rates count the batch's images (whole batches of 32), not the pair's two tensors."""
    p = load_preset("reference").model_copy(update={"augment_on_device": True, "num_workers": 0})
    ds = data.build("image_folder", root=jpegs)
    result = measure(p, ds, list(range(12)), list(range(12, 16)), seconds=0.3, progress=False)
    assert result.train.images > 0 and result.train.images % 32 == 0
    assert result.eval.images > 0 and result.eval.images % 12 == 0  # 4 classes × 3 per pass


def test_tables_and_verdict(jpegs):
    r = runner.invoke(app, ["data", "bench", str(jpegs), "--workers", "0", "--seconds", "0.3"])
    assert r.exit_code == 0, r.output
    assert "training" in r.stdout and "evaluation" in r.stdout and "decoded cache built" in r.stdout
    assert "estimate †" in r.stdout and "the GPU takes ≈ 2,500 (estimate)" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such folder"),
        (["{root}", "--preset", "refrence"], "unknown preset 'refrence'; did you mean 'reference'"),
        (["{root}", "--workers", "-1"], "--workers: -1 loader workers"),
        (["{root}", "--seconds", "0"], "--seconds: 0.0"),
        (["{root}", "--root", "{root}"], "--root goes with a dataset name"),
        (["cub"], "did you mean 'cub200'"),
    ],
)
def test_bad_input_is_one_line(jpegs, args, message):
    paths = {"missing": jpegs / "missing", "root": jpegs}
    r = runner.invoke(app, ["data", "bench", *(a.format(**paths) for a in args)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.output


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_corrupt_image_is_one_line(jpegs, workers, monkeypatch):
    """Without the decoded cache (cpu preset) the loaders decode: a corrupt JPEG met in a loader
    worker is still one line naming the file."""
    (jpegs / "class03" / "1.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    args = ["data", "bench", str(jpegs), "--preset", "cpu", "--workers", workers, "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert "1.jpg" in lines[0] and "Traceback" not in lines[0]


def test_gpu_figure_measured_beats_estimate(tmp_path):
    """bench/gpu_fold.py's CSV: the synthetic-input upper bound of a GPU run is what the GPU
    takes (its fold is the reference's: BN-Inception at batch 32); a CPU run does not count."""
    reference = load_preset("reference")
    csv = tmp_path / "gpu_fold.csv"
    head = "section,measure,value,unit,goal,met,device,profile,machine\n"
    machine = '"gpu1 AMD EPYC (16 CPUs), NVIDIA H100 80GB HBM3, Python 3.11, torch 2.9, Linux"'
    csv.write_text(
        head
        + f"fold,train_fold img/s,1800,img/s,,,cuda,full,{machine}\n"
        + f"upper bound,synthetic on-device img/s,2900.5,img/s,,,cuda,full,{machine}\n"
        + "upper bound,synthetic on-device img/s,40,img/s,,,cpu,cpu,laptop\n"
    )
    measured = gpu_demand(reference, csv)
    assert (measured.img_per_s, measured.estimate) == (2900.5, False)
    assert measured.gpu == "NVIDIA H100 80GB HBM3"
    absent = tmp_path / "absent.csv"
    assert gpu_demand(reference, absent).img_per_s == GPU_ESTIMATES["bninception", 32][0]
    modern = load_preset("modern")  # a timm tag is no other speed: the architecture's figure
    assert gpu_demand(modern, csv).estimate is True  # the CSV's fold is BN-Inception's
    bigger = reference.model_copy(update={"batch": reference.batch.model_copy(update={"size": 64})})
    assert gpu_demand(bigger, csv) is None and gpu_demand(bigger, absent) is None
    cpu_only = tmp_path / "cpu.csv"
    cpu_only.write_text(head + "upper bound,synthetic on-device img/s,40,img/s,,,cpu,cpu,laptop\n")
    assert gpu_demand(reference, cpu_only).estimate is True


def test_verdict_says_which_side_bounds(tmp_path):
    rate = Rate(3000.0, 750.0, 1.0, 0.0, 100, 1.0)
    result = Throughput(rate, rate, CacheTiming(1.0, 1, True), 4, 4, None)
    assert "no GPU figure" in result.verdict()
    result.gpu = gpu_demand(load_preset("reference"), tmp_path / "absent.csv")
    assert result.verdict() == (
        "4 CPU workers feed ≈ 3,000 img/s; the GPU takes ≈ 2,500 (estimate): GPU-bound"
    )
    result.train = Rate(500.0, 125.0, 1.0, 0.0, 100, 1.0)
    assert result.verdict().endswith("input-bound")
