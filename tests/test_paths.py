"""mlrc.paths: every cache folder lies under one root, whatever ``MLRC_CACHE`` says (issue #23).

The expected root is written out here from the rule the docs state (docs/guide/datasets.md,
"The cache folder"): ``$MLRC_CACHE`` when set and not empty (``~`` expanded, relative to the
current folder), else ``~/.cache/mlrc``; ``HOME`` and the current folder are pinned to temporary
folders so each expectation is a literal path. Before mlrc.paths, ``MLRC_CACHE=""`` sent the
downloads, decoded images, checked keys and tracebacks to the current folder but the weights to
``~/.cache/mlrc/weights``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mlrc import paths
from mlrc.cli import traceback_folder
from mlrc.data import cache, download, verify
from mlrc.models import weights
from mlrc.train import threads

# every folder function, mlrc.paths' own and the public names that delegate to it, with the
# folder it must name relative to the root
FOLDERS: dict[str, tuple[Callable[[], Path], str]] = {
    "paths.downloads_dir": (paths.downloads_dir, "."),
    "paths.weights_dir": (paths.weights_dir, "weights"),
    "paths.timm_weights_dir": (paths.timm_weights_dir, "weights/timm"),
    "paths.decoded_dir": (paths.decoded_dir, "decoded"),
    "paths.checked_dir": (paths.checked_dir, "checked"),
    "paths.workers_dir": (paths.workers_dir, "workers"),
    "paths.logs_dir": (paths.logs_dir, "logs"),
    "download.cache_dir": (download.cache_dir, "."),
    "weights.weights_cache_dir": (weights.weights_cache_dir, "weights"),
    "cache.default_cache_dir": (cache.default_cache_dir, "decoded"),
    "verify.checked_dir": (verify.checked_dir, "checked"),
    "threads.lock_dir": (threads.lock_dir, "workers"),
    "cli.traceback_folder": (traceback_folder, "logs"),
}

# MLRC_CACHE's value (None: unset; {tmp}: the test's folder) -> the root, relative to that folder
CASES: dict[str, tuple[str | None, str]] = {
    "unset": (None, "home/.cache/mlrc"),
    "empty": ("", "home/.cache/mlrc"),
    "absolute": ("{tmp}/elsewhere/cache", "elsewhere/cache"),
    "tilde": ("~/x", "home/x"),
    "relative": ("rel/cache", "cwd/rel/cache"),
}


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """The test's temporary folder without symbolic links (``os.getcwd()`` resolves them)."""
    return tmp_path.resolve()


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch, base: Path) -> Callable[[str | None], None]:
    """``HOME`` = base/home, current folder = base/cwd; the returned function sets MLRC_CACHE."""
    (base / "home").mkdir()
    (base / "cwd").mkdir()
    monkeypatch.setenv("HOME", str(base / "home"))
    monkeypatch.chdir(base / "cwd")

    def set_cache(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("MLRC_CACHE", raising=False)
        else:
            monkeypatch.setenv("MLRC_CACHE", value.format(tmp=base))

    return set_cache


def test_every_folder_function_is_checked() -> None:
    """A folder added to mlrc.paths is added to FOLDERS (and to the docs' table)."""
    functions = {n for n in paths.__all__ if n.endswith("_dir")}
    assert functions == {k.split(".", 1)[1] for k in FOLDERS if k.startswith("paths.")}
    table = (Path(__file__).parents[1] / "docs" / "guide" / "datasets.md").read_text()
    assert [n for n in sorted(functions) if f"`{n}()`" not in table] == []


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", FOLDERS)
def test_folders_lie_under_the_documented_root(
    pinned: Callable[[str | None], None], base: Path, case: str, name: str
) -> None:
    value, root = CASES[case]
    pinned(value)
    function, sub = FOLDERS[name]
    assert function() == base / root / sub  # pathlib drops the "." of the root itself
    assert paths.cache_root() == base / root


def test_empty_cache_variable_keeps_weights_and_decoded_images_together(
    pinned: Callable[[str | None], None], base: Path
) -> None:
    """The bug: with MLRC_CACHE="" the decoded images went to ./decoded, the weights to
    ~/.cache/mlrc/weights. Now both (and every other folder) sit under ~/.cache/mlrc."""
    pinned("")
    home_cache = base / "home" / ".cache" / "mlrc"
    assert weights.weights_cache_dir().parent == cache.default_cache_dir().parent == home_cache
    assert download.cache_dir() == verify.checked_dir().parent == traceback_folder().parent
    assert download.cache_dir() == threads.lock_dir().parent == home_cache
    assert not any(f().is_relative_to(base / "cwd") for f, _ in FOLDERS.values())
