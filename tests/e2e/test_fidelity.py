"""Fidelity to the reference harness (issue #13): a non-finite trial scores 0, the untrained
baseline row, and results that belong to the configuration that computed them."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import data, store
from mlrc.cli import app
from mlrc.config import load_preset
from mlrc.config.identity import code_version, derive_seed
from mlrc.data.transforms import eval_transform
from mlrc.methods import losses
from mlrc.models import TRUNKS
from mlrc.protocol import mlrc_split
from mlrc.search import optuna_setup
from mlrc.search.backends import local
from mlrc.store.engine import session
from mlrc.store.schema import SCHEMA_VERSION, Baseline, EpochMetric, FoldRun, StudyBaseline, Trial
from mlrc.train import FoldSpec, train_fold

runner = CliRunner()
TINY = {
    "iterations_per_epoch": 3,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
}


def study_file(tmp_path: Path, name="s", loss=None, trials=1, reps=2, over=None, enqueue=None):
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": loss or {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0, "enqueue": enqueue or []},
        "test": {"reproductions": reps},
        "overrides": {**TINY, **(over or {})},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(*args: object, ok: bool = True):
    r = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert r.exit_code == 0, r.output
    return r


def rows(url: str, model) -> list:
    with session(store.connect(url)) as s:
        return s.execute(select(model)).scalars().all()


def folds_by_key(url: str) -> dict[tuple, FoldRun]:
    return {(f.kind, f.params_hash, f.reproduction, f.fold): f for f in rows(url, FoldRun)}


# --- 7. a result belongs to the configuration that produced it ---------------------------------


KEEP_ALL = ["--keep", "all"]  # checkpoints stay: what a new store may adopt or must not


def test_a_new_store_never_adopts_folds_of_another_preset(tmp_path):
    """max_epochs 1 on store A, then the same file with max_epochs 2 on a new store B with the
    same artifacts folder: every fold is trained again (2 trained epochs in its history)."""
    art = tmp_path / "art"
    (tmp_path / "1").mkdir(), (tmp_path / "2").mkdir()
    one = study_file(tmp_path / "1")
    url_a = f"sqlite:///{tmp_path / 'a.db'}"
    cli("study", "run", one, "--storage", url_a, "--artifacts", art, "--quiet", *KEEP_ALL)
    two = study_file(tmp_path / "2", over={"max_epochs": 2})
    url_b = f"sqlite:///{tmp_path / 'b.db'}"
    cli("study", "run", two, "--storage", url_b, "--artifacts", art, "--quiet", *KEEP_ALL)
    a, b = folds_by_key(url_a), folds_by_key(url_b)
    assert a.keys() == b.keys() and len(a) == 4
    for key in a:
        assert a[key].checkpoint != b[key].checkpoint  # another protocol folder
        assert Path(a[key].checkpoint).is_file() and Path(b[key].checkpoint).is_file()
    with session(store.connect(url_b)) as s:
        epochs = s.execute(select(EpochMetric.epoch)).scalars().all()
    assert max(epochs) == 2  # trained under the new preset, not the 1-epoch folds' history
    assert len(list((art / "s").glob("p-*"))) == 2


def test_an_unchanged_study_on_a_new_store_reuses_its_folds_with_their_provenance(tmp_path):
    """Store A's finished folds are adopted from their ``last.pt`` by a new store C with the
    same artifacts folder (A keeps its checkpoints: ``--keep all``)."""
    art = tmp_path / "art"
    path = study_file(tmp_path)
    url_a, url_c = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'c.db'}"
    cli("study", "run", path, "--storage", url_a, "--artifacts", art, "--quiet", *KEEP_ALL)
    cli("study", "run", path, "--storage", url_c, "--artifacts", art, "--quiet", *KEEP_ALL)
    a, c = folds_by_key(url_a), folds_by_key(url_c)
    assert a.keys() == c.keys()
    for key in a:  # adopted from last.pt: same numbers, same wall time, same provenance
        assert (c[key].map_at_r, c[key].best_epoch, c[key].wall_time_s) == (
            a[key].map_at_r,
            a[key].best_epoch,
            a[key].wall_time_s,
        )
        assert (c[key].device, c[key].code_version) == ("cpu", code_version())
        assert c[key].objective == a[key].objective is not None


@pytest.fixture(scope="module")
def glyphs():
    ds = data.build("glyphs")
    return ds, mlrc_split(ds.labels, scheme="mlrc").folds[0]


def fold_spec(glyphs, workdir: Path, identity: dict, device: str = "cpu") -> FoldSpec:
    ds, fold = glyphs
    return FoldSpec(
        ds,
        "glyphs",
        fold.train_classes,
        fold.val_classes,
        "contrastive",
        {},
        None,
        load_preset("cpu", TINY),
        0,
        workdir,
        device=device,
        progress=False,
        identity=identity,
        code_version="test-1",
    )


def test_a_checkpoint_of_another_configuration_is_set_aside_and_retrained(glyphs, tmp_path, caplog):
    first = train_fold(fold_spec(glyphs, tmp_path / "fold0", {"protocol": "A", "seed": 0}))
    assert first.status == "complete"
    with caplog.at_level(logging.WARNING, logger="mlrc"):
        again = train_fold(fold_spec(glyphs, tmp_path / "fold0", {"protocol": "B", "seed": 0}))
    assert again.status == "complete" and again.wall_time_s != first.wall_time_s  # retrained
    assert (tmp_path / "fold0.other-1" / "last.pt").is_file()  # set aside, not deleted
    said = [r.getMessage() for r in caplog.records if "another configuration" in r.getMessage()]
    assert len(said) == 1 and "protocol: 'A' there, 'B' now" in said[0]
    state = torch.load(tmp_path / "fold0" / "last.pt", weights_only=True)
    assert state["identity"] == {"protocol": "B", "seed": 0}


def test_an_adopted_result_keeps_the_device_that_computed_it(glyphs, tmp_path):
    """The reported bug: reuse recorded device = cuda for folds that ran on a CPU. Adopting a
    finished fold returns before any model is built, so asking for cuda here is harmless."""
    ident = {"protocol": "A"}
    done = train_fold(fold_spec(glyphs, tmp_path, ident, device="cpu"))
    adopted = train_fold(fold_spec(glyphs, tmp_path, ident, device="cuda"))
    assert (adopted.device, adopted.code_version) == ("cpu", "test-1")
    assert adopted.wall_time_s == done.wall_time_s and adopted.objective == done.objective


# --- 2. a non-finite trial scores 0 and the sampler sees it ------------------------------------


class _NaNAfter(torch.nn.Module):
    """mean(e²) until step k, then NaN (k = ``nan_after``; 0: never)."""

    def __init__(self, nan_after: int) -> None:
        super().__init__()
        self.nan_after, self.calls = nan_after, 0

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        bad = self.nan_after and self.calls > self.nan_after
        return embeddings.pow(2).mean() * (float("nan") if bad else 1.0)


def _nan_after(*, num_classes: int, embedding_size: int, nan_after: int = 0, margin: float = 0):
    """Returns NaN after ``nan_after`` steps (for tests); ``margin`` is only searched."""
    return _NaNAfter(nan_after)


@pytest.fixture
def nan_after_loss():
    losses.register("test_nan_after", batch="pair")(_nan_after)
    yield "test_nan_after"
    losses.LOSSES.unregister("test_nan_after")


def test_a_non_finite_trial_is_complete_with_0_and_the_next_suggestion_saw_it(
    tmp_path, nan_after_loss, monkeypatch, caplog
):
    """Trial 0 (enqueued) goes NaN after 2 steps: Optuna COMPLETE with value 0, reason stored.
    TPE with one start-up trial makes trial 1's suggestion depend on trial 0's value; trial 1's
    parameters equal those of a sampler (same per-position seed) that saw trial 0 as COMPLETE
    0 — and differ from one that saw it as FAIL (what mlrc did before), so the test can fail."""

    def tpe(name, seed, space=None, position=None):  # as mlrc.search.space.sampler seeds it
        if position is not None:
            seed = derive_seed(seed, "sampler", position)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=1)

    for module in (local, optuna_setup):  # where the study's samplers are made
        monkeypatch.setattr(module, "make_sampler", tpe)
    loss = {
        "name": nan_after_loss,
        "params": {"nan_after": 2},
        "search": {"margin": {"low": 0.0, "high": 1.0}},
    }
    path = study_file(tmp_path, loss=loss, trials=2, enqueue=[{"margin": 0.9}])
    url = f"sqlite:///{tmp_path / 'db'}"
    cli("study", "run", path, "--storage", url, "--artifacts", tmp_path / "a", "--quiet")
    ts = sorted(rows(url, Trial), key=lambda t: t.number)
    assert [(t.state, t.value) for t in ts] == [("complete", 0.0), ("complete", 0.0)]
    assert ts[0].reason == "non-finite loss at iteration 3, fold 0"
    said = [rec.getMessage() for rec in caplog.records]
    assert "trial 0 scored 0: non-finite loss at iteration 3, fold 0" in said
    stored = optuna.load_study(study_name="s", storage=url).get_trials()
    assert stored[0].state == optuna.trial.TrialState.COMPLETE and stored[0].value == 0.0
    assert stored[0].user_attrs["reason"] == ts[0].reason

    def replay(state: optuna.trial.TrialState) -> float:
        dist = stored[0].distributions
        o = optuna.create_study(
            direction="maximize",
            sampler=optuna.samplers.TPESampler(
                seed=derive_seed(0, "sampler", 1), n_startup_trials=1
            ),
        )
        o.add_trial(
            optuna.trial.create_trial(
                params=stored[0].params,
                distributions=dist,
                value=0.0 if state == optuna.trial.TrialState.COMPLETE else None,
                state=state,
            )
        )
        return o.ask(dist).params["margin"]

    assert stored[1].params["margin"] == replay(optuna.trial.TrialState.COMPLETE)
    assert stored[1].params["margin"] != replay(optuna.trial.TrialState.FAIL)


# --- 1. the untrained baseline row --------------------------------------------------------------


def naive_metrics(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(MAP@R, P@1, R-Precision) by a plain float64 loop, self excluded, stable ties."""
    x = x.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    out = []
    for q in range(len(x)):
        R = int((y == y[q]).sum()) - 1
        if R == 0:
            continue
        others = np.array([i for i in range(len(x)) if i != q])
        order = others[np.argsort(-(x[others] @ x[q]), kind="stable")][:R]
        rel = y[order] == y[q]
        precisions = np.cumsum(rel) / np.arange(1, R + 1)
        out.append(((precisions * rel).sum() / R, float(rel[0]), rel.sum() / R))
    return tuple(float(np.mean([o[i] for o in out])) for i in range(3))


