"""Plug-ins: one registry class, modules of a kind's package imported automatically, and
entry-point groups (``mlrc.losses``, ...) that other installed distributions register through."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from mlrc import registry, store
from mlrc.config import default_space
from mlrc.methods import losses
from mlrc.registry import Registry, RegistryError, import_submodules
from mlrc.store.engine import session
from mlrc.store.schema import Trial

TINY = {  # as tests/search/test_session.py: a study in seconds
    "iterations_per_epoch": 4,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
}

PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mlrc-tiny-plugin"
version = "0.1.0"

[project.entry-points."mlrc.losses"]
tiny = "mlrc_tiny_plugin"
broken = "mlrc_tiny_plugin.broken"

[tool.setuptools]
packages = ["mlrc_tiny_plugin"]

[tool.setuptools.package-data]
mlrc_tiny_plugin = ["*.yaml"]
"""

PLUGIN = '''\
"""A loss from outside mlrc: registered on import, its space beside it."""

from pytorch_metric_learning import losses as L

from mlrc.methods import losses


@losses.register("tiny_contrastive", batch="pair")
def tiny_contrastive(*, num_classes: int, embedding_size: int, neg_margin: float = 1.0):
    """Contrastive loss with only the negative margin searched (a test plug-in)."""
    return L.ContrastiveLoss(pos_margin=0.0, neg_margin=neg_margin)
'''


def _build_plugin(root: Path) -> Path:
    """The distribution's sources under ``root``; returns the folder to pip-install."""
    src = root / "mlrc-tiny-plugin"
    pkg = src / "mlrc_tiny_plugin"
    pkg.mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "__init__.py").write_text(PLUGIN)
    (pkg / "tiny_contrastive.yaml").write_text("neg_margin: {low: 0.2, high: 1.5}\n")
    (pkg / "broken.py").write_text("import mlrc_no_such_module_xyz  # noqa: F401\n")
    return src


def test_installed_plugin_loss_is_searched_end_to_end(tmp_path):
    """A distribution built here (own pyproject.toml, entry point in ``mlrc.losses``, space as
    package data) is installed with pip; a fresh ``mlrc study run`` searches its loss.

    It is installed into a folder of its own (``pip install --target``) that the subprocess puts
    on its path, not into the shared virtualenv: a loss appearing there would be seen by every
    other test process running at the same time (e.g. the one-space-file-per-loss check)."""
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*pip, "--no-index", "--target", str(site), str(_build_plugin(tmp_path))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert list(site.glob("mlrc_tiny_plugin-0.1.0.dist-info"))

    doc = {
        "name": "tiny-plugin",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "tiny_contrastive"},
        "search": {"trials": 2, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": TINY,
    }
    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mlrc.cli import app; app()",
            "study",
            "run",
            str(study),
            "--storage",
            url,
            "--artifacts",
            str(tmp_path / "art"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr

    # The broken entry point of the same distribution: one warning line, and the run went on.
    warned = [ln for ln in run.stderr.splitlines() if "'broken'" in ln]
    assert len(warned) == 1, run.stderr
    assert "mlrc-tiny-plugin" in warned[0] and "mlrc_tiny_plugin.broken" in warned[0]
    assert "ModuleNotFoundError" in warned[0] and "Traceback" not in run.stderr

    with session(store.connect(url)) as s:
        trials = s.execute(select(Trial)).scalars().all()
    assert len(trials) == 2 and all(t.state == "complete" for t in trials), trials
    for t in trials:  # the plug-in's own space, shipped beside its module, was searched
        params = t.params if isinstance(t.params, dict) else yaml.safe_load(t.params)
        assert set(params) == {"neg_margin"} and 0.2 <= params["neg_margin"] <= 1.5


def test_new_module_in_the_losses_package_registers_without_an_import_line(tmp_path, monkeypatch):
    """A module dropped into mlrc/methods/losses/ is imported with the package's others. The
    package's folder is extended with a temporary one rather than written into (other test
    processes import the real package meanwhile)."""
    extra = tmp_path / "losses"
    extra.mkdir()
    (extra / "dropin_test_loss.py").write_text(
        textwrap.dedent(
            '''
            from mlrc.methods.losses import register
            from pytorch_metric_learning import losses as L


            @register("test_dropin", batch="pair")
            def test_dropin(*, num_classes: int, embedding_size: int, margin: float = 0.1):
                """A dropped-in loss."""
                return L.TripletMarginLoss(margin=margin)
            '''
        )
    )
    monkeypatch.setattr(losses, "__path__", [*losses.__path__, str(extra)])
    try:
        names = import_submodules("mlrc.methods.losses")
        assert "mlrc.methods.losses.dropin_test_loss" in names
        assert "mlrc.methods.losses.pml" in names  # the shipped ones, found the same way
        assert "test_dropin" in losses.available()
        assert losses.info("test_dropin").params == {"margin": 0.1}
        assert (
            losses.build("test_dropin", num_classes=3, embedding_size=8, margin=0.3).margin == 0.3
        )
    finally:
        losses.LOSSES.unregister("test_dropin")
        sys.modules.pop("mlrc.methods.losses.dropin_test_loss", None)


def test_auto_import_of_a_package_of_plugins(tmp_path, monkeypatch):
    pkg = tmp_path / "mlrc_test_kind"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from mlrc.registry import Registry, import_submodules\n"
        "THINGS = Registry('thing')\n"
        "import_submodules(__name__)\n"
    )
    (pkg / "alpha.py").write_text(
        "from mlrc_test_kind import THINGS\n\n"
        "@THINGS.register('alpha')\n"
        "def alpha(*, size: int = 2):\n    return ['a'] * size\n"
    )
    (pkg / "_private.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import mlrc_test_kind

        assert mlrc_test_kind.THINGS.available() == ["alpha"]
        assert mlrc_test_kind.THINGS.build("alpha", size=3) == ["a", "a", "a"]
        with pytest.raises(
            TypeError, match=r"thing 'alpha' takes no parameter 'sise' \(it takes: size\)"
        ):
            mlrc_test_kind.THINGS.build("alpha", sise=3)
    finally:
        for name in [n for n in sys.modules if n.startswith("mlrc_test_kind")]:
            del sys.modules[name]


def _registry_with(monkeypatch, *eps: EntryPoint) -> Registry:
    reg = Registry("loss", group="mlrc.test_group")
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [e for e in eps if e.group == group]
    )
    return reg


