"""End-to-end studies through the `mlrc` command: search, test stage, report, resume, failures."""

from __future__ import annotations

import fcntl
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from scipy import stats
from sqlalchemy import create_engine, func, select, text
from typer.testing import CliRunner

from mlrc import data, store
from mlrc.cli import app
from mlrc.config import load_preset
from mlrc.config.identity import canonical_json
from mlrc.methods import losses
from mlrc.protocol import mlrc_split
from mlrc.store.engine import session
from mlrc.store.schema import SCHEMA_VERSION, EpochMetric, FoldRun, Meta, Study, TestResult, Trial
from mlrc.train import View, embed, load_model

runner = CliRunner()
TINY = {
    "iterations_per_epoch": 4,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "image": {"resize": 20, "crop": 16},  # 16-px crops: a quarter of the 32-px compute
    "eval_batch_size": 256,
}


def study_file(
    tmp_path: Path, name="s", dataset=None, loss=None, trials=2, reps=2, over=None, enqueue=None
) -> Path:
    doc = {
        "name": name,
        "dataset": dataset or {"name": "glyphs"},
        "preset": "cpu",
        "loss": loss or {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0, "enqueue": enqueue or []},
        "test": {"reproductions": reps},
        "overrides": {**TINY, **(over or {})},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(*args: str, ok: bool = True):
    r = runner.invoke(app, list(args))
    if ok:
        assert r.exit_code == 0, r.output
    return r


def rows(url: str, model) -> list:
    with session(store.connect(url)) as s:
        return s.execute(select(model)).scalars().all()


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A whole small study on the embedded default: run, test."""
    tmp = tmp_path_factory.mktemp("study")
    path = study_file(tmp)
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    opts = ["--storage", url, "--artifacts", str(art), "--quiet", "--keep", "best"]  # models read
    cli("study", "run", str(path), *opts)
    cli("study", "test", str(path), *opts)
    return path, url, art


def test_search_stores_trials_folds_and_epochs(finished_study):
    _, url, _ = finished_study
    trials = rows(url, Trial)
    assert [t.state for t in trials] == ["complete", "complete"]
    folds = [f for f in rows(url, FoldRun) if f.kind == "search"]
    assert len(folds) == 8 and all(f.status == "complete" for f in folds)
    for t in trials:  # objective = mean of the 4 folds' best trained val MAP@R, SEM stored
        mine = [f.objective for f in folds if f.params_hash == t.params_hash]
        epochs = {  # the objective ignores the untrained epoch 0, as the reference's aggregator
            f.params_hash + str(f.fold): max(
                e.map_at_r for e in rows(url, EpochMetric) if e.fold_run_id == f.id and e.epoch >= 1
            )
            for f in folds
            if f.params_hash == t.params_hash
        }
        assert sorted(mine) == sorted(epochs.values())
        assert t.value == pytest.approx(np.mean(mine)) and t.sem == pytest.approx(stats.sem(mine))
    epochs = rows(url, EpochMetric)
    assert len(epochs) == 16 * 3  # 8 search + 8 test folds, epochs 0, 1, 2
    # Optuna's tables live in the same database
    with create_engine(url).connect() as c:
        assert c.execute(text("select count(*) from trials")).scalar() == 2


def reference_mean_folds(url: str, rep: int) -> list[int]:
    """The folds the reference's MeanAggregator averages (powerful-benchmarker's
    aggregators/base_aggregator.py: a fold's TRAINED value exists only for a best epoch outside
    IGNORE_ALL_UNTRAINED = (-1, 0)); all of them when none has one (docs: fidelity.md)."""
    runs = [f for f in rows(url, FoldRun) if f.kind == "test" and f.reproduction == rep]
    trained = sorted(f.fold for f in runs if f.best_epoch not in (-1, 0))
    return trained or sorted(f.fold for f in runs)


def test_test_stage_separated_and_concatenated(finished_study):
    path, url, _ = finished_study
    results = rows(url, TestResult)
    assert sorted({r.reproduction for r in results}) == [1, 2]  # explicit ids, not the trial
    for rep in (1, 2):
        sep = {r.fold: r for r in results if r.reproduction == rep and r.mode == "separated"}
        assert sorted(sep) == [-1, 0, 1, 2, 3]
        kept = reference_mean_folds(url, rep)
        assert sep[-1].map_at_r == pytest.approx(np.mean([sep[f].map_at_r for f in kept]))
    trial_folds = {f.seed for f in rows(url, FoldRun) if f.kind == "search"}
    test_folds = [f for f in rows(url, FoldRun) if f.kind == "test"]
    assert len(test_folds) == 8 and not trial_folds & {f.seed for f in test_folds}


def test_concatenated_result_recomputed_from_the_saved_models(finished_study):
    """Wiring: reproduction 1's stored 512-D result equals a recomputation from its four
    checkpoints (the formula is checked against numpy and the metric against PML and a naive
    loop in test_metrics.py)."""
    from mlrc.data.transforms import eval_transform
    from mlrc.protocol import concatenate_embeddings, retrieval_metrics

    _, url, _ = finished_study
    preset = load_preset("cpu", TINY)
    ds = data.build("glyphs")
    split = mlrc_split(ds.labels, scheme="mlrc")
    folds = sorted(
        (f for f in rows(url, FoldRun) if f.kind == "test" and f.reproduction == 1),
        key=lambda f: f.fold,
    )
    assert [f.fold for f in folds] == [0, 1, 2, 3]
    parts = []
    for f in folds:
        model = load_model(preset, f.checkpoint)
        size = (preset.image.resize, preset.image.crop)
        view = View(ds, split.test_classes, eval_transform(*size, model.trunk.input_spec))
        emb, labels = embed(model, view, preset.eval_batch_size, "cpu")
        parts.append(emb)
    assert sorted(set(labels.tolist())) == list(range(len(split.test_classes)))
    joined = concatenate_embeddings(parts)
    assert joined.shape == (len(labels), 512)
    want = retrieval_metrics(joined, labels)
    stored = {(r.mode, r.fold): r for r in rows(url, TestResult) if r.reproduction == 1}
    for k in ("map_at_r", "precision_at_1", "r_precision"):
        assert getattr(stored[("concatenated", -1)], k) == pytest.approx(want[k], abs=1e-12)
        sep = [retrieval_metrics(p, labels)[k] for p in parts]
        for fold in range(4):
            assert getattr(stored[("separated", fold)], k) == pytest.approx(sep[fold], abs=1e-12)


def test_report_formats_and_ci_against_scipy(finished_study, tmp_path):
    _, url, _ = finished_study
    csv = cli("report", "--storage", url, "--format", "csv").output
    table = pd.read_csv(io.StringIO(csv))
    assert list(table.columns) == [
        "study",
        "dataset",
        "protocol",
        "protocol_fields",
        "loss",
        "strategy",
        "pruner",
        "mode",
        "metric",
        "mean",
        "half_width",
        "n",
        "low",
        "high",
        "best",
        "best_row",
        "p_value",
        "not_worse",
        "complete_trials",
        "nonfinite_trials",
        "test_set_selection",
        "retrieval",
        "failed_trials",
        "failures",
        "archived",
        "untrained_test",
        "warm_start",
        "pruning_risk",
        "fold_models",
        "embedding_size",
    ]
    assert not table["test_set_selection"].any()  # the reality check's protocol
    studied = table[table["loss"] != "random_init"]  # sizes as the cpu preset resolves them
    assert (studied["fold_models"] == 4).all() and (studied["embedding_size"] == 128).all()
    baseline = table[table["loss"] == "random_init"]  # the untrained tiny_cnn, first, n = 1
    assert len(baseline) == 6 and (baseline["n"] == 1).all() and baseline["half_width"].isna().all()
    table = table[table["loss"] != "random_init"]
    assert len(table) == 6 and (table["n"] == 2).all()
    stored = [r for r in rows(url, TestResult) if r.fold == -1]
    for _, row in table.iterrows():
        v = 100 * np.array([getattr(r, row["metric"]) for r in stored if r.mode == row["mode"]])
        low, high = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
        assert row["mean"] == pytest.approx(v.mean(), abs=1e-4)
        assert row["low"] == pytest.approx(low, abs=1e-3) and row["high"] == pytest.approx(
            high, abs=1e-3
        )
    md = cli("report", "--storage", url).output
    assert "| Loss | n | Sep. MAP@R | Sep. P@1 | Sep. R-Prec | Concat. MAP@R" in md
    mean = table[(table["mode"] == "concatenated") & (table["metric"] == "map_at_r")].iloc[0]
    assert f"{mean['mean']:.2f} ± {mean['half_width']:.2f}" in md
    out = tmp_path / "t.tex"
    cli("report", "--storage", url, "--format", "latex", "--out", str(out))
    tex = out.read_text()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and r"$\pm$" in tex
    assert cli("report", "--storage", url, "--format", "xls", ok=False).exit_code == 2


def test_rerun_is_idempotent(finished_study):
    path, url, art = finished_study
    before = {
        (f.kind, f.params_hash, f.reproduction, f.fold): f.updated for f in rows(url, FoldRun)
    }
    n_results = len(rows(url, TestResult))
    cli("study", "run", str(path), "--storage", url, "--artifacts", str(art), "--quiet")
    cli("study", "test", str(path), "--storage", url, "--artifacts", str(art), "--quiet")
    after = {(f.kind, f.params_hash, f.reproduction, f.fold): f.updated for f in rows(url, FoldRun)}
    assert after == before and len(rows(url, TestResult)) == n_results
    assert len(rows(url, Trial)) == 2


def test_status_command(finished_study):
    path, url, _ = finished_study
    out = cli("study", "status", str(path), "--storage", url).output
    assert "2 complete, 0 running, 0 failed" in out and "folds done: 8 search, 8 test" in out
    assert "best so far: trial" in out
    assert "reproductions tested: 2" in cli("study", "status", "s", "--storage", url).output


def test_same_name_with_a_different_config_is_refused(finished_study, tmp_path):
    _, url, art = finished_study
    changed = study_file(tmp_path, over={"max_epochs": 3})
    r = cli("study", "run", str(changed), "--storage", url, "--artifacts", str(art), ok=False)
    assert r.exit_code == 2
    assert "already exists in the store with a different configuration" in r.output
    assert "max_epochs: 2 in the store, 3 now" in r.output


def test_test_before_search_is_a_clear_error(tmp_path):
    path = study_file(tmp_path)
    r = cli("study", "test", str(path), "--storage", f"sqlite:///{tmp_path / 'db'}", ok=False)
    assert r.exit_code == 2 and "has no complete trial yet" in r.output


def test_second_process_on_the_same_sqlite_study_is_refused(tmp_path):
    path = study_file(tmp_path)
    db = tmp_path / "db.sqlite"
    with open(f"{db}.s.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        r = cli("study", "run", str(path), "--storage", f"sqlite:///{db}", ok=False)
    assert r.exit_code == 2 and "already running" in r.output and "pid 4242" in r.output


class _MaybeNaN(torch.nn.Module):
    def __init__(self, explode: float) -> None:
        super().__init__()
        self.explode = explode

    def forward(self, embeddings, labels):
        return embeddings.pow(2).mean() * (float("nan") if self.explode > 0.5 else 1.0)


def _maybe_nan(*, num_classes: int, embedding_size: int, explode: float = 0.0):
    """NaN from the first iteration when explode > 0.5 (for tests)."""
    return _MaybeNaN(explode)


@pytest.fixture
def maybe_nan_loss():
    """Registered only while the test runs: other tests list every registered loss."""
    losses.register("test_maybe_nan", batch="pair")(_maybe_nan)
    yield "test_maybe_nan"
    losses.LOSSES.unregister("test_maybe_nan")


def test_non_finite_trial_is_scored_0_with_its_reason_and_the_study_goes_on(
    tmp_path, maybe_nan_loss
):
    loss = {"name": maybe_nan_loss, "search": {"explode": {"low": 0.0, "high": 1.0}}}
    path = study_file(tmp_path, loss=loss, enqueue=[{"explode": 0.9}, {"explode": 0.1}])
    url = f"sqlite:///{tmp_path / 'db'}"
    cli("study", "run", str(path), "--storage", url, "--artifacts", str(tmp_path / "a"), "--quiet")
    trials = sorted(rows(url, Trial), key=lambda t: t.number)
    assert [t.state for t in trials] == ["complete", "complete"]
    assert (trials[0].value, trials[0].sem) == (0.0, 0.0)
    assert trials[0].reason == "non-finite loss at iteration 1, fold 0"
    out = cli("study", "status", str(path), "--storage", url).output
    assert "non-finite loss at iteration 1, fold 0" in out


def test_real_omniglot_study_end_to_end(tmp_path, omniglot_zip):
    path = study_file(
        tmp_path,
        name="omni",
        dataset={"name": "omniglot", "root": str(omniglot_zip)},
        trials=1,
        loss={"name": "multi_similarity"},
    )
    url, art = f"sqlite:///{tmp_path / 'db'}", str(tmp_path / "art")
    cli("study", "run", str(path), "--storage", url, "--artifacts", art, "--quiet")
    out = cli("study", "test", str(path), "--storage", url, "--artifacts", art, "--quiet").output
    assert "### omniglot" in out and "| multi_similarity | 2 |" in out
    assert len([r for r in rows(url, TestResult) if r.fold == -1]) == 4


def test_postgresql_store_gets_the_same_rows(tmp_path, postgres_url):
    path = study_file(tmp_path, name="pg", trials=1)
    art = str(tmp_path / "art")
    cli("study", "run", str(path), "--storage", postgres_url, "--artifacts", art, "--quiet")
    cli("study", "test", str(path), "--storage", postgres_url, "--artifacts", art, "--quiet")
    assert [t.state for t in rows(postgres_url, Trial)] == ["complete"]
    assert len(rows(postgres_url, FoldRun)) == 4 + 8
    assert len(rows(postgres_url, TestResult)) == 2 * 6
    csv = cli("report", "--storage", postgres_url, "--study", "pg", "--format", "csv").output
    table = pd.read_csv(io.StringIO(csv))  # 6 rows of the study + 6 of its untrained baseline
    assert len(table) == 12 and (table["loss"] == "random_init").sum() == 6


def test_newer_schema_version_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'db'}"
    engine = store.connect(url)
    with session(engine) as s:
        s.get(Meta, "schema_version").value = "99"
    with pytest.raises(
        store.StoreError,
        match=f"written by mlrc schema version 99, this mlrc reads version {SCHEMA_VERSION}",
    ):
        store.connect(url)


def test_not_a_database_is_a_clear_error(tmp_path):
    bogus = tmp_path / "notes.db"
    bogus.write_text("this is not sqlite " * 100)
    r = cli("study", "status", "x", "--storage", f"sqlite:///{bogus}", ok=False)
    assert r.exit_code == 2 and "notes.db" in r.output and "Traceback" not in r.output


# --- SIGKILL during a fold, then resume ----------------------------------------------------------


def test_study_killed_during_a_fold_resumes_without_training_a_fold_twice(tmp_path):
    path = study_file(
        tmp_path, name="k", trials=2, over={"iterations_per_epoch": 10, "max_epochs": 4}
    )
    db = tmp_path / "db.sqlite"
    url, art = f"sqlite:///{db}", str(tmp_path / "art")
    exe = Path(sys.executable).with_name("mlrc")
    proc = subprocess.Popen(
        [str(exe), "study", "run", str(path), "--storage", url, "--artifacts", art, "--quiet"],
        stderr=subprocess.DEVNULL,
    )
    engine = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            engine = engine or create_engine(url)
            with engine.connect() as c:
                done = (
                    c.execute(
                        select(func.count())
                        .select_from(FoldRun)
                        .where(FoldRun.status == "complete")
                    ).scalar()
                    if _has_table(c)
                    else 0
                )
                running_epochs = (
                    c.execute(
                        text(
                            "select count(*) from mlrc_epoch_metric e join mlrc_fold_run f on "
                            "e.fold_run_id = f.id where f.status = 'running' and e.epoch >= 2"
                        )
                    ).scalar()
                    if _has_table(c)
                    else 0
                )
            if done >= 2 and running_epochs:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the study finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {
        (f.params_hash, f.fold): f.updated for f in rows(url, FoldRun) if f.status == "complete"
    }
    interrupted = next(f for f in rows(url, FoldRun) if f.status == "running")
    cli("study", "run", str(path), "--storage", url, "--artifacts", art, "--quiet")
    folds = rows(url, FoldRun)
    assert len(folds) == 8 and all(f.status == "complete" for f in folds)  # no duplicate fold
    for f in folds:  # folds finished before the kill were not trained again
        if (f.params_hash, f.fold) in before:
            assert f.updated == before[(f.params_hash, f.fold)]
    epochs = sorted(e.epoch for e in rows(url, EpochMetric) if e.fold_run_id == interrupted.id)
    assert epochs == list(range(epochs[-1] + 1))  # resumed from its checkpoint, no gap, no repeat
    trials = sorted(rows(url, Trial), key=lambda t: t.number)
    assert [t.state for t in trials].count("complete") == 2
    assert [t.state for t in trials].count("interrupted") == 1
    retried = next(t for t in trials if t.state == "interrupted")
    assert any(t.params == retried.params and t.state == "complete" for t in trials)
    # the same completed trials (parameters and values) as an uninterrupted run
    clean = f"sqlite:///{tmp_path / 'clean.sqlite'}"
    cli(
        "study", "run", str(path), "--storage", clean, "--artifacts", str(tmp_path / "c"), "--quiet"
    )

    def done(u):
        return sorted(
            (canonical_json(t.params), round(t.value, 12))
            for t in rows(u, Trial)
            if t.state == "complete"
        )

    assert done(url) == done(clean)


def _has_table(conn) -> bool:
    return (
        conn.execute(
            text("select count(*) from sqlite_master where name = 'mlrc_epoch_metric'")
        ).scalar()
        == 1
    )


def _image_folder(root: Path, classes: int = 16, per_class: int = 4) -> Path:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c:02d}").mkdir(parents=True)
        for i in range(per_class):
            im = Image.new("RGB", (40, 40), tuple(int(v) for v in rng.integers(0, 255, 3)))
            ImageDraw.Draw(im).ellipse((4 + c, 4 + i, 30, 30), outline=(0, 0, 0), width=2)
            im.save(root / f"class_{c:02d}" / f"{i}.png")
    return root


def test_own_image_folder_with_three_commands(tmp_path):
    root = _image_folder(tmp_path / "images")
    path = study_file(
        tmp_path, name="mine", dataset={"name": "image_folder", "root": str(root)}, trials=1
    )
    url, art = f"sqlite:///{tmp_path / 'db'}", str(tmp_path / "art")
    cli("study", "run", str(path), "--storage", url, "--artifacts", art, "--quiet")
    cli("study", "test", str(path), "--storage", url, "--artifacts", art, "--quiet")
    out = cli("report", "--storage", url).output
    assert "### image_folder" in out and "| contrastive | 2 |" in out


def test_corrupt_image_read_in_a_dataloader_worker_is_one_line_naming_the_file(tmp_path):
    root = _image_folder(tmp_path / "images")
    (root / "class_03" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    path = study_file(
        tmp_path,
        name="bad",
        dataset={"name": "image_folder", "root": str(root)},
        trials=1,
        over={"num_workers": 2},
    )
    r = cli(
        "study",
        "run",
        str(path),
        "--storage",
        f"sqlite:///{tmp_path / 'db'}",
        "--artifacts",
        str(tmp_path / "art"),
        "--quiet",
        ok=False,
    )
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert (
        lines[-1].startswith("error: ")
        and "class_03/2.png: unreadable or corrupt image" in lines[-1]
    )
    assert "Traceback" not in r.output


def test_multi_similarity_with_its_miner_runs(tmp_path):
    path = study_file(tmp_path, name="msm", trials=1, loss={"name": "multi_similarity"})
    doc = yaml.safe_load(path.read_text())
    doc["miner"] = {"name": "multi_similarity"}
    path.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db'}"
    cli("study", "run", str(path), "--storage", url, "--artifacts", str(tmp_path / "a"), "--quiet")
    [trial] = rows(url, Trial)
    assert trial.state == "complete" and "miner.epsilon" in trial.params


def test_analysis_metrics_are_stored_beside_map_at_r(finished_study):
    _, url, _ = finished_study
    results = rows(url, TestResult)
    keys = {
        "recall_at_1",
        "recall_at_2",
        "recall_at_4",
        "recall_at_8",
        "nmi",
        "map_at_1000",
        "spectral_decay",
        "pi_ratio",
        "metrix_utilization",
        "best_epoch",  # the epoch the fold model was taken at (the aggregates: their mean)
    }
    runs = {(f.reproduction, f.fold): f.best_epoch for f in rows(url, FoldRun) if f.kind == "test"}
    for r in results:
        assert set(r.extra) == keys
        if r.fold >= 0:
            assert r.extra["best_epoch"] == runs[(r.reproduction, r.fold)]
        # Recall@1 is P@1 when every class has more than one test image (glyphs: 16)
        assert r.extra["recall_at_1"] == pytest.approx(r.precision_at_1, abs=1e-12)
        assert r.extra["recall_at_1"] <= r.extra["recall_at_2"] <= r.extra["recall_at_8"] <= 1
        assert 0 < r.extra["metrix_utilization"] < 4  # squared distance between unit vectors
    for rep in (1, 2):
        sep = {r.fold: r.extra for r in results if r.reproduction == rep and r.mode == "separated"}
        kept = reference_mean_folds(url, rep)
        for k in keys:
            assert sep[-1][k] == pytest.approx(np.mean([sep[f][k] for f in kept]))
        concat = next(r for r in results if r.reproduction == rep and r.mode == "concatenated")
        every = [sep[f]["best_epoch"] for f in range(4)]  # every fold model is concatenated
        assert concat.extra["best_epoch"] == pytest.approx(np.mean(every))


def test_study_with_a_training_strategy(tmp_path):
    path = study_file(tmp_path, name="rho", trials=1)
    doc = yaml.safe_load(path.read_text())
    doc["strategy"] = {"name": "rho_distance"}
    path.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db'}"
    cli("study", "run", str(path), "--storage", url, "--artifacts", str(tmp_path / "a"), "--quiet")
    [trial] = rows(url, Trial)
    assert trial.state == "complete" and "strategy.p_switch" in trial.params
    assert rows(url, Study)[0].strategy == "rho_distance"


def test_the_sqlite_study_lock_names_its_holder_and_is_released(tmp_path):
    from mlrc.search import StudyError
    from mlrc.search.session import sqlite_lock

    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with sqlite_lock(engine, "s"):
        assert Path(f"{tmp_path / 'db.sqlite'}.s.lock").read_text() == str(os.getpid())
        refused = pytest.raises(StudyError, match=rf"already running .* \(pid {os.getpid()}\)")
        with refused, sqlite_lock(engine, "s"):
            pass
    with sqlite_lock(engine, "s"):  # released on leaving: taken again
        pass
    engine.dispose()