def untrained_features(preset, ds, classes) -> tuple[np.ndarray, np.ndarray]:
    """The trunk alone, built here (seed 0 for a random init), on the test classes."""
    torch.manual_seed(0)
    trunk = TRUNKS.get(preset.trunk)(pretrained=preset.pretrained).eval()
    im = preset.image
    tf = eval_transform(im.resize, im.crop, trunk.input_spec)
    idx = np.flatnonzero(np.isin(ds.labels, classes))
    with torch.no_grad():
        feats = torch.cat(
            [
                trunk(torch.stack([tf(ds.load_image(int(i))) for i in idx[s : s + 64]]))
                for s in range(0, len(idx), 64)
            ]
        )
    return feats.numpy(), ds.labels[idx]


def test_the_untrained_row_is_computed_once_and_matches_a_naive_evaluation(tmp_path):
    art, url = tmp_path / "art", f"sqlite:///{tmp_path / 'db'}"
    for name, loss in (("s1", "contrastive"), ("s2", "triplet")):
        path = study_file(tmp_path, name=name, loss={"name": loss, "params": {}, "search": {}})
        cli("study", "run", path, "--storage", url, "--artifacts", art, "--quiet")
        cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet")
    base = rows(url, Baseline)
    links = rows(url, StudyBaseline)
    assert sorted(b.mode for b in base) == ["concatenated", "separated"]  # one key, shared
    assert len(links) == 2 and {link.key for link in links} == {base[0].key}
    b = base[0]
    assert (b.kind, b.label, b.dataset) == ("random_init", "Random init (tiny_cnn)", "glyphs")
    preset = load_preset("cpu", TINY)
    ds = data.build("glyphs")
    x, y = untrained_features(preset, ds, mlrc_split(ds.labels, scheme="mlrc").test_classes)
    want = naive_metrics(x, y)
    for row in base:  # separated = concatenated = the trunk's own features
        got = (row.map_at_r, row.precision_at_1, row.r_precision)
        assert got == pytest.approx(want, abs=1e-9)


# --- store upgrade --------------------------------------------------------------------------------


def test_a_schema_2_store_is_upgraded_in_place(tmp_path):
    db = tmp_path / "old.db"
    store.connect(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as c:  # what a schema-2 store looks like
        c.execute("ALTER TABLE mlrc_fold_run DROP COLUMN objective")
        c.execute("ALTER TABLE mlrc_fold_run DROP COLUMN code_version")
        c.execute("UPDATE mlrc_meta SET value = '2' WHERE key = 'schema_version'")
    store.connect(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as c:
        cols = {r[1] for r in c.execute("PRAGMA table_info(mlrc_fold_run)")}
        [(version,)] = c.execute("SELECT value FROM mlrc_meta").fetchall()
    assert {"objective", "code_version"} <= cols and version == str(SCHEMA_VERSION)
