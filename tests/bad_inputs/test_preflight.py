"""The pre-flight (issue #21): data and weights that would stop a study, refused before the study
is registered and before anything trains — one line ``error: …`` naming the file or the class
(and which half or fold), exit 2, and no study in the store afterwards.

Through the real ``mlrc`` command (in-process, ``CliRunner``) on tiny image folders written
here, against a real SQLite store. Nothing downloads: "no network" is a proxy on a closed local
port, which urllib (torch.hub's downloader) honours."""

from __future__ import annotations

import sqlite3
import urllib.request
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from mlrc import data
from mlrc.config import load_study
from mlrc.data.verify import checked_dir

from .conftest import invoke

TINY = {  # 2 folds of 2 validation classes; a fold trains for 2 iterations on 16-px crops
    "folds": 2,
    "iterations_per_epoch": 2,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "patience": {"default": 1},
    "image": {"resize": 18, "crop": 16},
}
CLASSES = [f"c{c}" for c in range(8)]  # c0–c3: train+val half, c4–c7: test half (sorted)
UNDEFINED = (
    "no {} query has another image of its class, so MAP@R, P@1 and R-Precision cannot be computed"
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A cache of this test's own: checked images and weights start unknown."""
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))


def image_folder(root: Path, sizes: dict[str, int]) -> Path:
    """``root/<class>/<k>.jpg``: ``sizes[class]`` distinct noise JPEGs per class."""
    for c, (name, n) in enumerate(sizes.items()):
        for k in range(n):
            pixels = np.random.default_rng(100 * c + k).integers(0, 256, (20, 20, 3), np.uint8)
            (root / name).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / name / f"{k}.jpg")
    return root


def study(tmp_path: Path, name: str = "pf", sizes: dict[str, int] | None = None, **extra) -> Path:
    """A study file on an image folder (3 images per class unless ``sizes`` says otherwise)."""
    root = tmp_path / "root"
    if not root.exists():
        image_folder(root, sizes or dict.fromkeys(CLASSES, 3))
    overrides = {**TINY, **extra.pop("overrides", {})}
    doc = {
        "name": name,
        "dataset": {"name": "image_folder", "root": str(root)},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 1, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": overrides,
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def stored_studies(db: Path) -> list[str]:
    """The studies the SQLite store at ``db`` holds (none when there is no store)."""
    if not db.exists():
        return []
    with closing(sqlite3.connect(db)) as c:
        try:
            return [r[0] for r in c.execute("select name from mlrc_study")]
        except sqlite3.OperationalError:  # no tables yet
            return []


def refused(tmp_path: Path, args: list, name: str = "pf") -> str:
    """``mlrc ARGS --storage …``: exit 2, one line ``error: …`` (returned without the prefix),
    and neither the study in the store nor any artifact of it."""
    db = tmp_path / "store.sqlite"
    artifacts = tmp_path / "artifacts"
    r = invoke([*args, "--storage", f"sqlite:///{db}", "--artifacts", artifacts])
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    assert name not in stored_studies(db)
    assert not (artifacts / name).exists()
    return lines[0].removeprefix("error: ")


COMMANDS = {  # every command that trains a study goes through the pre-flight
    "study run": ["study", "run"],
    "study test": ["study", "test"],
    "worker": ["worker"],
}


# --- images ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_a_corrupt_image_in_a_test_class_is_refused_naming_it(tmp_path, command):
    path = study(tmp_path)
    bad = tmp_path / "root" / "c6" / "1.jpg"
    bad.write_bytes(b"not an image")
    message = refused(tmp_path, [*COMMANDS[command], path])
    assert message == (
        f"{bad}: unreadable or corrupt image (cannot identify image file '{bad}') "
        "(class 'c6', test half)"
    )


def test_a_corrupt_image_in_a_training_class_is_refused_with_its_fold(tmp_path):
    path = study(tmp_path)
    bad = tmp_path / "root" / "c1" / "2.jpg"
    raw = bad.read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])  # truncated in its pixel data
    message = refused(tmp_path, ["study", "run", path])
    # the mlrc scheme with 2 folds of 4 train+val classes: fold 1 validates c0, c1
    assert message.startswith(f"{bad}: unreadable or corrupt image (")
    assert message.endswith("(class 'c1', train+val half, validated in fold 1)")


