"""docs/tutorial.md runs as written: its files (fenced blocks with a ``title``) are written and
its ``bash`` blocks run in order, in an empty folder, with ``mlrc`` and ``python`` on PATH as a
user has them (this interpreter). A block after ``<!-- tutorial: skip (why) -->`` needs what a
test machine lacks (PostgreSQL and GPUs, a Ray cluster) and is not run; one after
``<!-- tutorial: slow -->`` trains and runs only in the slow test: 16 fold trainings of the cpu
preset at 1 epoch, 2 folds. That takes about 2 minutes on 2 idle cores. The same run checks what
the rest prints: the folder, ``data summary``/``data check`` and every ``campaign plan`` (which
validates each file and trains nothing)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "tutorial.md"
BLOCK = re.compile(
    r"(?:<!-- tutorial: (?P<tag>slow|skip[^>]*) -->\n)?"
    r"^```(?P<lang>\w+)(?: title=\"(?P<title>[^\"]+)\")?\n(?P<body>.*?)^```$",
    re.S | re.M,
)


@dataclass
class Block:
    lang: str
    title: str | None
    tag: str  # "", "slow" or "skip (why)"
    body: str


def blocks() -> list[Block]:
    text = PAGE.read_text(encoding="utf-8")
    return [Block(m["lang"], m["title"], m["tag"] or "", m["body"]) for m in BLOCK.finditer(text)]


def _shims(folder: Path) -> dict[str, str]:
    """An environment whose ``mlrc`` and ``python`` are this interpreter with this checkout."""
    folder.mkdir()
    for name, line in {
        "mlrc": f'exec "{sys.executable}" -m mlrc.cli "$@"',
        "python": f'exec "{sys.executable}" "$@"',
    }.items():
        shim = folder / name
        shim.write_text(f"#!/bin/sh\n{line}\n")
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MLRC_THREADS"] = env.get("MLRC_THREADS", "1")  # one core per process (tests/conftest.py)
    env["COLUMNS"] = "200"  # rich's tables unwrapped, as on a wide terminal
    for key in ("MLRC_STORAGE", "MLRC_ARTIFACTS", "MLRC_DEVICE"):
        env.pop(key, None)
    return env


def run_tutorial(folder: Path, slow: bool) -> dict[str, str]:
    """Write the files and run the bash blocks in order (the slow ones too when ``slow``);
    returns each run block's output, by its first line."""
    env = _shims(folder / ".bin")
    outputs: dict[str, str] = {}
    for b in blocks():
        if b.title:
            (folder / b.title).write_text(b.body, encoding="utf-8")
            continue
        if b.lang != "bash" or b.tag.startswith("skip") or (b.tag == "slow" and not slow):
            continue
        run = subprocess.run(
            ["bash", "-e", "-c", b.body],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert run.returncode == 0, f"{b.body}\nexit {run.returncode}\n{run.stdout}\n{run.stderr}"
        outputs[b.body.splitlines()[0]] = run.stdout + run.stderr
    return outputs


def test_the_page_has_what_the_tests_run():
    found = blocks()
    titles = [b.title for b in found if b.title]
    assert titles == [
        "make_folder.py",
        "first.yaml",
        "knobs.yaml",
        "vit.yaml",
        "first-contrastive.yaml",
        "papers.yaml",
    ]
    skipped = [b for b in found if b.tag.startswith("skip")]
    assert skipped and all(re.match(r"skip \(.+\)", b.tag) for b in skipped), "say why"
    assert sum(b.tag == "slow" for b in found) >= 4


def check_the_fast_commands(out: dict[str, str]) -> None:
    """What the commands that train nothing print (the folder, data summary, the plans)."""
    summary = out["python make_folder.py"]
    # what step 2 shows: the same split, line for line
    for line in [
        "image_folder: 256 images, 32 classes, 8–8 images per class",
        "16 train+val classes, 16 test classes, 2 folds (scheme 'mlrc')",
        "  fold 0: train 8 classes, val 8 classes 8–15",
        "  fold 1: train 8 classes, val 8 classes 0–7",
        "256 of 256 images readable",
    ]:
        assert line in summary.splitlines()
    # step 3's table: 2 losses × (1 trial × 2 folds + 2 reproductions × 2 folds)
    plan = out["mlrc campaign plan first.yaml"].splitlines()
    assert any(re.match(r"│ total +│ +12 / 12 │ +≤ 12 │", line) for line in plan), plan
    # knobs: 2 datasets × 5 losses, each 20 trials × 3 folds + 5 reproductions × 3 folds = 75
    assert "│ total " in out["mlrc campaign plan knobs.yaml"]
    assert "750 / 750" in out["mlrc campaign plan knobs.yaml"]
    # vit: 4 folds × (50 trials + 10 reproductions) per study, the modern preset's budget
    assert "240 / 240" in out["mlrc campaign plan vit.yaml --device cuda"]
    assert "campaign papers" in out["mlrc campaign plan papers.yaml --device cuda"]


def row(table: str, loss: str, n: int) -> bool:
    """Whether the markdown table has the row of ``loss`` with ``n`` reproductions (the best
    row's label is underlined: ``<ins>loss</ins>``)."""
    return re.search(rf"^\| (<ins>)?{loss}(</ins>)? \| {n} \|", table, re.M) is not None


@pytest.mark.slow
def test_the_whole_tutorial(tmp_path):
    """Every block, in order; the fast ones' output is checked too (one run of the page: the
    fast commands alone are `run_tutorial(folder, slow=False)`, for a quick look by hand)."""
    out = run_tutorial(tmp_path, slow=True)
    check_the_fast_commands(out)
    table = out["mlrc report --campaign first --format md"]
    assert row(table, "contrastive", 2) and row(table, "multi_similarity", 2), table
    assert "Concat. MAP@R" in table
    assert "Concat. MRR*" in out["mlrc study rescore first-image_folder-contrastive --metrics mrr"]
    grown = out["perl -pi -e 's/reproductions: 2/reproductions: 3/' first.yaml"]
    assert row(grown, "contrastive", 3) and row(grown, "multi_similarity", 3), grown
    # step 8's study file is the campaign's study: it resumes it (a different one is refused)
    env = _shims(tmp_path / ".bin2")
    status = subprocess.run(
        ["mlrc", "study", "run", "first-contrastive.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr
    assert "1 complete" in status.stdout and "reproductions tested: 3" in status.stdout
