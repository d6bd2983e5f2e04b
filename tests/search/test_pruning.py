"""Opt-in pruning: after fold k a trial below the median of complete trials' running means
stops, is recorded as PRUNED with its reason, and still counts towards the budget."""

from __future__ import annotations

import optuna
import yaml
from optuna.trial import TrialState
from sqlalchemy import select

from mlrc import search as S
from mlrc.config import load_study
from mlrc.search import objective
from mlrc.store.engine import transact
from mlrc.store.schema import Trial
from mlrc.train import FoldResult

# Fold k of a trial scores pos_margin + k/100: the order of trials is the same at every fold.
MARGINS = [0.5, 0.6, 0.1, 0.9, 0.55]


def _study(tmp_path, pruner: str):
    doc = {
        "name": f"prune-{pruner}",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive", "params": {"neg_margin": 1.0}},
        "search": {
            "trials": len(MARGINS),
            "sampler": "tpe",
            "pruner": pruner,
            "prune_startup": 2,
            "enqueue": [{"pos_margin": m} for m in MARGINS],
        },
    }
    path = tmp_path / f"{pruner}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_study(path)


def _run(tmp_path, monkeypatch, pruner: str):
    trained: list[tuple[float, int]] = []

    def scored_fold(ctx, kind, params, reproduction, fold, trial_number):
        trained.append((params["pos_margin"], fold))
        value = params["pos_margin"] + fold / 100
        best = {"map_at_r": value, "precision_at_1": value, "r_precision": value}
        return FoldResult("complete", None, 1, best, objective=value)

    monkeypatch.setattr(objective, "run_fold", scored_fold)
    url = f"sqlite:///{tmp_path / pruner}.db"
    with S.open_study(_study(tmp_path, pruner), url, tmp_path / "art", progress=False) as ctx:
        ostudy = S.run_search(ctx)
        rows = {
            r.number: r
            for r in transact(
                ctx.engine, lambda s: s.scalars(select(Trial)).all(), "reading trials"
            )
        }
    return ostudy, rows, trained


def test_median_pruning_stops_the_trial_below_the_median(tmp_path, monkeypatch):
    ostudy, rows, trained = _run(tmp_path, monkeypatch, "median")
    states = [t.state for t in ostudy.trials]
    # 0.5 and 0.6 start the pruner; after fold 1, 0.1 is below their median (0.55) and 0.9
    # above it; 0.55 is below the median of (0.5, 0.6, 0.9) = 0.6.
    assert states == [
        TrialState.COMPLETE,
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.COMPLETE,
        TrialState.PRUNED,
    ]
    assert [m for m, _ in trained].count(0.1) == 1  # one fold trained, three saved
    assert len(trained) == 3 * 4 + 2 * 1
    assert rows[2].state == "pruned" and rows[2].value is None
    assert rows[2].reason.startswith("pruned after 1 of 4 folds: running mean 0.1000")
    assert ostudy.trials[2].intermediate_values == {1: 0.1}
    assert ostudy.best_trial.params["pos_margin"] == 0.9
    assert len(S.finished(ostudy)) == len(MARGINS)  # pruned trials count towards the budget


def test_no_pruning_by_default(tmp_path, monkeypatch):
    ostudy, rows, trained = _run(tmp_path, monkeypatch, "none")
    assert all(t.state == TrialState.COMPLETE for t in ostudy.trials)
    assert len(trained) == 4 * len(MARGINS)
    assert isinstance(ostudy.pruner, optuna.pruners.NopPruner)
    assert {r.state for r in rows.values()} == {"complete"}


def test_reference_preset_never_prunes(tmp_path):
    path = tmp_path / "ref.yaml"
    doc = {"name": "r", "dataset": {"name": "glyphs"}, "preset": "reference"}
    path.write_text(yaml.safe_dump({**doc, "loss": {"name": "contrastive"}}))
    resolved = load_study(path)
    assert resolved.pruner == "none"
    assert isinstance(S.make_pruner(resolved), optuna.pruners.NopPruner)
