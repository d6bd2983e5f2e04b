"""The `mlrc` command as a user runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from mlrc.cli import app

runner = CliRunner()


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("mlrc")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    assert "demo" in out and "data" in out


def test_demo_runs_a_whole_small_study(tmp_path, monkeypatch):
    """`mlrc demo` with a smaller budget (the full demo is the same path with the cpu preset)."""
    monkeypatch.chdir(tmp_path)
    args = ["demo", "--quiet", "--trials", "1", "--reproductions", "2", "--max-epochs", "1"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "glyphs × contrastive, preset cpu: 1 trials × 4 folds, then 2 reproductions" in r.output
    assert "glyphs × multi_similarity, preset cpu: 1 trials × 4 folds" in r.output
    assert "55 train+val classes, 56 test classes, 4 folds (scheme 'mlrc')" in r.output
    assert "### glyphs" in r.output
    for loss in ("contrastive", "multi_similarity"):  # the best row is underlined
        assert re.search(rf"\| (<ins>)?{loss}(</ins>)? \| 2 \|", r.output), loss
    # two losses: the report ranks them and says whether the ranking holds
    assert "Ranking stability" in r.output and "τ" in r.output
    assert "database: sqlite:///mlrc-demo.db" in r.output and (tmp_path / "mlrc-demo.db").is_file()
    assert (tmp_path / "mlrc-demo-artifacts").is_dir()
    again = runner.invoke(app, args)  # a second run resumes: everything is already done
    assert again.exit_code == 0 and re.search(
        r"\| (<ins>)?contrastive(</ins>)? \| 2 \|", again.output
    )


def test_baselines_on_the_embedded_default():
    r = runner.invoke(app, ["data", "baselines", "--reproductions", "3"])
    assert r.exit_code == 0, r.output
    assert "glyphs: 1776 images, 111 classes" in r.output
    assert "fold 1: train 42 classes, val 13 classes 0–12" in r.output
    row = re.search(r"untrained linear.*?([\d.]+) ± ([\d.]+)", r.output)
    assert row and 0 < float(row.group(1)) < 100 and float(row.group(2)) > 0


def test_data_summary_on_real_omniglot(omniglot_zip):
    r = runner.invoke(app, ["data", "summary", "omniglot", "--root", str(omniglot_zip)])
    assert r.exit_code == 0, r.output
    assert "omniglot: 2720 images, 136 classes, 20–20 images per class" in r.output
    assert "68 train+val classes, 68 test classes, 4 folds (scheme 'mlrc')" in r.output
    assert "fold 0: train 51 classes, val 17 classes 51–67" in r.output  # MLRC's: the last quarter


def test_data_summary_shows_the_folds_a_study_trains(tmp_path):
    """Without options, `data summary` prints the split a study with the default preset trains
    (the search's own split_of), fold by fold; --scheme kfold shows KFold's instead."""
    import yaml

    from mlrc import data
    from mlrc.config import load_study
    from mlrc.search.session import split_of

    study = tmp_path / "s.yaml"
    study.write_text(
        yaml.safe_dump({"name": "s", "dataset": {"name": "glyphs"}, "loss": {"name": "ntxent"}})
    )
    split = split_of(load_study(study), data.build("glyphs"))
    r = runner.invoke(app, ["data", "summary", "glyphs"])
    assert r.exit_code == 0, r.output
    for f in split.folds:
        lo, hi = min(f.val_classes), max(f.val_classes)
        assert f"fold {f.index}: train {len(f.train_classes)} classes, " in r.output
        assert re.search(
            rf"fold {f.index}: .* val {len(f.val_classes)} classes {lo}–{hi}\b", r.output
        )
    kfold = runner.invoke(app, ["data", "summary", "glyphs", "--scheme", "kfold"])
    assert (
        "(scheme 'kfold')" in kfold.output
        and "fold 0: train 41 classes, val 14 classes 0–13" in kfold.output
    )


def test_data_check_lists_corrupt_images(tmp_path):
    for c in "ab":
        (tmp_path / c).mkdir()
        Image.new("RGB", (4, 4)).save(tmp_path / c / "1.png")
    (tmp_path / "b" / "2.png").write_bytes(b"\x89PNG garbage")
    r = runner.invoke(app, ["data", "check", "image_folder", "--root", str(tmp_path)])
    assert r.exit_code == 1
    assert "2.png: unreadable or corrupt image" in r.output and "2 of 3 images readable" in r.output


def test_errors_are_one_line_without_traceback(tmp_path):
    r = runner.invoke(app, ["data", "summary", "cub200", "--root", str(tmp_path / "missing")])
    assert r.exit_code == 2
    assert r.output.strip().startswith("error:") and "Traceback" not in r.output
    r = runner.invoke(app, ["data", "summary", "cub"])
    assert r.exit_code == 2 and "did you mean 'cub200'" in r.output
    r = runner.invoke(app, ["data", "summary", "glyphs", "--folds", "40"])
    assert r.exit_code == 2 and "40 folds need at least 160 classes" in r.output
    assert "found 111 (55 train+val)" in r.output
