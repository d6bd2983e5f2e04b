"""The certified risk a pruned study carries (``mlrc/resources/certified_risk.json``, #42): its
figures recomputed here from the committed corpus (replay, δ from the reproductions with numpy,
Clopper–Pearson from scipy's beta quantile), the budget a study's length selects, and "not
measured for these settings" off the corpus's preset and folds — in ``study status`` too."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from mlrc import search as S
from mlrc.cli import app
from mlrc.config import load_study
from mlrc.report.legend import risk_text
from mlrc.search import replay as rp
from mlrc.search.pruning import CERTIFIED_TABLE, Rules, measured_risk

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads(resources.files("mlrc.resources").joinpath(CERTIFIED_TABLE).read_text())
SEQUENTIAL_GAIN = "sequential:delta=0.04,alpha=0.05,startup=5+gain"


def _delta_by_hand(studies) -> dict[str, float]:
    """Per dataset: the pooled SD (ddof 1 per study) of the reproductions' 4-fold means."""
    out = {}
    for d in {s.dataset for s in studies}:
        groups = [np.mean(np.array(s.reseeds), axis=1) for s in studies if s.dataset == d]
        ss = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups if len(g) > 1)
        out[d] = float(np.sqrt(ss / sum(len(g) - 1 for g in groups if len(g) > 1)))
    return out


@pytest.mark.parametrize("budget", [20, 50])
@pytest.mark.parametrize("spec", ["none+gain", SEQUENTIAL_GAIN])
def test_the_table_is_a_replay_of_the_committed_corpus(spec, budget):
    about, studies = rp.read_corpus(ROOT / TABLE["corpus"])
    assert (TABLE["preset"], TABLE["studies"]) == (about["preset"], len(studies))
    assert {s.n_folds for s in studies} == {TABLE["folds"]}
    deltas = _delta_by_hand(studies)
    assert TABLE["delta"] == pytest.approx(deltas, abs=1e-12)
    pruner, _, stop = spec.partition("+")
    rules = rp.parse_rules(pruner, stop or None)
    runs = [(s, rp.replay(rp.first_trials(s, budget), rules)) for s in studies]
    within = sum(r.regret <= deltas[s.dataset] + 1e-12 for s, r in runs)
    want = TABLE["rules"][rules.label()][str(budget)]
    assert want["within"] == within and want["studies"] == len(studies)
    assert want["exact"] == sum(r.same_choice for _, r in runs)
    spent = sum(r.fold_epochs for _, r in runs) / sum(r.full_fold_epochs for _, r in runs)
    assert want["fold_epochs_fraction"] == pytest.approx(spent, abs=1e-12)
    n = len(studies)
    lower = stats.beta.ppf(0.05, within, n - within + 1) if within else 0.0
    assert want["within_bounds"][0] == pytest.approx(lower, abs=1e-9)


def _file(tmp_path: Path, trials: int, search: dict, over: dict | None = None) -> Path:
    doc = {"name": "c", "dataset": {"name": "glyphs"}, "preset": "cpu",
           "loss": {"name": "contrastive"}, "search": {"trials": trials, **search},
           "overrides": over or {}}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


SEARCH = {"pruner": "sequential", "stop": {}}


@pytest.mark.parametrize(("trials", "budget"), [(5, 20), (25, 30), (50, 50), (70, 50)])
def test_a_study_carries_the_figures_of_its_budget(tmp_path, trials, budget):
    r = load_study(_file(tmp_path, trials, SEARCH))
    c = measured_risk(r)["certified"]
    label = Rules.of(r).label()
    assert c["measured"] and c["trials"] == budget and c["study_trials"] == trials
    assert c["within"] == TABLE["rules"][label][str(budget)]["within"]
    assert c["leave_one_study_out"] == TABLE["leave_one_study_out"][str(budget)]
    text = risk_text(measured_risk(r))
    assert f"first {budget} trials" in text and "within δ of the full protocol's best" in text
    assert ("longer ones are not certified" in text) == (trials > 50)


SETTINGS = "not measured for these settings (the corpus: preset cpu without overrides, 4 folds, "


@pytest.mark.parametrize(
    ("search", "over", "why"),
    [
        (SEARCH, {"folds": 3}, SETTINGS),
        (SEARCH, {"max_epochs": 5}, SETTINGS),  # the numbers change: not the corpus's studies
        ({**SEARCH, "sampler": "tpe"}, {}, SETTINGS),
        ({"pruner": "sequential", "prune_delta": 0.05}, {}, "not measured for these rules"),
    ],
)
def test_outside_the_corpus_the_risk_is_not_certified(tmp_path, search, over, why):
    r = load_study(_file(tmp_path, 50, search, over))
    c = measured_risk(r)["certified"]
    assert not c["measured"] and c["why"].startswith(why)
    assert f"certified risk {why}" in risk_text(measured_risk(r))


def test_a_runtime_only_override_keeps_the_certified_risk(tmp_path):
    r = load_study(_file(tmp_path, 50, SEARCH, {"decoded_cache": True}))  # speed, not numbers
    assert measured_risk(r)["certified"]["measured"]


def test_study_status_shows_the_certified_risk(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    with S.open_study(load_study(_file(tmp_path, 30, SEARCH)), url, tmp_path / "art"):
        pass  # opened, nothing trained: the risk is stored when the study is created
    r = CliRunner().invoke(app, ["study", "status", "c", "--storage", url])
    assert r.exit_code == 0, r.output
    line = " ".join(next(x for x in r.output.split("\n\n") if "pruning:" in x).split())
    want = f"certified on {TABLE['studies']} studies (cpu preset, 4 folds, first 30 trials;"
    assert want in line, line
