"""A clone is whole: no study file, doc example or script names a path outside the repository.

A user's clone has nothing beside it, so what they run — the study and campaign files under
``studies/``, the commands and files in the docs' code blocks, ``scripts/`` and ``bench/`` —
uses data the project gets on its own (``omniglot`` without a root: downloaded, SHA-256
checked; the embedded ``glyphs``), a path inside the repository, or a placeholder for the
user's own copy of a dataset the project cannot fetch (``/data/CUB_200_2011``, ``~/data/…``:
"set dataset.root to your copy"). Never ``../shared``, never a relative path that climbs out.
Only the tests may read ``../shared`` (the real Omniglot subset, and the check that the
reference extracts are still the notes' text), and they skip without it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
PLACEHOLDER = re.compile(r"^~?/data/")  # the user's own copy of CUB, Cars, SOP, their images
PATH_KEYS = ("root", "split", "preset", "file")  # keys of a study or campaign file naming files
CLIMBS = re.compile(r"(?<![\w.~/-])\.\./\S*")  # a relative path that starts by leaving
DATA_ARGS = re.compile(r"(?:--root|--zip|--dataset|root:)\s*(\S+?)[},]?(?:\s|$)")
SHARED = re.compile(r"\.\./shared|parent\s*/\s*[\"']shared[\"']|/work/")

STUDY_FILES = sorted((REPO / "studies").glob("**/*.yaml"))
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
DOC_PAGES += sorted((REPO / "studies").rglob("*.md"))
SCRIPTS = sorted([*(REPO / "scripts").glob("*.py"), *(REPO / "bench").glob("*.py")])


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def outside(value: str, base: Path) -> str | None:
    """Why ``value`` (a path in a file under ``base``) leaves the repository, or None. Relative
    paths resolve as mlrc resolves a dataset root: the working directory (the repository's
    root, where the docs' commands run), then the file's folder — both must stay inside."""
    if value in ("predefined", "cpu", "reference", "modern", "traditional"):
        return None  # a split or preset by name
    if PLACEHOLDER.match(value):
        return None
    if value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:\\", value):
        return f"{value} is an absolute path outside the repository"
    for start in (REPO, base):
        if not Path(os.path.normpath(start / value)).is_relative_to(REPO):
            return f"{value} leaves the repository (from {rel(start) if start != REPO else '.'})"
    return None


def named_paths(node, key: str = "") -> list[str]:
    """The strings under the path keys of a YAML document, at any depth."""
    if isinstance(node, dict):
        return [v for k, sub in node.items() for v in named_paths(sub, str(k))]
    if isinstance(node, list):
        return [v for item in node for v in named_paths(item, key)]
    return [node] if key in PATH_KEYS and isinstance(node, str) else []


def test_the_rule_tells_inside_from_outside(tmp_path):
    base = REPO / "studies" / "campaigns"
    assert outside("../shared/datasets/omniglot/x.zip", REPO) is not None
    assert outside("/work/shared/datasets/omniglot/x.zip", REPO) is not None
    assert outside("../../x.zip", base) is not None  # inside from studies/campaigns/, not from .
    assert outside("/data/CUB_200_2011", base) is None and outside("~/data/x", base) is None
    assert outside("tests/fixtures", REPO) is None and outside("predefined", base) is None
    doc = {"datasets": [{"name": "omniglot", "root": "../x"}], "preset": "cpu", "n": "../y"}
    assert named_paths(doc) == ["../x", "cpu"]
    block = "```yaml\ndataset: {name: omniglot, root: ../shared/o.zip}\n```\n"
    assert [m.group(1) for m in DATA_ARGS.finditer(block)] == ["../shared/o.zip"]
    assert CLIMBS.findall("mlrc data check omniglot --root ../shared/o.zip") == ["../shared/o.zip"]
    assert CLIMBS.findall("cd tests/../docs; ls ~/../x") == []  # inside, or not relative


@pytest.mark.parametrize("path", STUDY_FILES, ids=rel)
def test_study_and_campaign_files_name_no_path_outside(path):
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    wrong = [why for v in named_paths(doc) if (why := outside(v, path.parent))]
    assert not wrong, f"{rel(path)}: {wrong}"


def test_the_example_studies_need_nothing_beside_the_clone():
    """The Omniglot examples download their data (no root): a bare clone runs them as they are."""
    for name in ("omniglot-contrastive.yaml", "campaigns/omniglot.yaml"):
        doc = yaml.safe_load((REPO / "studies" / name).read_text(encoding="utf-8"))
        datasets = doc.get("datasets") or [doc["dataset"]]
        assert all(d["name"] in ("omniglot", "glyphs") and "root" not in d for d in datasets), name


@pytest.mark.parametrize("path", DOC_PAGES, ids=rel)
def test_doc_examples_name_no_path_outside(path):
    """In the pages' code blocks (commands and files a user copies): no path that climbs out of
    the repository, and every dataset root inside it, absent, or the user's own copy."""
    wrong = []
    for block in FENCE.finditer(path.read_text(encoding="utf-8")):
        text = block.group(0)
        wrong += [f"{p}: climbs out of the repository" for p in CLIMBS.findall(text)]
        wrong += [why for m in DATA_ARGS.finditer(text) if (why := outside(m.group(1), REPO))]
        wrong += [f"{m.group(0)}: outside the repository" for m in SHARED.finditer(text)]
    assert not wrong, f"{rel(path)}: {sorted(set(wrong))}"


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_scripts_read_nothing_beside_the_clone(path):
    text = path.read_text(encoding="utf-8")
    found = [m.group(0) for m in SHARED.finditer(text)] + CLIMBS.findall(text)
    assert not found, f"{rel(path)} names paths outside the repository: {found}"


def test_only_the_data_tests_look_beside_the_clone():
    """../shared is read by two tests only, both skipping without it (failing in CI): the real
    Omniglot subset (conftest's omniglot_zip) and the check that tests/fixtures/reference still
    copies the notes verbatim. Every other reference lives in the repository."""
    readers = sorted(
        rel(p)
        for p in (REPO / "tests").rglob("*.py")
        if p.name != Path(__file__).name and SHARED.search(p.read_text(encoding="utf-8"))
    )
    assert readers == ["tests/conftest.py", "tests/e2e/test_traditional_studies.py"], readers
