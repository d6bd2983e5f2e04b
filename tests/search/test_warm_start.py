"""Warm starts (``search.warm_start``): a study's first trials are the best configurations of a
finished study of the same store (or of a ``study export`` file), recorded in its history and
marked by ``study status`` and the report.

Folds are scored without training (``objective.run_fold`` replaced, as in test_pruning): fold
k of a trial scores ``-|pos_margin| - |neg_margin - 1| + k/1000``, so the source's best trial
is its first enqueued point (0, 1) and every expectation is recomputed here from the source's
own Optuna trials."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.search import objective
from mlrc.store import history, studies
from mlrc.store.engine import session
from mlrc.store.schema import TestResult
from mlrc.train import FoldResult

runner = CliRunner()
SPACE = {"pos_margin": {"low": -0.2, "high": 2.0}, "neg_margin": {"low": -0.2, "high": 2.0}}
SOURCE_POINTS = [{"pos_margin": 0.0, "neg_margin": 1.0}, {"pos_margin": 1.0, "neg_margin": 1.5}]


def scored_fold(ctx, kind, params, reproduction, fold, trial_number):
    value = -abs(params["pos_margin"]) - abs(params["neg_margin"] - 1.0) + fold / 1000
    best = {"map_at_r": value, "precision_at_1": value, "r_precision": value}
    return FoldResult("complete", None, 1, best, objective=value)


def study_file(folder: Path, name: str, search: dict, loss: dict | None = None) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": loss or {"name": "contrastive", "search": SPACE},
        "search": {"sampler": "tpe", "seed": 0, **search},
        "test": {"reproductions": 2},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def mlrc(*args: str | Path, ok: bool = True):
    r = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished source study ``src``: 2 enqueued points, then 2 TPE suggestions."""
    tmp = tmp_path_factory.mktemp("warm")
    url = f"sqlite:///{tmp / 'store.db'}"
    path = study_file(tmp, "src", {"trials": 4, "enqueue": SOURCE_POINTS})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(objective, "run_fold", scored_fold)
        mlrc("study", "run", path, "--storage", url, "--artifacts", tmp / "art", "--quiet")
    return tmp, url


def best_of_source(url: str, k: int) -> list[optuna.trial.FrozenTrial]:
    """The source's k best complete trials, from its Optuna study (value, then number)."""
    done = optuna.load_study(study_name="src", storage=url).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,)
    )
    return sorted(done, key=lambda t: (-t.value, t.number))[:k]


def run(tmp: Path, url: str, path: Path, *more: str, ok: bool = True):
    return mlrc(
        "study", "run", path, "--storage", url, "--artifacts", tmp / "art", "--quiet", *more, ok=ok
    )


def test_the_best_k_of_the_source_are_tried_first_and_recorded(source, monkeypatch):
    tmp, url = source
    monkeypatch.setattr(objective, "run_fold", scored_fold)
    path = study_file(tmp, "tgt", {"trials": 3, "warm_start": {"study": "src", "top": 2}})
    run(tmp, url, path)
    expected = best_of_source(url, 2)
    assert expected[0].params == SOURCE_POINTS[0]  # the scoring makes (0, 1) the best
    tgt = optuna.load_study(study_name="tgt", storage=url).trials
    assert [t.params for t in tgt[:2]] == [t.params for t in expected]
    assert [t.user_attrs.get("warm_start_index") for t in tgt] == [0, 1, None]
    engine = store.connect(url)
    row = studies.study_named(engine, "tgt")
    rows = [(h.field, h.old, h.new) for h in history.study_history(engine, row.id)]
    numbers = ", ".join(str(t.number) for t in expected)
    text = f"study src top 2 (trials {numbers})"
    assert ("search.warm_start", None, text) in rows
    assert row.config["study"]["search"]["warm_start"] == {"study": "src", "file": None, "top": 2}
    # a resumed (and grown) study enqueues nothing again and records nothing again
    run(tmp, url, path, "--trials", "4")
    tgt = optuna.load_study(study_name="tgt", storage=url).trials
    assert len(tgt) == 4
    assert [t.user_attrs.get("warm_start_index") for t in tgt].count(0) == 1
    rows = [h.field for h in history.study_history(engine, row.id)]
    assert rows.count("search.warm_start") == 1
    out = mlrc("study", "status", "tgt", "--storage", url).output
    assert f"warm-started from {text}: not the reference's search" in out
    assert "warm-started" not in mlrc("study", "status", "src", "--storage", url).output