def test_several_bad_images_name_the_first_and_count_the_rest(tmp_path):
    path = study(tmp_path)
    for c in ("c2", "c5", "c7"):
        (tmp_path / "root" / c / "0.jpg").write_bytes(b"")  # empty: refused when listed
    first = tmp_path / "root" / "c2" / "0.jpg"
    assert refused(tmp_path, ["study", "run", path]) == f"{first}: image file is empty (0 bytes)"
    for c in ("c2", "c5", "c7"):
        (tmp_path / "root" / c / "0.jpg").write_bytes(b"GIF89a broken")
    message = refused(tmp_path, ["study", "run", path])
    assert message.startswith(f"{first}: unreadable or corrupt image (")
    assert message.endswith(
        f"(class 'c2', train+val half, validated in fold 0); 2 more images cannot be decoded "
        f"(mlrc data check image_folder --root {tmp_path / 'root'} lists them all)"
    )


def test_a_zero_byte_image_is_refused_naming_it(tmp_path):
    path = study(tmp_path)
    empty = tmp_path / "root" / "c4" / "0.jpg"
    empty.write_bytes(b"")
    assert refused(tmp_path, ["study", "run", path]) == f"{empty}: image file is empty (0 bytes)"


# --- class sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["study run", "study test"])
def test_test_classes_of_one_image_each_are_refused_before_the_search(tmp_path, command):
    """Until issue #21 the search ran to its end, then ``study test`` raised ValueError: no
    query has another item of its class."""
    sizes = {c: (3 if c < "c4" else 1) for c in CLASSES}
    path = study(tmp_path, sizes=sizes)
    assert refused(tmp_path, [*COMMANDS[command], path]) == (
        f"{path}: the test half has no class with 2 or more images (its 4 classes 'c4', 'c5', "
        f"'c6', 'c7' have one image each): {UNDEFINED.format('test')}"
    )


def test_a_split_files_validation_fold_of_single_images_is_refused(tmp_path):
    sizes = {"a": 1, "b": 1, **{c: 3 for c in ("c", "d", "e", "f", "g", "h")}}
    split = tmp_path / "split.yaml"
    split.write_text(
        yaml.safe_dump({"test": ["e", "f", "g", "h"], "folds": [["c", "d"], ["a", "b"]]})
    )
    path = study(tmp_path, sizes=sizes, split="split.yaml")
    assert refused(tmp_path, ["study", "run", path]) == (
        f"{path}: split: split.yaml: fold 1's validation classes have no class with 2 or more "
        f"images (its 2 classes 'a', 'b' have one image each): {UNDEFINED.format('validation')}"
    )


def test_training_classes_too_few_for_the_samplers_batch_are_refused(tmp_path):
    """The shuffle sampler takes batches of the preset's size from a fold's training images:
    6 images (2 classes × 3) cannot make a batch of 32."""
    path = study(tmp_path, sampler={"name": "shuffle"})
    assert refused(tmp_path, ["study", "run", path]) == (
        f"{path}: fold 0's training classes: batch size 32 is larger than the 6 training images "
        "(sampler shuffle)"
    )


# --- weights -----------------------------------------------------------------------------------

BNINCEPTION = {"trunk": "bninception", "image": {"resize": 36, "crop": 32}}


def test_a_missing_weights_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = study(tmp_path, overrides={**BNINCEPTION, "pretrained": "missing.pt"})
    assert refused(tmp_path, ["study", "run", path]) == (
        f"{path}: pretrained: weights file missing.pt does not exist"
    )


def test_a_zero_byte_weights_file_is_refused(tmp_path):
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    path = study(tmp_path, overrides={**BNINCEPTION, "pretrained": str(empty)})
    assert refused(tmp_path, ["study", "test", path]) == (
        f"{path}: pretrained: weights file {empty} is empty (0 bytes)"
    )


