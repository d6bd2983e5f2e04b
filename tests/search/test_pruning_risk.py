"""The measured risk a pruned study carries (``mlrc/resources/pruning_risk.json``): the figures
of its rules for its number of trials, kept in step with its budget, and equal to a replay of
the committed corpus (``bench/corpus/``), which the table claims to summarise."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest
import yaml

from mlrc import search as S
from mlrc import store
from mlrc.config import load_study
from mlrc.config.schema import StopSpec
from mlrc.report.legend import risk_text
from mlrc.search import replay as rp
from mlrc.search.pruning import RISK_TABLE, Rules, measured_risk

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads(resources.files("mlrc.resources").joinpath(RISK_TABLE).read_text())


def _file(tmp_path: Path, trials: int, **search) -> Path:
    doc = {"name": "p", "dataset": {"name": "glyphs"}, "preset": "cpu",
           "loss": {"name": "contrastive"}, "search": {"trials": trials, **search}}  # fmt: skip
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("trials", "length"), [(3, 20), (20, 20), (21, 30), (50, 50), (80, 50)])
def test_the_risk_is_the_figure_for_the_studys_number_of_trials(tmp_path, trials, length):
    r = load_study(_file(tmp_path, trials, stop={}))
    risk = measured_risk(r)
    label = Rules(stop=StopSpec()).label()
    assert risk["rules"] == label and risk["measured"]
    assert risk["trials"] == length and risk["study_trials"] == trials
    want = TABLE["rules"][label]["by_length"][str(length)]
    assert risk["fold_epochs_fraction"] == want["fold_epochs_fraction"]
    assert risk["choice_pruned"] == want["choice_pruned"]
    text = risk_text(risk)
    assert f"studies, first {length} trials): {want['fold_epochs_fraction']:.2f}×" in text
    assert (f"more than the corpus's {length}: its risk is not measured" in text) == (
        trials > length
    )


def test_a_rule_outside_the_tuned_grid_says_it_is_not_measured(tmp_path):
    r = load_study(_file(tmp_path, 50, stop={"quantile": 0.33}))
    risk = measured_risk(r)
    certified = risk.pop("certified")
    assert risk == {"rules": Rules.of(r).label(), "measured": False, "corpus": TABLE["corpus"]}
    assert not certified["measured"] and certified["why"].startswith("not measured for these rules")
    assert "risk not measured on the corpus" in risk_text(risk)
    assert measured_risk(load_study(_file(tmp_path, 50))) is None  # no pruning: no risk


def test_a_grown_budget_brings_the_risk_of_the_new_length(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    for trials in (20, 45):  # the file edited between two runs (nothing trained: opened only)
        with S.open_study(load_study(_file(tmp_path, trials, stop={})), url, tmp_path / "art"):
            pass
        risk = store.studies.study_named(store.connect(url), "p").settings["pruning_risk"]
        assert risk["study_trials"] == trials and risk["trials"] == (20 if trials == 20 else 50)


def test_the_table_is_a_replay_of_the_committed_corpus():
    """The recommended rule's figures, at every length, recomputed here from the corpus file
    with the replay (pooled fold-epochs, choices lost, mean regret)."""
    about, studies = rp.read_corpus(ROOT / TABLE["corpus"])
    assert TABLE["about"] == about
    label = TABLE["recommended"]
    assert label == Rules(stop=StopSpec()).label()  # search.stop's defaults are the tuned rule
    for n in TABLE["lengths"]:
        runs = [rp.replay(dataclasses.replace(s, trials=s.trials[:n]), Rules(stop=StopSpec()))
                for s in studies]  # fmt: skip
        want = TABLE["rules"][label]["by_length"][str(n)]
        assert want["fold_epochs_fraction"] == pytest.approx(
            sum(r.fold_epochs for r in runs) / sum(r.full_fold_epochs for r in runs), abs=1e-12
        )
        assert want["choice_pruned"] == sum(not r.same_choice for r in runs)
        assert want["mean_regret"] == pytest.approx(sum(r.regret for r in runs) / len(runs))


def _cli(*args: object, code: int = 0):
    from typer.testing import CliRunner

    from mlrc.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def test_replay_of_a_studys_first_trials_spends_what_a_hand_count_says():
    """``mlrc replay --trials 20`` replays each study's first 20 trials: unpruned, the
    fold-epochs are the epochs of their folds (a repeated parameter set's counted once)."""
    corpus = ROOT / TABLE["corpus"]
    out = _cli("replay", "--corpus", corpus, "--trials", 20, "--json").output
    docs = {d["study"]: d for d in map(json.loads, out.splitlines())}
    _, studies = rp.read_corpus(corpus)
    assert set(docs) == {s.name for s in studies}
    for s in studies:
        seen, want = set(), 0
        for t in s.trials[:20]:
            for f in t.folds:
                if (t.params_hash, f.fold) not in seen:
                    want += max(e for e, _ in f.points)
                seen.add((t.params_hash, f.fold))
        assert docs[s.name]["full_fold_epochs"] == docs[s.name]["fold_epochs"] == want
        best = max(s.trials[:20], key=lambda t: (t.value, -t.number))
        assert docs[s.name]["full_choice"] == best.number


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope",), "no study 'nope' (it has corpus-"),
        (("--trials", 51), "has 50 trials: cannot replay its first 51"),
        (("--trials", 0), "Invalid value for '--trials'"),
    ],
)
def test_replay_bad_corpus_requests_are_one_line(args, message):
    out = _cli("replay", "--corpus", ROOT / TABLE["corpus"], *args, code=2).output
    assert message in " ".join(out.split())
