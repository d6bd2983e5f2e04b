"""mlrc installed from a wheel (not editable) runs: presets, spaces and templates are package data.

The wheel is built from a copy of the working tree and installed with ``--no-deps`` into a fresh
venv. The fresh venv sees the test venv's dependencies (torch, optuna, ...) through a ``.pth``
file naming the test venv's site-packages: a folder added by a ``.pth`` is not a site folder,
so the ``.pth`` files in it (the editable install's finder among them) are not run and
``import mlrc`` finds the installed wheel only — the test checks that it does.

Anything the wheel lacks is a failure here, never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODE_SUFFIXES = {".py", ".pyc"}  # everything else under mlrc/ is package data

pytestmark = pytest.mark.slow


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 1800) -> str:
    """Run ``cmd``; its combined output (the output in the failure message when it fails)."""
    done = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{out}"
    return out


def copy_source(dest: Path) -> Path:
    """The files a wheel is built from (pyproject, README, licence, mlrc/), without build
    leftovers: a wheel built in the checkout itself could pick up a stale ``build/`` folder."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "mlrc", dest / "mlrc", ignore=ignore)
    return dest


def package_data(root: Path) -> set[str]:
    """Data files (all but code) of the package under ``root`` (``mlrc/...``), relative to
    ``root``."""
    return {
        str(p.relative_to(root))
        for p in (root / "mlrc").rglob("*")
        if p.is_file() and p.suffix not in CODE_SUFFIXES and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed; its ``bin``, site-packages and environment."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {
        **os.environ,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INDEX": "1",
        "PYTHONNOUSERSITE": "1",
        "MLRC_CACHE": str(tmp / "cache"),
    }
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "MLRC_STORAGE", "MLRC_ARTIFACTS"):
        env.pop(var, None)
    source = copy_source(tmp / "src")
    wheels = tmp / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    run([*pip_wheel, source, "-w", wheels], tmp, env)
    (wheel,) = wheels.glob("mlrc-*.whl")

    venv = tmp / "fresh"
    run([sys.executable, "-m", "venv", venv], tmp, env)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "--no-deps", wheel], tmp, env)
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env
        ).strip()
    )
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}  # torch, optuna, ...
    (site / "mlrc-test-dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    work = tmp / "cwd"  # not the checkout: nothing is found relative to the current folder
    work.mkdir()
    return {"bin": venv / "bin", "site": site, "env": env, "cwd": work}


def test_the_wheel_is_what_is_imported(fresh):
    code = "import mlrc, mlrc.config as c; print(mlrc.__file__); print(c.PRESETS_DIR)"
    out = run([fresh["bin"] / "python", "-c", code], fresh["cwd"], fresh["env"]).split()
    module, presets = Path(out[0]), Path(out[1])
    assert module.is_relative_to(fresh["site"]), f"mlrc imported from {module}, not the wheel"
    assert presets.is_relative_to(fresh["site"]), f"presets read from {presets}"


def test_the_wheel_holds_every_data_file(fresh):
    """Every preset, space and dashboard template of the checkout (and any space beside a
    plug-in module) is installed."""
    missing = package_data(REPO) - package_data(fresh["site"])
    assert not missing, f"not in the wheel: {sorted(missing)}"


def test_a_preset_and_a_space_are_read_from_the_installed_package(fresh):
    code = textwrap.dedent(
        """
        from mlrc.config import LOSS_SPACES_DIR, default_space, load_preset
        print(load_preset("cpu").trunk, sorted(default_space("contrastive")), LOSS_SPACES_DIR)
        """
    )
    out = run([fresh["bin"] / "python", "-c", code], fresh["cwd"], fresh["env"]).split()
    assert out[:3] == ["tiny_cnn", "['neg_margin',", "'pos_margin']"], out
    assert Path(out[3]).is_relative_to(fresh["site"])


def test_demo_study_and_dashboard_run_from_the_wheel(fresh):
    mlrc, cwd, env = fresh["bin"] / "mlrc", fresh["cwd"], fresh["env"]
    storage = f"sqlite:///{cwd / 'store.db'}"
    store = ["--storage", storage, "--artifacts", cwd / "artifacts"]
    demo = ["demo", "--quiet", "--trials", "1", "--reproductions", "2", "--max-epochs", "1"]
    out = run([mlrc, *demo, "--losses", "contrastive", *store], cwd, env)  # one: the CLI test
    assert "### glyphs" in out and "| contrastive | 2 |" in out, out  # runs both

    study = cwd / "study.yaml"  # no loss.search: the space comes from the installed package
    study.write_text(
        textwrap.dedent(
            """
            name: wheel-glyphs-triplet
            dataset: {name: glyphs}
            preset: cpu
            loss: {name: triplet}
            search: {trials: 1, seed: 0}
            test: {reproductions: 2}
            overrides: {max_epochs: 1, iterations_per_epoch: 5, folds: 2}
            """
        )
    )
    out = run([mlrc, "study", "run", study, "--quiet", *store], cwd, env)
    assert "wheel-glyphs-triplet" in out, out

    html = cwd / "dashboard.html"
    run([mlrc, "dashboard", "build", "--storage", storage, "--out", html], cwd, env)
    assert html.stat().st_size > 0