def test_a_timm_trunks_zero_byte_weights_file_is_refused(tmp_path):
    pytest.importorskip("timm")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    trunk = {"trunk": "timm:resnet18", "image": {"resize": 36, "crop": 32}}
    path = study(tmp_path, overrides={**trunk, "pretrained": str(empty)})
    assert refused(tmp_path, ["study", "run", path]) == (
        f"{path}: pretrained: weights file {empty} is empty (0 bytes)"
    )


def test_weights_that_do_not_fit_the_trunk_are_refused(tmp_path):
    import torch

    wrong = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, wrong)
    path = study(tmp_path, overrides={**BNINCEPTION, "pretrained": str(wrong)})
    message = refused(tmp_path, ["study", "run", path])
    assert message.startswith(f"{path}: pretrained: weights {wrong} do not fit BNInception: ")


def test_weights_that_fit_pass_and_nothing_is_built(tmp_path, monkeypatch):
    """A BN-Inception state dict passes; the trunk checked is built on the meta device only
    (a trunk built on the CPU would have real parameters)."""
    import torch

    from mlrc.models import bninception
    from mlrc.models.bninception import BNInception
    from mlrc.models.weights import check_weights

    good = tmp_path / "bninception.pth"
    torch.save(BNInception().state_dict(), good)
    built = []
    real = bninception.load_weights

    def spy(module, *args, **kwargs):
        built.append(next(module.parameters()).device.type)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(bninception, "load_weights", spy)
    check_weights("bninception", str(good))
    assert built == ["meta", "meta"]  # the trunk without weights, then with the file's


