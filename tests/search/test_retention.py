"""Checkpoint retention (``artifacts.keep``), ``mlrc gc``, ``mlrc study export-model`` and studies
whose budgets grow: through the ``mlrc`` command, on the embedded default dataset.

The references are independent of the code under test: the numbers of a study run with every
checkpoint kept (mlrc's behaviour before retention), a study run straight to its final budget,
Optuna's own best trial, file sizes from ``os.stat``, and the test MAP@R recomputed from the
exported model's embeddings by the paper's formula (a float64 loop) and, to float32 ties, by
PyTorch Metric Learning's ``AccuracyCalculator``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import torchvision.transforms as T
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import data, store
from mlrc.cli import app
from mlrc.protocol import mlrc_split
from mlrc.store.engine import session
from mlrc.store.schema import FoldRun, StudyHistory, TestResult, Trial

runner = CliRunner()
TINY = {
    "iterations_per_epoch": 3,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
}


def study_file(tmp: Path, name: str = "r", trials: int = 2, reps: int = 2, **extra) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": reps},
        "overrides": TINY,
        **extra,
    }
    path = tmp / f"{name}-{trials}-{reps}-{len(extra)}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def run_and_test(path: Path, url: str, art: Path, *more: object) -> None:
    cli("study", "run", path, "--storage", url, "--artifacts", art, "--quiet", *more)
    cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet", *more)


def rows(url: str, model, **where) -> list:
    with session(store.connect(url)) as s:
        return list(s.execute(select(model).filter_by(**where)).scalars())


def numbers(url: str) -> tuple:
    """Everything a study computed, without ids, times or checkpoint paths."""
    trials = sorted((t.number, t.state, t.params_hash, t.value, t.sem) for t in rows(url, Trial))
    folds = sorted(
        (
            f.kind,
            f.params_hash,
            f.reproduction,
            f.fold,
            f.status,
            f.seed,
            f.best_epoch,
            f.map_at_r,
            f.precision_at_1,
            f.r_precision,
            f.objective,
        )  # fmt: skip
        for f in rows(url, FoldRun)
    )
    tests = sorted(
        (r.reproduction, r.mode, r.fold, r.map_at_r, r.precision_at_1, r.r_precision)
        for r in rows(url, TestResult)
    )
    return trials, folds, tests


def copy_store(url: str, to: Path) -> str:
    """A copy of a SQLite store (with its WAL) at ``to``; its URL."""
    src = url.removeprefix("sqlite:///")
    for suffix in ("", "-wal", "-shm"):
        if Path(src + suffix).exists():
            shutil.copy(src + suffix, f"{to}{suffix}")
    return f"sqlite:///{to}"


def files(root: Path) -> list[Path]:
    """The checkpoint files under ``root`` (not the stored test embeddings, which every policy
    keeps: tests/search/test_rescore.py)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.parent.name != "embeddings")


@pytest.fixture(scope="module")
def kept_all(tmp_path_factory):
    """The reference: the same study with every checkpoint kept."""
    tmp = tmp_path_factory.mktemp("all")
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    run_and_test(study_file(tmp), url, art, "--keep", "all")
    return url, art


