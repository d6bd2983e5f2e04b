"""The README is a front door and the docs site builds: length, links, every command documented,
and ``mkdocs build --strict`` (the CLI reference generated from the Typer app, the API pages
from the docstrings) with zero warnings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require

from mlrc.cli import command_paths

DOCS = REPO / "docs"
MARKDOWN = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
# [text](target) and [text](target "title"); images too. Code spans and fences are removed first.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def relative_links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, re.I)]


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the reference belongs in docs/"


def test_the_link_pattern_finds_links():
    sample = REPO / "README.md"
    assert "docs/guide/studies.md" in relative_links(sample)


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files(path):
    broken = []
    for target in relative_links(path):
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        if not file_part:
            continue
        if not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: links to missing files: {broken}"


def test_every_page_is_in_the_nav():
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        return []

    in_nav = set(pages(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk - in_nav == set(), "docs pages missing from mkdocs.yml's nav"
    assert in_nav - on_disk == set(), "nav entries without a page"


def test_the_cli_reference_is_generated_from_the_app():
    """The CLI page is the plugin's directive for ``mlrc.cli`` (so every command, present and
    future, is rendered from the app), the plugin is enabled, and ``docs/hooks.py`` turns a
    command missing from the rendered page into a strict-build error."""
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert re.search(r"^::: mkdocs-typer2\n\s+:module: mlrc\.cli\n", page, re.M), page
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+- mkdocs-typer2\b", config, re.M)
    assert re.search(r"^hooks:\n\s+- docs/hooks\.py", config, re.M)
    assert "def on_page_content" in (DOCS / "hooks.py").read_text(encoding="utf-8")


def test_every_command_is_in_the_commands_overview():
    """The hand-written overview names every command too: a new command needs a line there."""
    overview = (DOCS / "reference" / "commands.md").read_text(encoding="utf-8")
    paths = command_paths()
    assert {"mlrc study run", "mlrc report", "mlrc data list"} <= set(paths)
    missing = [p for p in paths if p not in overview]
    assert not missing, f"docs/reference/commands.md does not mention {missing}"


def _mkdocs() -> str | None:
    local = Path(sys.executable).with_name("mkdocs")
    return str(local) if local.exists() else shutil.which("mkdocs")


def test_docs_build_strict(tmp_path):
    """``mkdocs build --strict`` with zero warnings; the CLI page lists every command and the
    API page documents the protocol functions."""
    mkdocs = _mkdocs()
    require(mkdocs is not None, "mkdocs is not installed (pip install -e '.[dev]')")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "WARNING" not in log, log[-4000:]
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    missing = [p for p in command_paths() if f"<code>{p}</code>" not in cli]
    assert not missing, f"the rendered CLI reference lacks {missing}"
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for anchor in (
        "mlrc.protocol.metrics.retrieval_metrics",
        "mlrc.protocol.splits.mlrc_split",
        "mlrc.protocol.stats.confidence_interval",
        "mlrc.config.load_study",
    ):
        assert f'id="{anchor}"' in api, anchor
    assert not list(REPO.glob("site/index.html")), "the build wrote into the repository"


def test_the_design_is_in_the_repository():
    """#37: the README sent a user to the design beside the repository (shared/DESIGN.md),
    which a clone does not have."""
    outside = [p.relative_to(REPO) for p in MARKDOWN if "DESIGN.md" in p.read_text("utf-8")]
    assert outside == []
    assert "docs/guide/design.md" in (REPO / "README.md").read_text("utf-8")
    assert "guide/design.md" in (REPO / "mkdocs.yml").read_text("utf-8")
    assert "| test split |" in (DOCS / "guide" / "design.md").read_text("utf-8")


def test_fidelity_states_what_no_seed_reproduces():
    """#37 finding 10: the reference's unseeded generator, its own pins, the all-folds-at-epoch-0
    case, old .npz without best_epochs and the loader iterators are stated."""
    page = " ".join((DOCS / "guide" / "fidelity.md").read_text("utf-8").split())
    for said in (
        "replaces PML's generator with an **unseeded** `np.random.RandomState()`",
        "no seed gives the reference runs' batches",
        "powerful-benchmarker **0.9.32**",
        "pins PML **0.9.88**",
        "**When every fold of a reproduction is at epoch 0**",
        "before `best_epochs` was kept",
        "one `DataLoader` iterator per fold",
    ):
        assert said in page, said
