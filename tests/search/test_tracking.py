"""Experiment tracking (mlrc.search.tracking): a study's trials and test reproductions logged to
a real local MLflow store (SQLite, the store MLflow 3 supports) and read back with
``mlflow.search_runs``, checked against mlrc's own store."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import yaml
from conftest import require
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.config import ConfigError, load_study
from mlrc.search.campaign_runner import cells, parse_campaign
from mlrc.search.tracking import TrackingError, parse_track, with_track
from mlrc.store.engine import session
from mlrc.store.schema import EpochMetric, FoldRun, Study, TestResult, Trial

runner = CliRunner()
TINY = {  # seconds per study on a CPU: 2 folds, 16-px crops, 2 epochs of 2 iterations
    "iterations_per_epoch": 2,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 2},
    "folds": 2,
    "image": {"resize": 18, "crop": 16},
    "eval_batch_size": 256,
}
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None


@pytest.fixture
def mlflow():
    """The mlflow package (skip on a laptop without the tracking extra, fail in CI)."""
    require(HAS_MLFLOW, "mlflow is not installed (pip install -e '.[tracking]')")
    import mlflow

    return mlflow


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch):
    monkeypatch.delenv("MLRC_TRACK", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


def write_study(tmp: Path, name: str, *, trials: int = 2, tracking: dict | None = None) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs", "params": {"size": 24}},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": TINY,
    }
    if tracking is not None:
        doc["tracking"] = tracking
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def rows(url: str, query) -> list:
    with session(store.connect(url)) as s:
        return s.execute(query).all()


def runs(mlflow, uri: str):
    """Every run of the ``mlrc`` experiment, as search_runs' DataFrame."""
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["mlrc"])


# --- a study tracked end to end -----------------------------------------------------------------


def test_trials_and_reproductions_match_the_store(tmp_path, mlflow):
    """``--track`` on ``study run``, then ``tracking:`` added to the file for ``study test``
    (the study resumes: tracking is not part of its fingerprint): one study run, one child per
    trial (params, objective, per-epoch metrics) and per reproduction (test metrics), equal to
    what mlrc stored."""
    url, uri = f"sqlite:///{tmp_path / 'mlrc.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "art"
    study = write_study(tmp_path, "tracked")
    cli(
        "study",
        "run",
        study,
        "--storage",
        url,
        "--artifacts",
        art,
        "--quiet",
        "--track",
        f"mlflow:{uri}",
    )
    write_study(tmp_path, "tracked", tracking={"mlflow": uri})
    cli("study", "test", study, "--storage", url, "--artifacts", art, "--quiet")

    df = runs(mlflow, uri)
    parent = df[df["tags.mlrc.kind"] == "study"]
    assert len(parent) == 1
    parent = parent.iloc[0]
    assert parent["tags.mlrc.study"] == "tracked" and parent["tags.mlrc.dataset"] == "glyphs"
    assert parent["tags.mlrc.loss"] == "contrastive" and parent["tags.mlrc.preset"] == "cpu"
    assert parent["tags.mlrc.code_version"] and parent["status"] == "FINISHED"
    children = df[df["tags.mlflow.parentRunId"] == parent["run_id"]]
    assert len(children) == len(df) - 1  # every other run is nested under the study run

    (study_id,) = rows(url, select(Study.id).where(Study.name == "tracked"))[0]
    stored = {t.number: t for (t,) in rows(url, select(Trial).where(Trial.study_id == study_id))}
    trial_runs = children[children["tags.mlrc.kind"] == "trial"]
    assert sorted(trial_runs["tags.mlrc.trial"].astype(int)) == sorted(stored) == [0, 1]
    client = mlflow.tracking.MlflowClient(uri)
    for _, run in trial_runs.iterrows():
        t = stored[int(run["tags.mlrc.trial"])]
        assert run["status"] == "FINISHED" and run["tags.mlrc.state"] == t.state == "complete"
        params = {k.removeprefix("params."): v for k, v in run.items() if k.startswith("params.")}
        assert {k: v for k, v in params.items() if isinstance(v, str)} == {
            k: str(v) for k, v in t.params.items()
        }
        assert run["metrics.objective"] == pytest.approx(t.value, abs=1e-12)
        assert run["metrics.objective_sem"] == pytest.approx(t.sem, abs=1e-12)
        folds = rows(
            url,
            select(FoldRun.id, FoldRun.fold, FoldRun.objective).where(
                FoldRun.study_id == study_id,
                FoldRun.kind == "search",
                FoldRun.params_hash == t.params_hash,
            ),
        )
        assert len(folds) == 2
        for fold_run_id, fold, objective in folds:
            assert run[f"metrics.fold{fold}/objective"] == pytest.approx(objective, abs=1e-12)
            epochs = rows(
                url,
                select(EpochMetric.epoch, EpochMetric.map_at_r, EpochMetric.train_loss)
                .where(EpochMetric.fold_run_id == fold_run_id)
                .order_by(EpochMetric.epoch),
            )
            assert [e for e, _, _ in epochs] == [0, 1, 2]
            history = client.get_metric_history(run["run_id"], f"fold{fold}/val_map_at_r")
            assert sorted((m.step, m.value) for m in history) == [(e, v) for e, v, _ in epochs]
            losses = client.get_metric_history(run["run_id"], f"fold{fold}/train_loss")
            assert sorted((m.step, m.value) for m in losses) == [
                (e, v) for e, _, v in epochs if v is not None
            ]

    rep_runs = children[children["tags.mlrc.kind"] == "reproduction"]
    assert sorted(rep_runs["tags.mlrc.reproduction"].astype(int)) == [1, 2]
    results = rows(url, select(TestResult).where(TestResult.study_id == study_id))
    assert len(results) == 2 * (2 + 2)  # per reproduction: 2 fold models, their mean, 512-D
    for (r,) in results:
        run = rep_runs[rep_runs["tags.mlrc.reproduction"] == str(r.reproduction)].iloc[0]
        assert run["status"] == "FINISHED"
        where = f"metrics.test/{r.mode}" + (f"/fold{r.fold}" if r.fold >= 0 else "")
        for metric in ("map_at_r", "precision_at_1", "r_precision", *(r.extra or {})):
            value = (
                getattr(r, metric)
                if metric in ("map_at_r", "precision_at_1", "r_precision")
                else r.extra[metric]
            )
            assert run[f"{where}/{metric}"] == pytest.approx(value, abs=1e-12, nan_ok=True)
        assert run["params.pos_margin"] == str(r.params["pos_margin"])


