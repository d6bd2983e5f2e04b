"""docs/guide/plugins.md works as written: its outside package, taken from the page's titled code
blocks, is built and installed with pip (offline, into a folder of its own), ``mlrc plugins list
loss`` shows it with its distribution's name, and the page's study — shrunk to one trial, two
reproductions (the fewest a confidence interval takes), two folds and two iterations — runs its
search and its test stage to the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from sqlalchemy import select

from mlrc import store
from mlrc.store.engine import session
from mlrc.store.schema import TestResult, Trial

PAGE = REPO / "docs" / "guide" / "plugins.md"
TITLED = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```', re.S | re.M)
TINY = {  # the fewest folds and steps a study and its test stage take: seconds, not minutes
    "iterations_per_epoch": 2,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "folds": 2,
}


def page_files() -> dict[str, str]:
    """The page's titled code blocks: relative path → text."""
    return dict(TITLED.findall(PAGE.read_text(encoding="utf-8")))


def mlrc(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``mlrc ARGS`` in a fresh process (entry points are read once per process)."""
    return subprocess.run(
        [sys.executable, "-c", "from mlrc.cli import app; app()", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_the_page_holds_the_whole_package():
    files = page_files()
    assert set(files) == {
        "mlrc-myloss/pyproject.toml",
        "mlrc-myloss/mlrc_myloss/__init__.py",
        "mlrc-myloss/mlrc_myloss/cosine_contrastive.yaml",
        "myloss-glyphs.yaml",
    }, sorted(files)
    assert '"mlrc.losses"' in files["mlrc-myloss/pyproject.toml"]  # the group mlrc reads


@pytest.mark.slow  # about a minute on 2 idle cores: pip, four processes, a study and its test
def test_the_guides_package_installs_lists_and_runs_a_study(tmp_path):
    files = page_files()
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")

    # `pip install ./mlrc-myloss`, but offline and into a folder of its own (the shared
    # virtualenv must not see the loss: other test processes run meanwhile).
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*pip, "--no-index", "--target", str(site), str(tmp_path / "mlrc-myloss")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "250"}

    listed = mlrc("plugins", "list", "loss", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    row = [ln for ln in listed.stdout.splitlines() if "cosine_contrastive" in ln]
    assert len(row) == 1 and "mlrc-myloss" in row[0], listed.stdout
    assert "takes_tuples=False" in row[0] and "pos_margin [0, 0.3]" in row[0], row
    assert "contrastive" in listed.stdout and " mlrc " in listed.stdout  # the built-ins too

    study = yaml.safe_load(files["myloss-glyphs.yaml"])
    assert study["dataset"] == {"name": "glyphs"} and study["preset"] == "cpu"
    study["search"]["trials"] = 1
    study["test"]["reproductions"] = 2  # the fewest a confidence interval takes
    study["overrides"] = TINY
    (tmp_path / "myloss-glyphs.yaml").write_text(yaml.safe_dump(study))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    where = ["--storage", url, "--artifacts", str(tmp_path / "art"), "--quiet"]
    for stage in ("run", "test"):
        done = mlrc("study", stage, "myloss-glyphs.yaml", *where, env=env, cwd=tmp_path)
        assert done.returncode == 0, f"study {stage}: {done.stdout}{done.stderr}"

    space = yaml.safe_load(files["mlrc-myloss/mlrc_myloss/cosine_contrastive.yaml"])
    with session(store.connect(url)) as s:
        trials = s.execute(select(Trial)).scalars().all()
        tests = s.execute(select(TestResult)).scalars().all()
    assert [t.state for t in trials] == ["complete"], trials
    params = trials[0].params
    params = params if isinstance(params, dict) else yaml.safe_load(params)
    assert set(params) == set(space)  # the package's own space was searched
    for name, value in params.items():
        assert space[name]["low"] <= value <= space[name]["high"], (name, value)
    aggregates = {(t.reproduction, t.mode) for t in tests if t.fold == -1}
    assert aggregates == {(r, m) for r in (1, 2) for m in ("separated", "concatenated")}, aggregates
    assert all(t.params == params for t in tests)  # the best trial's parameters, retrained