def test_pretrained_true_without_network_or_cached_weights_is_refused(tmp_path, monkeypatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # the discard port: connection refused
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    path = study(tmp_path, overrides={**BNINCEPTION, "pretrained": True})
    # urlopen's global opener reads the proxies once: a fresh one here, and none left behind
    # (a later test's requests to 127.0.0.1 would go to this proxy)
    urllib.request.install_opener(None)
    try:
        message = refused(tmp_path, ["study", "run", path])
    finally:
        urllib.request.install_opener(None)
    assert message.startswith(
        f"{path}: pretrained: could not get weights "
        "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth "
        f"(cache {tmp_path / 'cache' / 'weights'}): URLError: "
    )
    assert message.endswith("(download it by hand and pass its local path instead)")


def test_a_trunk_without_weights_refuses_pretrained(tmp_path):
    path = study(tmp_path, overrides={"pretrained": True})
    assert refused(tmp_path, ["study", "run", path]) == (
        f"{path}: pretrained: trunk 'tiny_cnn' has no pretrained weights (got "
        "pretrained=True); use pretrained=False"
    )


# --- campaigns, the demo -----------------------------------------------------------------------


def test_a_campaign_is_refused_before_any_study_is_registered(tmp_path):
    study(tmp_path)  # the image folder
    (tmp_path / "root" / "c5" / "2.jpg").write_bytes(b"\x89PNG broken")
    campaign = tmp_path / "camp.yaml"
    campaign.write_text(
        yaml.safe_dump(
            {
                "name": "camp",
                "preset": "cpu",
                "datasets": [{"name": "image_folder", "root": str(tmp_path / "root")}],
                "losses": ["contrastive", "multi_similarity"],
                "search": {"trials": 1, "seed": 0},
                "test": {"reproductions": 2},
                "overrides": TINY,
            }
        )
    )
    db = tmp_path / "store.sqlite"
    r = invoke(["campaign", "run", campaign, "--storage", f"sqlite:///{db}"])
    assert r.exit_code == 2, r.output
    bad = tmp_path / "root" / "c5" / "2.jpg"
    assert r.output.splitlines() == [
        f"error: {bad}: unreadable or corrupt image (cannot identify image file '{bad}') "
        "(class 'c5', test half) (study camp-image_folder-contrastive)"
    ]
    assert stored_studies(db) == []


def test_the_demo_goes_through_the_pre_flight(tmp_path, monkeypatch):
    from mlrc.data.base import DatasetError

    def refuse(resolved, progress=True):
        raise DatasetError(f"pre-flight of {resolved.study.dataset.name} refused")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("mlrc.train.preflight.preflight", refuse)
    r = invoke(["demo", "--quiet", "--trials", "1"])
    assert r.exit_code == 2 and r.output.splitlines()[-1] == "error: pre-flight of glyphs refused"
    assert stored_studies(tmp_path / "mlrc-demo.db") == []


# --- --skip-checks, the cache ------------------------------------------------------------------


def test_skip_checks_lets_the_run_start(tmp_path):
    """The corrupt test image is not read by the search: it runs, and the study is stored."""
    path = study(tmp_path)
    (tmp_path / "root" / "c6" / "1.jpg").write_bytes(b"not an image")
    db = tmp_path / "store.sqlite"
    args = ["study", "run", path, "--storage", f"sqlite:///{db}", "--artifacts", tmp_path / "a"]
    r = invoke([*args, "--skip-checks"])
    assert r.exit_code == 0, r.output
    assert "pre-flight" not in r.output
    assert stored_studies(db) == ["pf"]


def test_a_second_run_decodes_nothing_again(tmp_path):
    path = study(tmp_path)
    db = tmp_path / "store.sqlite"
    args = ["study", "run", path, "--storage", f"sqlite:///{db}", "--artifacts", tmp_path / "a"]
    first = invoke(args)
    assert first.exit_code == 0, first.output
    assert first.output.splitlines()[0].startswith(
        "pre-flight: 24 images (24 decoded, 0 checked before), 8 classes, 2 folds and the test "
        "half, trunk tiny_cnn (no pretrained weights): ok in "
    )
    (keys,) = checked_dir().glob("images-image_folder.npy")
    assert np.load(keys).shape == (24,)  # one key per image that decoded
    again = invoke(args)
    assert again.exit_code == 0, again.output
    assert "pre-flight: 24 images (0 decoded, 24 checked before)" in again.output
    # a changed file (new size and mtime) is decoded again; the others are not
    changed = tmp_path / "root" / "c0" / "0.jpg"
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(changed)
    third = invoke(args)
    assert "pre-flight: 24 images (1 decoded, 23 checked before)" in third.output
    assert np.load(keys).shape == (25,)


# --- disk for the decoded cache -----------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_a_decoded_cache_that_would_not_fit_is_refused(tmp_path, monkeypatch, command):
    """decoded_cache on a disk with 1 MB free (the free-space reading replaced, the disk is
    not): refused in one line before anything is registered or decoded into the cache."""
    from mlrc.data import cache

    monkeypatch.setattr(cache, "free_bytes", lambda folder: 10**6)
    path = study(tmp_path, overrides={"decoded_cache": True})
    line = refused(tmp_path, [*COMMANDS[command], path])
    assert line.startswith(f"{path}: decoded_cache: "), line
    assert "not enough disk for the decoded image cache" in line and "1 MiB free" in line, line
    assert not list((tmp_path / "cache").glob("decoded/*.u8"))


def test_a_decoded_cache_that_fits_passes_and_a_built_one_is_not_measured(tmp_path, monkeypatch):
    from mlrc.data import cache
    from mlrc.train import preflight as pf

    path = study(tmp_path, overrides={"decoded_cache": True})
    seen = []
    monkeypatch.setattr(cache, "free_bytes", lambda folder: seen.append(folder) or 10**12)
    db, artifacts = f"sqlite:///{tmp_path / 's.db'}", tmp_path / "a"
    r = invoke(["study", "run", path, "--storage", db, "--artifacts", artifacts, "--quiet"])
    assert r.exit_code == 0, r.output
    assert seen, "the pre-flight did not measure the disk"
    assert list((tmp_path / "cache").glob("decoded/*.u8"))  # the study built it
    seen.clear()
    resolved = load_study(path)
    pf.check_cache_room(resolved, data.build("image_folder", root=str(tmp_path / "root")))
    assert seen == []  # built: nothing to measure
