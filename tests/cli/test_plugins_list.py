"""``mlrc plugins list [KIND]`` and the records below it (:func:`mlrc.config.plugins.plugin_records`):
every registered plug-in, its source package, parameters and capabilities. The installed
outside package's row (its distribution's name) is checked end to end in
tests/e2e/test_plugin_package.py; here, where a registry says an entry came from."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from mlrc.cli import app
from mlrc.config.plugins import PLUGIN_KINDS, plugin_records
from mlrc.data import DATASETS
from mlrc.methods import losses, miners, samplers, strategies
from mlrc.models import TRUNKS
from mlrc.protocol.scoring import METRICS

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
REGISTRIES = {
    "loss": losses.LOSSES,
    "miner": miners.MINERS,
    "strategy": strategies.STRATEGIES,
    "sampler": samplers.SAMPLERS,
    "trunk": TRUNKS,
    "dataset": DATASETS,
    "metric": METRICS,
}


def test_the_kinds_are_the_registries_kinds():
    assert tuple(REGISTRIES) == PLUGIN_KINDS
    assert all(reg.kind == kind for kind, reg in REGISTRIES.items())


@pytest.mark.parametrize("kind", PLUGIN_KINDS)
def test_every_registered_name_is_listed(kind):
    names = REGISTRIES[kind].available()
    assert names, kind
    r = runner.invoke(app, ["plugins", "list", kind], env=WIDE)
    assert r.exit_code == 0, r.output
    missing = [n for n in names if f" {n} " not in r.output]
    assert not missing, r.output
    listed = runner.invoke(app, ["plugins", "list", kind, "--json"])
    assert listed.exit_code == 0, listed.output
    records = json.loads(listed.stdout)
    assert [x["name"] for x in records if ":" not in x["name"]] == names
    assert {x["kind"] for x in records} == {kind}


def test_without_a_kind_every_kind_is_listed():
    records = json.loads(runner.invoke(app, ["plugins", "list", "--json"]).stdout)
    assert {x["kind"] for x in records} == set(PLUGIN_KINDS)
    assert len(records) == len(plugin_records())
    table = runner.invoke(app, ["plugins", "list"], env=WIDE).output
    assert all(f"{kind} plug-ins" in table for kind in PLUGIN_KINDS)


def test_a_records_fields_are_its_registrations():
    (margin,) = [r for r in plugin_records("loss") if r.name == "margin"]
    info = losses.info("margin")
    assert margin.source == "mlrc" and margin.doc == info.doc
    assert {k: v["default"] for k, v in margin.params.items()} == info.params
    assert margin.params["beta"]["type"] == info.types["beta"].describe()
    assert margin.capabilities == {"batch": "pair", "takes_tuples": True, "has_parameters": True}
    (mf,) = [r for r in plugin_records("loss") if r.name == "mean_field_contrastive"]
    assert mf.capabilities["takes_tuples"] is False
    (rho,) = [r for r in plugin_records("strategy") if r.name == "rho_distance"]
    assert rho.capabilities["uses_miner"] is False and rho.capabilities["positive_pairs"]
    assert set(rho.space) == {"p_switch"}  # studies/spaces/strategies/rho_distance.yaml
    assert [r.name for r in plugin_records("trunk") if ":" in r.name] == ["timm:<model>"]


def test_an_unknown_kind_is_one_line_naming_the_close_one():
    r = runner.invoke(app, ["plugins", "list", "losss"])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "did you mean 'loss'?" in lines[0], r.output
    assert "unknown plug-in kind 'losss'" in lines[0]


def _site(tmp_path):
    """A distribution ``mlrc-catalog-test`` installed by hand (a dist-info folder beside its
    package): its entry point in group ``mlrc.test_catalog`` registers ``alpha`` into the
    registry of ``mlrc_catalog_host`` (a module no distribution installed)."""
    site = tmp_path / "site"
    (site / "mlrc_catalog_test").mkdir(parents=True)
    (site / "mlrc_catalog_test" / "__init__.py").write_text(
        "from mlrc_catalog_host import REG\n\n"
        "def beta(*, k: int = 2):\n    return k\n\n"
        "@REG.register('alpha')\ndef alpha(*, k: int = 1):\n    return k\n"
    )
    (site / "mlrc_catalog_host.py").write_text(
        "from mlrc.registry import Registry\n\n"
        "REG = Registry('thing', group='mlrc.test_catalog')\n\n"
        "def gamma(*, k: int = 3):\n    return k\n"
    )
    info = site / "mlrc_catalog_test-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlrc-catalog-test\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mlrc.test_catalog]\nalpha = mlrc_catalog_test\n")
    (info / "top_level.txt").write_text("mlrc_catalog_test\n")
    return site


def test_a_registry_knows_where_each_entry_came_from(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_site(tmp_path)))
    try:
        import mlrc_catalog_host

        reg = mlrc_catalog_host.REG
        assert reg.available() == ["alpha"]  # loaded through the entry point
        assert reg.source("alpha") == "mlrc-catalog-test"  # the distribution's name
        plugin = sys.modules["mlrc_catalog_test"]
        reg.register("beta", plugin.beta)  # outside an entry point: found from its module
        reg.register("gamma", mlrc_catalog_host.gamma)  # no distribution: its package
        assert reg.source("beta") == "mlrc-catalog-test"
        assert reg.source("gamma") == "mlrc_catalog_host"
        assert losses.LOSSES.source("contrastive") == "mlrc"
    finally:
        for name in ("mlrc_catalog_host", "mlrc_catalog_test"):
            sys.modules.pop(name, None)