def test_a_failing_store_warns_once_and_the_study_goes_on(tmp_path, mlflow, monkeypatch, caplog):
    """MLflow failing mid-run (its store gone unwritable after the study run was opened): one
    warning, then no more tracking; every trial still completes."""
    from mlflow.tracking import MlflowClient

    url, uri = f"sqlite:///{tmp_path / 'mlrc.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    real = MlflowClient.log_batch
    calls = []

    def flaky(self, run_id, *args, **kwargs):
        calls.append(run_id)
        if len(calls) > 3:  # after the study run's tags and the first trial's params/epoch
            raise OSError("disk I/O error")
        return real(self, run_id, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", flaky)
    study = write_study(tmp_path, "flaky", tracking={"mlflow": uri})
    with caplog.at_level(logging.WARNING, logger="mlrc"):
        cli("study", "run", study, "--storage", url, "--artifacts", tmp_path / "art", "--quiet")
    warned = [r.getMessage() for r in caplog.records if "tracking" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "MLflow tracking at" in warned[0] and "disk I/O error" in warned[0]
    assert "the study goes on" in warned[0]
    assert len(calls) == 4  # nothing was tried after the failure
    states = rows(url, select(Trial.state))
    assert [s for (s,) in states] == ["complete", "complete"]


@pytest.mark.parametrize("where", ["a file as its folder", "a server that is down"])
def test_an_unusable_uri_warns_once(tmp_path, mlflow, caplog, where):
    """A store that cannot be created (a file where its folder should be) or a server that does
    not answer: one warning, naming the target, and the study runs."""
    url = f"sqlite:///{tmp_path / 'mlrc.db'}"
    study = write_study(tmp_path, "nowhere", trials=1)
    (tmp_path / "a-file").write_text("")
    target = {
        "a file as its folder": f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}",
        "a server that is down": "http://127.0.0.1:1",  # connection refused
    }[where]
    track = f"mlflow:{target}"
    with caplog.at_level(logging.WARNING, logger="mlrc"):
        cli(
            "study",
            "run",
            study,
            "--storage",
            url,
            "--artifacts",
            tmp_path / "art",
            "--quiet",
            "--track",
            track,
        )
    warned = [r.getMessage() for r in caplog.records if "tracking" in r.getMessage()]
    assert len(warned) == 1 and "opening the study run" in warned[0], warned
    assert f"MLflow tracking at {target} failed" in warned[0]
    assert [s for (s,) in rows(url, select(Trial.state))] == ["complete"]


def test_processes_share_the_study_and_trial_runs(tmp_path, mlflow, monkeypatch):
    """Two processes of one study (pool workers, a Ray trial and its fold tasks) find the same
    study run — one that raced the other to create it deletes its own — and the same trial
    run; a pruned trial ends KILLED, one left open when the process closes the study ends
    interrupted."""
    from mlrc.search.folds import FoldJob
    from mlrc.search.tracking import MlflowTracker, study_run
    from mlrc.train import EpochRecord

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = study_run(load_study(write_study(tmp_path, "pool")), folds=4)
    a, b = MlflowTracker(uri), MlflowTracker(uri)
    a.start_study(ctx)
    real, looks = MlflowTracker.oldest_run, []

    def raced(self, wanted):  # b's first look misses a's study run: both create one
        looks.append(wanted)
        return None if len(looks) == 1 else real(self, wanted)

    monkeypatch.setattr(MlflowTracker, "oldest_run", raced)
    b.start_study(ctx)
    monkeypatch.setattr(MlflowTracker, "oldest_run", real)
    assert a.parent is not None and b.parent == a.parent and not a.off and not b.off

    a.trial_started(3, {"pos_margin": 0.25})
    b.epoch(FoldJob("search", "h", 0, 1), 3, EpochRecord(1, 0.5, 0.2, 0.3, 0.1))
    b.epoch(FoldJob("search", "h", 0, 1), 3, EpochRecord(1, 0.5, 0.2, 0.3, 0.1))  # once
    b.trial_finished(3, "pruned", None, None, "pruned after 1 of 2 folds")
    a.trial_started(4, {"pos_margin": 0.5})
    a.close()

    df = runs(mlflow, uri)
    assert (df["tags.mlrc.kind"] == "study").sum() == 1  # the loser was deleted
    t3 = df[df["tags.mlrc.trial"] == "3"].iloc[0]
    assert t3["tags.mlflow.parentRunId"] == a.parent and t3["params.pos_margin"] == "0.25"
    assert t3["status"] == "KILLED" and t3["tags.mlrc.state"] == "pruned"
    assert t3["tags.mlrc.reason"] == "pruned after 1 of 2 folds"
    history = mlflow.tracking.MlflowClient(uri).get_metric_history(
        t3["run_id"], "fold1/val_map_at_r"
    )
    assert [(m.step, m.value) for m in history] == [(1, 0.2)]
    t4 = df[df["tags.mlrc.trial"] == "4"].iloc[0]
    assert t4["status"] == "KILLED" and t4["tags.mlrc.state"] == "interrupted"


# --- options and files --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["study", "run", "S.yaml"],
        ["study", "test", "S.yaml"],
        ["worker", "S.yaml"],
        ["campaign", "run", "C.yaml"],
    ],
)
@pytest.mark.parametrize("value", ["foo", "mlflow:", "neptune:x", "mlflow"])
def test_an_invalid_track_is_one_line(tmp_path, command, value):
    r = runner.invoke(app, [*command, "--storage", f"sqlite:///{tmp_path}/x.db", "--track", value])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == (
        f"error: --track: expected mlflow:URI or wandb:PROJECT (or none), got {value!r}"
    )