def test_fewer_complete_trials_than_top_takes_them_all(source, monkeypatch):
    tmp, url = source
    monkeypatch.setattr(objective, "run_fold", scored_fold)
    path = study_file(tmp, "tgt-all", {"trials": 1, "warm_start": {"study": "src", "top": 9}})
    run(tmp, url, path)
    expected = best_of_source(url, 9)
    assert len(expected) == 4
    tgt = optuna.load_study(study_name="tgt-all", storage=url)
    waiting = tgt.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [tgt.trials[0].params] + [t.system_attrs["fixed_params"] for t in waiting] == [
        t.params for t in expected
    ]
    engine = store.connect(url)
    row = studies.study_named(engine, "tgt-all")
    numbers = ", ".join(str(t.number) for t in expected)
    news = [h.new for h in history.study_history(engine, row.id)]
    assert f"study src top 9 (trials {numbers}: all its 4 complete)" in news


def test_an_exported_file_gives_its_best_trial(source, monkeypatch):
    tmp, url = source
    monkeypatch.setattr(objective, "run_fold", scored_fold)
    export = tmp / "exports" / "src-best.yaml"
    mlrc("study", "export", "src", "--storage", url, "--out", export)
    path = study_file(tmp, "tgt-file", {"trials": 1, "warm_start": {"file": str(export)}})
    run(tmp, url, path)
    tgt = optuna.load_study(study_name="tgt-file", storage=url)
    assert [t.params for t in tgt.trials] == [best_of_source(url, 1)[0].params]
    engine = store.connect(url)
    news = [
        h.new for h in history.study_history(engine, studies.study_named(engine, "tgt-file").id)
    ]
    assert f"file {export} top 5 (its best trial: an export holds only that)" in news


def test_the_report_marks_a_warm_started_study(source, monkeypatch):
    """md (row mark, the legend's note and the row's note), csv and json (``warm_start``),
    latex and html."""
    tmp, url = source
    monkeypatch.setattr(objective, "run_fold", scored_fold)
    path = study_file(tmp, "tgt-rep", {"trials": 1, "warm_start": {"study": "src", "top": 1}})
    run(tmp, url, path)
    engine = store.connect(url)
    with session(engine) as s:
        for name in ("src", "tgt-rep"):
            st = studies.study_named(engine, name)
            for rep in (1, 2):
                for mode in ("separated", "concatenated"):
                    s.add(
                        TestResult(
                            study_id=st.id,
                            reproduction=rep,
                            mode=mode,
                            fold=-1,
                            params={},
                            map_at_r=0.5 + rep / 100 + (name == "src") / 10,
                            precision_at_1=0.6,
                            r_precision=0.4,
                        )
                    )
    base = ["report", "--storage", url, "--study", "src", "--study", "tgt-rep", "--format"]
    md = mlrc(*base, "md").stdout
    number = best_of_source(url, 1)[0].number
    text = f"study src top 1 (trials {number})"
    assert "| contrastive (tgt-rep) ¶ |" in md and "| <ins>contrastive (src)</ins> |" in md
    assert "¶ warm-started search (search.warm_start)" in md
    assert f"contrastive (tgt-rep) (glyphs): warm-started from {text}." in md
    assert md.count("¶") == 2  # the row and the legend's note
    csv = pd.read_csv(io.StringIO(mlrc(*base, "csv").stdout), keep_default_na=False)
    assert dict(zip(csv["study"], csv["warm_start"], strict=False)) == {"src": "", "tgt-rep": text}
    doc = yaml.safe_load(mlrc(*base, "json").stdout)  # JSON is YAML
    assert {line["study"]: line["warm_start"] for line in doc["lines"]} == {
        "src": "",
        "tgt-rep": text,
    }
    tex = mlrc(*base, "latex").stdout
    assert r"contrastive (tgt-rep) \P{}" in tex
    page = mlrc(*base, "html").stdout  # the dashboard's test table is this page's
    assert "contrastive (tgt-rep) ¶" in page and f"warm-started from {text}." in page