@pytest.fixture(scope="module")
def kept_default(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("default")
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    run_and_test(study_file(tmp), url, art)
    return url, art


@pytest.fixture(scope="module")
def kept_best(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("best")
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    run_and_test(study_file(tmp, artifacts={"keep": "best"}), url, art)
    return url, art


# --- retention ---------------------------------------------------------------------------------


def exported(url: str) -> int:
    """The reproduction export-model exports by default: the best concatenated test MAP@R."""
    agg = rows(url, TestResult, mode="concatenated", fold=-1)
    return min(agg, key=lambda r: (-r.map_at_r, r.reproduction)).reproduction


def test_the_default_keeps_one_reproduction_s_models_and_computes_the_same_numbers(
    kept_default, kept_all
):
    url, art = kept_default
    assert numbers(url) == numbers(kept_all[0])
    rep = exported(url)  # #37: what export-model needs for one reproduction, nothing else
    on_disk = files(art)
    assert sorted(p.parts[-3:] for p in on_disk) == [
        (f"rep{rep}", f"fold{k}", "best.pt") for k in range(4)
    ]
    named = {Path(f.checkpoint) for f in rows(url, FoldRun) if f.checkpoint}
    assert set(on_disk) == named  # rows point at these files only
    ref_files = files(kept_all[1])
    assert len(ref_files) == 2 * (2 * 4 + 2 * 4)  # keep all: best.pt and last.pt of 16 folds


def test_keep_best_keeps_the_best_trial_s_and_the_test_reproductions_best_pt(kept_best, kept_all):
    url, art = kept_best
    assert numbers(url) == numbers(kept_all[0])
    ostudy = optuna.load_study(study_name="r", storage=url)
    best = hashlib.sha256(
        json.dumps(ostudy.best_trial.params, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()[:16]
    want = {
        (f.kind, f.params_hash, f.reproduction, f.fold)
        for f in rows(url, FoldRun)
        if f.kind == "test" or f.params_hash == best
    }
    assert len(want) == 4 + 2 * 4
    on_disk = files(art)
    assert all(p.name == "best.pt" for p in on_disk) and len(on_disk) == len(want)
    named = {Path(f.checkpoint) for f in rows(url, FoldRun) if f.checkpoint}
    assert set(on_disk) == named  # every kept file is named by its row, and only those
    for f in rows(url, FoldRun):
        assert (f.checkpoint is not None) == (
            (f.kind, f.params_hash, f.reproduction, f.fold) in want
        )
    # the kept weights are the reference run's, file for file
    ref = {p.relative_to(kept_all[1]): p for p in files(kept_all[1])}
    for p in on_disk:
        mine = torch.load(p, weights_only=True)
        theirs = torch.load(ref[p.relative_to(art)], weights_only=True)
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_status_shows_the_retention_and_its_history(kept_best):
    url, _ = kept_best
    out = cli("study", "status", "r", "--storage", url).output
    assert "budget: 2 trials, 2 reproductions; checkpoints kept: best" in out
    assert "artifacts.keep" not in out  # a new study's history starts at its own settings
    assert rows(url, StudyHistory) == []


# --- gc ----------------------------------------------------------------------------------------


def test_gc_dry_run_lists_what_a_policy_frees_and_deletes_nothing(kept_best):
    url, art = kept_best
    before = files(art)
    out = cli("gc", "--storage", url, "--artifacts", art, "--dry-run").output
    assert "would free 0 B in 0 files" in out  # the study's own policy needs them all
    out = cli("gc", "--storage", url, "--artifacts", art, "--keep", "resume", "--dry-run").output
    rep = f"rep{exported(url)}"  # resume keeps the exported reproduction's models (#37)
    doomed = [p for p in before if p.parts[-3] != rep]
    size = sum(os.stat(p).st_size for p in doomed)
    assert f"would free {size / 1e6:.1f} MB in {len(doomed)} files" in out
    assert files(art) == before


def test_gc_frees_what_the_policy_drops_and_the_report_is_unchanged(tmp_path, kept_best):
    url0, art0 = kept_best
    url, art = copy_store(url0, tmp_path / "db.sqlite"), tmp_path / "art"
    shutil.copytree(art0, art)
    report = cli("report", "--storage", url, "--format", "csv").output
    rep = f"rep{exported(url)}"  # resume keeps the exported reproduction's models (#37)
    kept = [p for p in files(art) if p.parts[-3] == rep]
    freed = sum(os.stat(p).st_size for p in files(art) if p not in kept)
    out = cli("gc", "--storage", url, "--artifacts", art, "--keep", "resume").output
    assert f"freed {freed / 1e6:.1f} MB in 8 files" in out and len(kept) == 4
    assert files(art) == kept
    named = {Path(f.checkpoint).relative_to(art0) for f in rows(url, FoldRun) if f.checkpoint}
    assert named == {p.relative_to(art) for p in kept}  # the copied rows name the original
    assert cli("report", "--storage", url, "--format", "csv").output == report


def test_gc_removes_an_archived_study_and_leaves_other_folders_alone(tmp_path):
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    cli("study", "run", study_file(tmp_path, "a", trials=1), "--storage", url,
        "--artifacts", art, "--quiet", "--keep", "all")  # fmt: skip
    changed = study_file(tmp_path, "a", trials=1, overrides={**TINY, "max_epochs": 1})
    cli("study", "run", changed, "--storage", url, "--artifacts", art, "--quiet", "--force-new",
        "--keep", "all")  # fmt: skip
    archived = files(art / "a.old-1")
    assert len(archived) == 8  # 4 folds × best.pt + last.pt
    current = files(art / "a")
    stranger = art / "a" / "p-000000000000" / "search" / "x" / "fold0" / "last.pt"
    stranger.parent.mkdir(parents=True)
    stranger.write_bytes(b"another store's")
    out = cli("gc", "--storage", url, "--artifacts", art).output
    assert "a.old-1" in out and "archived" in out
    assert not (art / "a.old-1").exists()
    assert files(art / "a") == sorted([*current, stranger])  # keep all; a stranger is no one's
    assert {f.checkpoint for f in rows(url, FoldRun) if f.study_id == 1} == {None}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--keep", "bst"], "error: --keep: expected one of resume, best, all (got 'bst')"),
        (["--study", "nope"], "error: no study 'nope' in sqlite:///"),
    ],
)
def test_gc_errors_are_one_line(tmp_path, kept_best, args, line):
    url, art = kept_best
    r = cli("gc", "--storage", url, "--artifacts", art, *args, code=2)
    assert r.output.strip().startswith(line) and len(r.output.strip().splitlines()) == 1


def test_keep_is_checked_like_any_option(tmp_path):
    path = study_file(tmp_path)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    r = cli("study", "run", path, "--storage", url, "--artifacts", tmp_path, "--keep", "most",
            code=2)  # fmt: skip
    assert r.output.strip() == "error: --keep: expected one of resume, best, all (got 'most')"
    bad = study_file(tmp_path, artifacts={"keep": "some"})
    r = cli("study", "run", bad, "--storage", url, "--artifacts", tmp_path, code=2)
    assert "artifacts.keep" in r.output and len(r.output.strip().splitlines()) == 1


# --- export-model ------------------------------------------------------------------------------


def _test_images(meta: dict) -> tuple[torch.Tensor, np.ndarray]:
    """The glyphs test classes, preprocessed as the export file documents it (not by mlrc)."""
    ds = data.build("glyphs")
    split = mlrc_split(ds.labels, scheme="mlrc")
    spec = meta["input"]
    tf = T.Compose([T.Resize(spec["resize"]), T.CenterCrop(spec["crop"]), T.PILToTensor()])
    keep = np.isin(ds.labels, split.test_classes)
    xs = [tf(ds.load_image(i)) for i in np.flatnonzero(keep)]
    x = torch.stack(xs).float() / 255 * spec["input_range"]
    mean = torch.tensor(spec["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(spec["std"]).view(1, -1, 1, 1)
    return (x - mean) / std, ds.labels[keep]


def naive_map_at_r(emb: torch.Tensor, labels: np.ndarray) -> float:
    """MAP@R by the paper's formula, one query at a time, in float64: the R = (same-class
    items − 1) nearest by squared distance of the L2-normalised rows (ties: lower index)."""
    e = emb.double().numpy()
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    total = 0.0
    for i in range(len(e)):
        d = ((e - e[i]) ** 2).sum(axis=1)
        d[i] = np.inf
        order = np.argsort(d, kind="stable")
        r = int((labels == labels[i]).sum()) - 1
        rel = labels[order[:r]] == labels[i]
        total += float((np.cumsum(rel) / np.arange(1, r + 1) * rel).sum() / r)
    return total / len(e)


def _pml_map_at_r(emb: torch.Tensor, labels: np.ndarray) -> float:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(include=("mean_average_precision_at_r",), k="max_bin_count")
    y = torch.as_tensor(labels)
    return calc.get_accuracy(emb, y, emb, y, True)["mean_average_precision_at_r"]


@pytest.mark.parametrize("dim", ["512", "128"])
def test_the_exported_model_reproduces_the_stored_test_map_at_r(kept_best, tmp_path, dim):
    from mlrc.train import load_exported

    url, art = kept_best
    out = tmp_path / "model.pt"
    said = cli("study", "export-model", "r", "--storage", url, "--artifacts", art, "--out", out,
               "--dim", dim).output  # fmt: skip
    module, meta = load_exported(out)
    mode = "concatenated" if dim == "512" else "separated"
    results = rows(url, TestResult, mode=mode)
    if dim == "512":
        best = max((r for r in results if r.fold == -1), key=lambda r: r.map_at_r)
    else:
        per_rep = {r.reproduction: r for r in rows(url, TestResult, mode=mode, fold=-1)}
        rep = max(per_rep, key=lambda k: per_rep[k].map_at_r)
        untrained = {f.fold for f in rows(url, FoldRun, kind="test", reproduction=rep)
                     if f.best_epoch == 0}  # fmt: skip
        best = max((r for r in results
                    if r.reproduction == rep and r.fold >= 0 and r.fold not in untrained),
                   key=lambda r: r.map_at_r)  # fmt: skip
    assert meta["reproduction"] == best.reproduction and meta["dim"] == int(dim)
    assert f"reproduction {best.reproduction}" in said
    x, labels = _test_images(meta)
    with torch.no_grad():
        emb = module(x)
    assert emb.shape[1] == int(dim)
    assert torch.allclose(emb.norm(dim=1), torch.ones(len(emb)), atol=1e-5)  # L2-normalised
    assert naive_map_at_r(emb, labels) == pytest.approx(best.map_at_r, abs=1e-9)
    # PML ranks in float32: the near-ties of this barely trained model may flip a few places
    assert _pml_map_at_r(emb, labels) == pytest.approx(best.map_at_r, abs=2e-3)


def test_export_model_never_picks_a_fold_that_kept_epoch_0(kept_best, tmp_path):
    """Finding 2 of #37: the best fold by test MAP@R kept epoch 0 (the store says so: its
    validation never improved on the untrained model) — the one-fold export takes the best
    trained fold instead, and the concatenation says that it holds an untrained fold."""

    from mlrc.train import load_exported

    url, art = kept_best
    copy = tmp_path / "db.sqlite"  # a copy to change (the backup API: the WAL included)
    with sqlite3.connect(url.removeprefix("sqlite:///")) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    url = f"sqlite:///{copy}"
    per_rep = {r.reproduction: r for r in rows(url, TestResult, mode="separated", fold=-1)}
    rep = max(per_rep, key=lambda k: per_rep[k].map_at_r)
    folds = sorted((r for r in rows(url, TestResult, mode="separated", reproduction=rep)
                    if r.fold >= 0), key=lambda r: -r.map_at_r)  # fmt: skip
    with session(store.connect(url)) as s:  # the best fold becomes one that kept epoch 0
        for f in s.execute(select(FoldRun).filter_by(kind="test", reproduction=rep)).scalars():
            f.best_epoch = 0 if f.fold == folds[0].fold else 3
    base = ["study", "export-model", "r", "--storage", url, "--artifacts", art]
    said = cli(*base, "--out", tmp_path / "f.pt", "--dim", "fold").output
    _, meta = load_exported(tmp_path / "f.pt")
    assert meta["fold"] == folds[1].fold != folds[0].fold
    assert f"fold {folds[1].fold}, 128-D, test MAP@R {folds[1].map_at_r:.4f}" in said
    said = cli(*base, "--out", tmp_path / "c.pt", "--reproduction", rep).output
    assert f"warning: folds {folds[0].fold} of this concatenation kept epoch 0" in said
    with session(store.connect(url)) as s:  # every fold untrained: nothing to export
        for f in s.execute(select(FoldRun).filter_by(kind="test")).scalars():
            f.best_epoch = 0
    line = cli(*base, "--out", tmp_path / "n.pt", "--dim", "128", code=2).output.strip()
    assert line.startswith("error: study 'r': every fold model of any reproduction kept epoch 0")
    assert not (tmp_path / "n.pt").exists()


def test_the_torch_export_program_gives_the_same_embeddings_without_mlrc(kept_best, tmp_path):
    from mlrc.train import load_exported

    url, art = kept_best
    base = ["study", "export-model", "r", "--storage", url, "--artifacts", art]
    cli(*base, "--out", tmp_path / "m.pt")
    cli(*base, "--out", tmp_path / "m.pt2", "--format", "export")
    module, meta = load_exported(tmp_path / "m.pt")
    program = torch.export.load(tmp_path / "m.pt2").module()
    x, _ = _test_images(meta)
    with torch.no_grad():
        assert torch.allclose(program(x[:5]), module(x[:5]), atol=1e-6)
        assert torch.allclose(program(x[:3]), module(x[:3]), atol=1e-6)  # any batch size


def test_export_model_without_kept_checkpoints_says_why_in_one_line(kept_default, tmp_path):
    url, art = kept_default
    other = 3 - exported(url)  # the reproduction the default retention did not keep
    r = cli("study", "export-model", "r", "--storage", url, "--artifacts", art,
            "--out", tmp_path / "m.pt", "--reproduction", other, code=2)  # fmt: skip
    line = r.output.strip()
    assert line.startswith(f"error: study 'r': the models of reproduction {other} ")
    assert "artifacts.keep: resume" in line and len(line.splitlines()) == 1
    assert f"--reproduction {3 - other}" in line
    assert not (tmp_path / "m.pt").exists()
    cli("study", "export-model", "r", "--storage", url, "--out", tmp_path / "m.pt")  # the kept


def test_export_model_option_errors(kept_best, tmp_path):
    url, art = kept_best
    base = ["study", "export-model", "r", "--storage", url, "--artifacts", art, "--out",
            tmp_path / "m.pt"]  # fmt: skip
    assert cli(*base, "--dim", "64", code=2).output.strip() == (
        "error: --dim 64: study 'r' has 4 fold models of 128-D: --dim 512 (concatenated) or "
        "128 (one fold), or --dim concatenated|fold"
    )
    assert "no reproduction 9 (tested: [1, 2])" in cli(*base, "--reproduction", "9", code=2).output


# --- budgets that grow -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A study of 2 trials and 2 reproductions grown to 3 and 3, beside one run straight to 3
    and 3 (the reference)."""
    tmp = tmp_path_factory.mktemp("grow")
    straight = f"sqlite:///{tmp / 'straight.sqlite'}"
    run_and_test(study_file(tmp, "g", trials=3, reps=3), straight, tmp / "art-s")
    url, art = f"sqlite:///{tmp / 'grown.sqlite'}", tmp / "art-g"
    small = study_file(tmp, "g")
    run_and_test(small, url, art)
    before = numbers(url)
    tests_before = {(r.id, r.map_at_r) for r in rows(url, TestResult)}
    grow = cli("study", "run", small, "--storage", url, "--artifacts", art, "--quiet",
               "--trials", "3").output  # fmt: skip
    cli("study", "test", small, "--storage", url, "--artifacts", art, "--quiet",
        "--reproductions", "3")  # fmt: skip
    return straight, url, art, small, before, tests_before, grow


def test_a_grown_study_equals_one_run_straight_to_its_budget(grown):
    straight, url, *_ = grown
    assert numbers(url) == numbers(straight)
    ostudy = optuna.load_study(study_name="g", storage=url)
    assert sum(t.state.name == "COMPLETE" for t in ostudy.trials) == 3


def test_growing_runs_only_the_new_work(grown):
    _, url, _, _, before, tests_before, _ = grown
    trials, folds, tests = numbers(url)
    assert trials[:2] == before[0] and len(trials) == 3
    assert set(before[1]) <= set(folds) and len(folds) == 3 * 4 + 3 * 4
    assert tests_before <= {(r.id, r.map_at_r) for r in rows(url, TestResult)}  # rows untouched
    assert {r.reproduction for r in rows(url, TestResult)} == {1, 2, 3}


def test_every_change_of_budget_is_in_the_history_status_and_report(grown):
    _, url, _, _, _, _, grow = grown
    history = [(h.field, h.old, h.new) for h in rows(url, StudyHistory)]
    assert history == [("search.trials", "2", "3"), ("test.reproductions", "2", "3")]
    assert all(h.code_version for h in rows(url, StudyHistory))
    status = cli("study", "status", "g", "--storage", url).output
    assert "budget: 3 trials, 3 reproductions" in status
    assert "search.trials 2 → 3" in status and "test.reproductions 2 → 3" in status
    report = cli("report", "--storage", url).output
    assert "contrastive (glyphs): budget changed during the study — search.trials 2 → 3 (" in report


def test_a_plain_rerun_keeps_the_grown_budgets(grown, tmp_path):
    _, url0, art0, small, *_ = grown
    url = copy_store(url0, tmp_path / "db.sqlite")
    before, history = numbers(url), rows(url, StudyHistory)
    cli("study", "run", small, "--storage", url, "--artifacts", art0, "--quiet")  # file: 2 trials
    cli("study", "test", small, "--storage", url, "--artifacts", art0, "--quiet")  # 2 reps
    assert numbers(url) == before
    assert [h.id for h in rows(url, StudyHistory)] == [h.id for h in history]  # nothing new
    status = cli("study", "status", "g", "--storage", url).output
    assert "budget: 3 trials, 3 reproductions" in status


def test_lowering_a_budget_deletes_nothing_and_is_recorded(grown, tmp_path):
    _, url0, art0, small, *_ = grown
    url = copy_store(url0, tmp_path / "db.sqlite")
    before = numbers(url)
    cli("study", "run", small, "--storage", url, "--artifacts", art0, "--quiet", "--trials", 2)
    cli("study", "test", small, "--storage", url, "--artifacts", art0, "--quiet",
        "--reproductions", 2)  # fmt: skip
    assert numbers(url) == before
    history = [(h.field, h.old, h.new) for h in rows(url, StudyHistory)]
    assert history[-2:] == [("search.trials", "3", "2"), ("test.reproductions", "3", "2")]


def test_what_defines_the_numbers_still_cannot_change(grown, tmp_path):
    _, url, art, *_ = grown
    doc = yaml.safe_load(study_file(tmp_path, "g").read_text())
    doc["loss"] = {"name": "triplet"}
    path = tmp_path / "g-triplet.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = cli("study", "run", path, "--storage", url, "--artifacts", art, "--trials", "4", code=2)
    assert "error: study 'g' already exists in the store with a different configuration (" in (
        r.output
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--trials", "0"], "error: --trials: must be ≥ 1 (got 0)"),
        (["--reproductions", "1"], "error: --reproductions: must be ≥ 2"),
    ],
)
def test_budget_options_are_checked(tmp_path, args, line):
    cmd = "run" if args[0] == "--trials" else "test"
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    r = cli("study", cmd, study_file(tmp_path), "--storage", url, "--artifacts", tmp_path, *args,
            code=2)  # fmt: skip
    assert r.output.strip().startswith(line) and len(r.output.strip().splitlines()) == 1


def test_gc_never_creates_a_store_and_a_failed_export_leaves_no_folder(tmp_path, kept_best):
    """``--out`` creates its folder, as every ``--out`` does, but a failed export removes it."""
    url, art = kept_best
    missing = tmp_path / "typo.db"
    r = cli("gc", "--storage", f"sqlite:///{missing}", "--artifacts", art, code=2)
    assert r.output.strip().startswith(f"error: sqlite:///{missing}: no such database file")
    assert not missing.exists()
    out = tmp_path / "no" / "such" / "m.pt"
    r = cli("study", "export-model", "r", "--storage", url, "--artifacts", art, "--out", out,
            "--reproduction", "9", code=2)  # fmt: skip
    assert r.output.strip() == "error: study 'r' has no reproduction 9 (tested: [1, 2])"
    assert not (tmp_path / "no").exists()


def test_keep_best_spares_the_folds_of_a_trial_another_worker_still_runs(tmp_path, kept_best):
    """In a pool, a collect after one worker's trial must not drop the finished folds of a trial
    another worker is still running: it may become the best."""
    url0, art0 = kept_best
    url, art = copy_store(url0, tmp_path / "db.sqlite"), tmp_path / "art"
    shutil.copytree(art0, art)
    best = max(
        (t for t in rows(url, Trial) if t.state == "complete"), key=lambda t: (t.value, -t.number)
    )
    [other] = [t for t in rows(url, Trial) if t.number != best.number]
    [root] = (art / "r").glob("p-*")
    fold0 = root / "search" / other.params_hash / "fold0"
    fold0.mkdir(parents=True)
    (fold0 / "best.pt").write_bytes(b"its fold 0 finished while fold 1 trains")
    db = tmp_path / "db.sqlite"
    with sqlite3.connect(db) as c:
        c.execute("update mlrc_trial set state = 'running' where number = ?", (other.number,))
    cli("gc", "--storage", url, "--artifacts", art)
    assert (fold0 / "best.pt").is_file()  # spared while its trial runs
    with sqlite3.connect(db) as c:
        c.execute("update mlrc_trial set state = 'complete' where number = ?", (other.number,))
    cli("gc", "--storage", url, "--artifacts", art)
    assert not fold0.exists()  # finished and worse: dropped