def test_the_environment_variable_is_the_option(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRC_TRACK", "bogus")
    r = runner.invoke(app, ["study", "run", "S.yaml", "--storage", f"sqlite:///{tmp_path}/x.db"])
    assert r.exit_code == 2 and r.output.startswith("error: --track: expected"), r.output


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_without_the_package_is_one_line(tmp_path):
    r = runner.invoke(app, ["study", "run", "S.yaml", "--track", "wandb:my-project"])
    assert r.exit_code == 2
    assert r.output.strip() == (
        "error: --track: wandb tracking needs the wandb package (pip install wandb)"
    )


def test_parse_track():
    assert parse_track("mlflow:sqlite:///a/b.db").mlflow == "sqlite:///a/b.db"
    assert parse_track("mlflow:http://host:5000").mlflow == "http://host:5000"
    assert parse_track("wandb:proj").wandb == "proj"
    assert parse_track("none") is None
    with pytest.raises(TrackingError, match=r"^--track: expected mlflow:URI or wandb:PROJECT"):
        parse_track("file:///x")


def test_a_bad_tracking_key_names_the_field(tmp_path):
    path = write_study(tmp_path, "typo", tracking={"mlfow": "sqlite:///x.db"})
    with pytest.raises(ConfigError, match=r"tracking\.mlfow"):
        load_study(path)


def test_tracking_is_not_part_of_the_fingerprint(tmp_path):
    plain = load_study(write_study(tmp_path, "fp"))
    tracked = load_study(write_study(tmp_path, "fp", tracking={"mlflow": "sqlite:///m.db"}))
    assert tracked.study.tracking.mlflow == "sqlite:///m.db"
    assert plain.fingerprint() == tracked.fingerprint()
    overridden = with_track(tracked, "none")
    assert overridden.study.tracking is None and overridden.fingerprint() == plain.fingerprint()
    assert with_track(plain, None) is plain


def test_a_campaign_passes_its_tracking_to_its_studies():
    doc = {
        "name": "camp",
        "datasets": [{"name": "glyphs"}],
        "losses": ["contrastive", "triplet_margin"],
        "tracking": {"mlflow": "sqlite:///m.db"},
    }
    grid = cells(parse_campaign(doc))
    assert [c.study.tracking.mlflow for c in grid] == ["sqlite:///m.db"] * 2