def test_broken_entry_point_is_one_warning_line(monkeypatch, caplog):
    reg = _registry_with(
        monkeypatch,
        EntryPoint("gone", "mlrc_no_such_plugin_xyz", "mlrc.test_group"),
        EntryPoint("bad", "mlrc.registry:no_such_hook", "mlrc.test_group"),
    )
    with caplog.at_level(logging.WARNING, logger="mlrc"):
        assert reg.available() == []
        assert reg.available() == []  # loaded once: no second warning
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in ln for ln in lines)
    assert "loss plug-in 'gone'" in lines[0] and "mlrc_no_such_plugin_xyz" in lines[0]
    assert "ModuleNotFoundError" in lines[0] and "mlrc.test_group" in lines[0]
    assert "'bad'" in lines[1] and "AttributeError" in lines[1]


def test_entry_point_naming_a_hook_registers_lazily_once(monkeypatch):
    calls = []

    def hook():
        calls.append(1)
        reg.register("hooked", lambda *, k=1: k)

    monkeypatch.setattr(sys.modules[__name__], "_HOOK", hook, raising=False)
    reg = _registry_with(monkeypatch, EntryPoint("h", f"{__name__}:_HOOK", "mlrc.test_group"))
    assert calls == []  # nothing loaded before the first lookup
    assert reg.available() == ["hooked"] and reg.build("hooked", k=4) == 4
    assert reg.params("hooked") == {"k": 1}
    reg.available()
    assert calls == [1]
    with pytest.raises(RegistryError, match="unknown loss 'hoked'; did you mean 'hooked'"):
        reg.get("hoked")


def test_plugin_space_beside_its_module_or_given(tmp_path, monkeypatch):
    """default_space falls back to the plug-in's own file when studies/spaces/losses/ has none."""
    (tmp_path / "mlrc_test_spaced").mkdir()
    (tmp_path / "mlrc_test_spaced" / "__init__.py").write_text(
        "from mlrc.methods import losses\n\n"
        "@losses.register('test_spaced', batch='pair')\n"
        "def f(*, num_classes, embedding_size, margin: float = 0.1):\n    return None\n\n"
        "@losses.register('test_given', batch='pair', space=__name__ + ':other.yaml')\n"
        "def g(*, num_classes, embedding_size, margin: float = 0.1):\n    return None\n"
    )
    (tmp_path / "mlrc_test_spaced" / "test_spaced.yaml").write_text(
        "margin: {low: 0.0, high: 0.5}\nper_dataset: {glyphs: {margin: {low: 0.1, high: 0.2}}}\n"
    )
    (tmp_path / "mlrc_test_spaced" / "other.yaml").write_text("margin: {low: 0.3, high: 0.4}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import mlrc_test_spaced  # noqa: F401

        assert default_space("test_spaced")["margin"].high == 0.5
        assert default_space("test_spaced", dataset="glyphs")["margin"].high == 0.2
        assert default_space("test_given")["margin"].low == 0.3
        assert default_space("contrastive").keys() == {"pos_margin", "neg_margin"}  # unchanged
        assert default_space("no_such_loss") == {}
    finally:
        losses.LOSSES.unregister("test_spaced")
        losses.LOSSES.unregister("test_given")
        sys.modules.pop("mlrc_test_spaced", None)
