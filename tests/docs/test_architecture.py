"""docs/guide/architecture.md describes the house as it is: its generated blocks (the layers of
the import-linter contract, every module with its docstring's first sentence) match what
scripts/architecture.py writes from pyproject.toml and mlrc/ now, and every module path the
page's prose names exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guide" / "architecture.md"


def test_the_generated_blocks_match_the_contract_and_the_modules():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "architecture.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_layer_of_the_contract_is_on_the_page_in_order():
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    page = PAGE.read_text()
    block = page.split("<!-- layers:start -->")[1].split("<!-- layers:end -->")[0]
    listed = re.findall(r"^\d+\. `([^`]+)`$", block, flags=re.M)
    assert listed == [" | ".join(p.strip() for p in layer.split("|")) for layer in layers]


def test_every_module_named_in_the_prose_exists():
    prose = PAGE.read_text().split("<!-- rooms:start -->")[0]
    named = set(
        re.findall(
            r"`((?:cli|search|report|train|store|config|methods|models|data|"
            r"protocol)/[\w/]+(?:\.py|/))`",
            prose,
        )
    )
    assert named, "the prose names no module"
    missing = sorted(n for n in named if not (REPO / "mlrc" / n).exists())
    assert not missing, f"named on the page but not in mlrc/: {missing}"


def test_a_module_added_to_the_package_makes_the_page_out_of_date(tmp_path):
    """The check can fail: the generator run on a copy of the package with one more module
    finds the page out of date."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import architecture
    finally:
        sys.path.remove(str(REPO / "scripts"))
    page = PAGE.read_text()
    copy = tmp_path / "mlrc"
    shutil.copytree(REPO / "mlrc", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert architecture.render(page, copy) == page
    (copy / "protocol" / "probe.py").write_text('"""A probe."""\n')
    assert architecture.render(page, copy) != page
