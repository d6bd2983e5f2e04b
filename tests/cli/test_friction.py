"""What a new user hit (#37, finding 11, and the ``--split:`` of finding 7), each on a small
image folder written here (10 classes × 12 grayscale 28×28 PNGs) or a store-less command:
``mlrc --version``, "1 study", reasons not doubled, tables whole when piped, no progress bars in
piped output, a nested folder or stray file named, ``data bench --folds``, a roles error that
names the roles and not a ``--split`` nobody gave."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from mlrc import __version__, data, store
from mlrc.cli import app

runner = CliRunner()


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """10 classes × 12 grayscale 28×28 PNGs (random pixels, seeded)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(10):
        (root / f"class{c}").mkdir()
        for i in range(12):
            pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
            Image.fromarray(pixels, mode="L").save(root / f"class{c}" / f"{i}.png")
    return root


def test_version():
    out = cli("--version").output.strip()
    assert re.fullmatch(rf"mlrc {re.escape(__version__)}(\+g[0-9a-f]+(-dirty)?)?", out), out


def test_one_study_is_singular(tmp_path):
    path = tmp_path / "camp.yaml"
    doc = {"name": "camp", "datasets": [{"name": "glyphs"}], "losses": ["contrastive"],
           "preset": "cpu", "search": {"trials": 2}, "test": {"reproductions": 2}}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db'}"
    store.connect(url)  # an empty store
    out = cli("campaign", "status", path, "--storage", url).output
    assert "1 study: 1 not started" in out and "1 studies" not in out


@pytest.mark.parametrize(
    ("state", "reason", "line"),
    [
        ("pruned", "pruned after 1 of 2 folds: running mean 0.1", "pruned after 1 of 2 folds: "
         "running mean 0.1"),
        ("interrupted", "interrupted", "interrupted"),
        ("interrupted", "interrupted: rank 1 of 2 ended by SIGKILL",
         "interrupted: rank 1 of 2 ended by SIGKILL"),
        ("failed", "RuntimeError: out of memory", "failed: RuntimeError: out of memory"),
        ("failed", None, "failed"),
    ],
)  # fmt: skip
def test_a_reason_is_not_doubled(state, reason, line):
    from mlrc.cli.terminal import state_and_reason  # what `study status` prints below its table

    assert state_and_reason(state, reason) == line


def test_campaign_plan_piped_keeps_whole_study_names(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "camp.yaml"
    losses = ["contrastive", "multi_similarity", "proxy_anchor"]
    doc = {"name": "a-rather-long-campaign-name", "datasets": [{"name": "glyphs"}],
           "losses": losses, "preset": "cpu", "search": {"trials": 2},
           "test": {"reproductions": 2}}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    out = cli("campaign", "plan", path, "--storage", f"sqlite:///{tmp_path / 'db'}").output
    for loss in losses:
        assert f"{loss} (glyphs)" in out  # not "contras… (glyph…"
    assert "…" not in out


def test_no_progress_bars_in_piped_output(folder):
    r = cli("data", "check", "image_folder", "--root", folder)
    assert "120 of 120 images readable" in r.output
    assert "img/s" not in r.output and "\r" not in r.output and "checking" not in r.output


def test_nested_folders_and_stray_files_are_named(folder, tmp_path):
    import shutil

    root = tmp_path / "mixed"
    shutil.copytree(folder, root)
    (root / "class3" / "more").mkdir()
    Image.fromarray(np.zeros((28, 28), np.uint8), mode="L").save(root / "class3" / "more" / "x.png")
    (root / "notes.txt").write_text("hello")
    (root / "class1" / "labels.csv").write_text("a,b")
    ds = data.build("image_folder", root=root)
    assert ds.ignored == ["notes.txt", "class1/labels.csv", "class3/more/"]
    want = (
        "image_folder: not read (only <class>/<image> files are images of the dataset): "
        "notes.txt, class1/labels.csv, class3/more/"
    )
    assert data.check_dataset(ds)[0] == want  # a study logs it when it opens
    out = cli("data", "summary", "image_folder", "--root", root, "--folds", "2").output
    assert f"warning: {want}" in out.replace("\n", " ")
    clean = data.build("image_folder", root=folder)
    assert clean.ignored == [] and data.ignored_warning(clean) == []


def test_data_bench_takes_folds(folder):
    r = cli("data", "bench", folder, "--preset", "cpu", "--folds", "1", code=2)
    assert r.output.strip() == "error: --folds: 1; give 2 or more"
    out = cli("data", "bench", folder, "--preset", "cpu", "--folds", "2", "--seconds", "0.2").output
    assert "fold 0 (3 training, 2 validation classes)" in out  # 5 train+val classes, 2 folds


def test_a_roles_error_names_the_roles_not_a_split(folder, tmp_path):
    import shutil

    root = tmp_path / "roles"
    shutil.copytree(folder, root)
    rows = ["path,role", "class0/0.png,query", "class0/1.png,gallery"]  # class0 also trains
    (root / "roles.csv").write_text("\n".join(rows) + "\n")
    r = cli("data", "summary", "image_folder", "--root", root, "--folds", "2", code=2)
    line = r.output.strip().splitlines()[-1]
    assert "--split" not in line, line
    assert line.startswith("error: image_folder: class 'class0' has training images")
    assert line.endswith(f"(query/gallery roles from {root / 'roles.csv'})")
