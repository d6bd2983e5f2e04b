"""Artifacts the store knows (#37, findings 7 and 8): the store records where each study's
artifacts are, so ``report --metrics``, ``study rescore`` and ``study export-model`` find them
without ``--artifacts``; a moved folder is one line that says how to point at it; the default
retention keeps the fold models that ``export-model`` exports; and a missing model or a damaged
``.npz`` gets a message that names the real cause and what works.

Two test-only studies (loss parameters fixed: no search) on the embedded glyphs, 2 folds, 2
reproductions, run from another working folder than the artifacts' (so the default
``mlrc-artifacts`` is not where they are). References: the test rows read with sqlite3, the
files on disk, the exported model's own embeddings scored by a naive MAP@R loop."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mlrc.cli import app

runner = CliRunner()
TINY = {"iterations_per_epoch": 3, "max_epochs": 2, "validate_every": {"default": 1},
        "patience": {"default": 5}, "folds": 2}  # fmt: skip


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def _tested(tmp: Path, name: str, **extra) -> tuple[str, Path, Path]:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive", "params": {}, "search": {}},
        "search": {"trials": 1, "seed": 0},
        "test": {"reproductions": 2},
        "overrides": TINY,
        **extra,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet")
    return url, art, path


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    return _tested(tmp_path_factory.mktemp("default"), "e")


@pytest.fixture(scope="module")
def kept_best(tmp_path_factory):
    return _tested(tmp_path_factory.mktemp("best"), "b", artifacts={"keep": "best"})


@pytest.fixture(autouse=True)
def elsewhere(tmp_path, monkeypatch):
    """Every command runs from a folder without mlrc-artifacts/."""
    monkeypatch.chdir(tmp_path)


def copied(url: str, art: Path, to: Path, art_to: Path | None = None) -> tuple[str, Path]:
    src = url.removeprefix("sqlite:///")
    for suffix in ("", "-wal", "-shm"):
        if Path(src + suffix).exists():
            shutil.copy(src + suffix, f"{to}{suffix}")
    url = f"sqlite:///{to}"
    if art_to is None:
        return url, art
    shutil.copytree(art, art_to)  # the copy's store records the copied folder
    [(settings,)] = sql(url, "SELECT settings FROM mlrc_study")
    doc = {**json.loads(settings), "artifacts.dir": str(art_to.resolve())}
    sql(url, f"UPDATE mlrc_study SET settings = '{json.dumps(doc)}'")
    return url, art_to


def sql(url: str, query: str) -> list[tuple]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        return c.execute(query).fetchall()


def best_reproduction(url: str) -> int:
    rows = sql(url, "SELECT reproduction, map_at_r FROM mlrc_test_result "
                    "WHERE mode = 'concatenated' AND fold = -1")  # fmt: skip
    return min(rows, key=lambda r: (-r[1], r[0]))[0]


def test_the_store_records_where_the_artifacts_are(default):
    url, art, _ = default
    [(settings,)] = sql(url, "SELECT settings FROM mlrc_study")
    assert json.loads(settings)["artifacts.dir"] == str(art.resolve())


def test_the_default_retention_keeps_the_models_export_model_exports(default, tmp_path):
    url, art, _ = default
    best = best_reproduction(url)
    on_disk = sorted(p.relative_to(art).parts[-3:] for p in art.rglob("*.pt"))
    assert on_disk == [(f"rep{best}", f"fold{k}", "best.pt") for k in (0, 1)]
    out = tmp_path / "m.pt"
    said = cli("study", "export-model", "e", "--storage", url, "--out", out).output
    # the concatenation of the study's 2 fold models of 128-D (#37, finding 5: not "512-D")
    assert f"reproduction {best}, 256-D" in said.replace("\n", " ") and out.is_file()


def test_campaign_plan_counts_the_kept_models(default, tmp_path):
    from mlrc.config import load_study
    from mlrc.search.plan_disk import checkpoint_bytes, disk_bytes, embedding_bytes

    _, _, path = default
    resolved = load_study(path)
    best = checkpoint_bytes(resolved.preset)
    assert best is not None and best > 0
    assert disk_bytes(resolved, best) == 2 * best + embedding_bytes(resolved)  # 2 fold models


def test_report_metrics_finds_the_embeddings_without_artifacts(default, tmp_path):
    url, art, _ = default
    url, _ = copied(url, art, tmp_path / "db.sqlite")
    r = cli("report", "--storage", url, "--metrics", "mrr")
    assert "computed from stored embeddings: mrr of e" in r.output
    assert "missing" not in r.output and "MRR*" in r.output
    assert len(sql(url, "SELECT * FROM mlrc_rescored WHERE metric = 'mrr' AND fold = -1")) == 4


def test_a_moved_folder_is_one_line_that_says_how_to_point_at_it(default, tmp_path):
    url, art, _ = default
    url, old = copied(url, art, tmp_path / "db.sqlite", tmp_path / "old")
    moved = old.rename(tmp_path / "moved")  # the folder the store records is gone
    shown = str(old.resolve())
    r = cli("study", "rescore", "e", "--metrics", "mrr", "--storage", url, code=2)
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "are missing (moved or deleted)" in line
    assert line.endswith(
        f"(the store records its artifacts under {shown}; if the folder moved, point at it "
        "with --artifacts NEW_FOLDER)"
    )
    r = cli("study", "rescore", "e", "--metrics", "mrr", "--storage", url, "--artifacts", moved)
    assert "reproduction 1, concatenated: mrr" in r.output


def test_export_model_names_the_retention_that_removed_a_reproduction(default, tmp_path):
    url, _, _ = default
    other = 3 - best_reproduction(url)
    r = cli("study", "export-model", "e", "--storage", url, "--out", tmp_path / "m.pt",
            "--reproduction", other, code=2)  # fmt: skip
    line = r.output.strip()
    assert len(line.splitlines()) == 1
    assert line.endswith(
        f"the study's retention (artifacts.keep: resume) keeps the fold models of one "
        f"reproduction only; reproduction {3 - other}'s are kept: --reproduction {3 - other}; "
        "--keep best keeps every reproduction's"
    )


def test_export_model_after_gc_names_gc(kept_best, tmp_path):
    url, art, _ = kept_best
    url, art = copied(url, art, tmp_path / "db.sqlite", tmp_path / "art")
    other = 3 - best_reproduction(url)
    cli("gc", "--storage", url, "--artifacts", art, "--keep", "resume")
    out = cli("study", "status", "b", "--storage", url).output
    assert "checkpoints kept: best" in out
    r = cli("study", "export-model", "b", "--storage", url, "--artifacts", art,
            "--out", tmp_path / "m.pt", "--reproduction", other, code=2)  # fmt: skip
    line = r.output.strip()
    assert "artifacts.keep: resume" not in line and len(line.splitlines()) == 1
    assert (
        "collected by `mlrc gc` (--keep resume) after the test stage, though the study "
        f"keeps best; reproduction {3 - other}'s are kept: --reproduction {3 - other}" in line
    )
    cli("study", "export-model", "b", "--storage", url, "--out", tmp_path / "m.pt")  # the kept one


def test_a_moved_checkpoint_folder_is_named_as_moved(kept_best, tmp_path):
    url, art, _ = kept_best
    url, _ = copied(url, art, tmp_path / "db.sqlite")
    moved = tmp_path / "moved"
    shutil.copytree(art, moved)
    [(settings,)] = sql(url, "SELECT settings FROM mlrc_study")
    doc = json.loads(settings)
    doc["artifacts.dir"] = str(tmp_path / "gone")  # as if the folder had moved since
    sql(url, f"UPDATE mlrc_study SET settings = '{json.dumps(doc)}'")
    r = cli("study", "export-model", "b", "--storage", url, "--out", tmp_path / "m.pt", code=2)
    line = r.output.strip()
    assert "moved or deleted outside mlrc (the store records its artifacts under " in line
    assert line.endswith("if the folder moved, point at it with --artifacts NEW_FOLDER)")
    cli("study", "export-model", "b", "--storage", url, "--artifacts", moved,
        "--out", tmp_path / "m.pt")  # fmt: skip


def test_a_damaged_npz_says_what_is_wrong_and_what_works(default, tmp_path):
    url, art, _ = default
    url, art = copied(url, art, tmp_path / "db.sqlite", tmp_path / "art")
    [(path,)] = sql(url, "SELECT path FROM mlrc_embedding_file WHERE reproduction = 2")
    npz = art / "e" / path
    raw = bytearray(npz.read_bytes())
    raw[-100] ^= 1
    npz.write_bytes(bytes(raw))
    works = (
        "changed or damaged; refused; restore it from a copy, or test a new reproduction "
        "(`mlrc study test e --reproductions 3`), which stores its own file"
    )
    r = cli("study", "rescore", "e", "--metrics", "mrr", "--storage", url, code=2)
    assert works in r.output and len(r.output.strip().splitlines()) == 1
    out = cli("report", "--storage", url, "--metrics", "mrr").output.replace("\n", " ")
    assert "run `mlrc study rescore" not in out  # it would refuse the same file
    assert f"mrr not computed: study 'e', reproduction 2: {npz}" in out and works in out


def test_a_checkpoint_being_written_by_a_live_process_survives_the_clean_up(tmp_path):
    """A worker declared lost finishes a fold while its retry (another worker) trains the same
    fold: the first one's clean-up of the fold's folder keeps the retry's write in flight (and
    so the folder), and removes what a dead writer left."""
    import os
    import socket
    import subprocess
    import sys

    from mlrc.search.artifacts import files_beyond, remove_files

    folder = tmp_path / "search" / "abc" / "fold3"
    folder.mkdir(parents=True)
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    live = folder / f".last.pt.tmp-{host}-{os.getpid()}"
    for name in ("best.pt", "last.pt", f".last.pt.tmp-{host}-{dead}", live.name):
        (folder / name).write_bytes(b"x")
    freed = files_beyond(folder, keep={"best.pt"})
    assert sorted(f.path.name for f in freed) == sorted(["last.pt", f".last.pt.tmp-{host}-{dead}"])
    remove_files(freed, folder, levels=3)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["best.pt", live.name])
