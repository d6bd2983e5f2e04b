"""Certifying a search-cost rule (mlrc.search.certify, ``mlrc replay --certify``): the
Clopper–Pearson bounds against scipy's binomial test, δ against numpy's pooled variance, the
tuning left out and the floor and oracle against hand-worked studies, and the command as a
user runs it on the committed corpus."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from mlrc.config.schema import StopSpec
from mlrc.protocol.stats import clopper_pearson
from mlrc.search import certify as cf
from mlrc.search import replay as rp
from mlrc.search.errors import StudyError
from mlrc.search.pruning import Rules

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "bench" / "corpus" / "cpu-omniglot-glyphs.json.gz"
GAIN = Rules(stop=StopSpec(slack=0.01, fold_slack=0.04))


@pytest.mark.parametrize(
    "k,n", [(0, 1), (1, 1), (0, 6), (6, 6), (2, 4), (13, 24), (24, 24), (49, 50)]
)
def test_clopper_pearson_is_scipy_s_exact_one_sided_interval(k, n):
    lower, upper = clopper_pearson(k, n)
    assert lower == pytest.approx(binomtest(k, n, alternative="greater").proportion_ci().low)
    assert upper == pytest.approx(binomtest(k, n, alternative="less").proportion_ci().high)
    if k == n:  # the closed form the issue quotes: 24 of 24 → 0.88, 6 of 6 → 0.61
        assert lower == pytest.approx(0.05 ** (1 / n))


def test_clopper_pearson_refuses_impossible_counts():
    with pytest.raises(ValueError, match="0 ≤ k ≤ n"):
        clopper_pearson(5, 4)
    with pytest.raises(ValueError, match="level"):
        clopper_pearson(1, 4, level=1.0)


def _fold(fold: int, values: list[float]) -> rp.RecordedFold:
    """A complete fold validated at epochs 0, 1, …: ``values`` from epoch 1 on."""
    points = ((0, 0.0), *((e + 1, v) for e, v in enumerate(values)))
    return rp.RecordedFold(fold, "complete", max(values), points)


def _study(name: str, dataset: str, curves: list[list[float]], reseeds=()) -> rp.RecordedStudy:
    """One fold per trial; trial i's curve ``curves[i]`` (its value: the curve's best)."""
    trials = tuple(
        rp.RecordedTrial(i, {"x": i}, f"h{i}", "complete", max(c), (_fold(0, c),))
        for i, c in enumerate(curves)
    )
    return rp.RecordedStudy(
        name, "contrastive", dataset, "cpu", 1, (1, 2, 3, 4), trials, tuple(map(tuple, reseeds))
    )


def test_delta_is_the_pooled_seed_to_seed_sd_of_the_fold_means():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.02, (10, 4)), rng.normal(0.4, 0.03, (6, 4))
    c = rng.normal(0.6, 0.01, (8, 4))
    studies = [
        _study("a", "omniglot", [[0.5]], a),
        _study("b", "omniglot", [[0.5]], b),
        _study("c", "glyphs", [[0.5]], c),
        _study("d", "glyphs", [[0.5]], c[:1]),  # one reproduction: no spread of its own
        _study("e", "cars", [[0.5]]),  # none: the dataset has no δ
    ]
    got = cf.seed_spread(studies)
    ma, mb = a.mean(axis=1), b.mean(axis=1)
    pooled = np.sqrt((9 * ma.var(ddof=1) + 5 * mb.var(ddof=1)) / 14)
    assert got == pytest.approx({"omniglot": pooled, "glyphs": c.mean(axis=1).std(ddof=1)})
    with pytest.raises(StudyError, match="'cars'.*--delta"):
        cf.certify(studies, [GAIN], budgets=(1,))


def _o(study: str, dataset: str, rules: str, spent: int, within: bool) -> cf.Outcome:
    return cf.Outcome(
        study, dataset, rules, 20, spent, 100, 0.0 if within else 0.05, within, within
    )


def test_the_tuning_left_out_picks_on_the_others_and_replays_on_the_held_out():
    """Hand-worked: A costs 0.5× and always holds; B costs 0.2× and misses s2."""
    where = {"s1": "d1", "s2": "d1", "s3": "d2"}
    table = {
        rules: {s: _o(s, d, rules, spent, ok(s)) for s, d in where.items()}
        for rules, spent, ok in (
            ("none", 100, lambda s: True),
            ("A", 50, lambda s: True),
            ("B", 20, lambda s: s != "s2"),
        )
    }
    assert cf.pick({lb: list(by.values()) for lb, by in table.items()}) == "A"
    loso = cf.leave_out(table, lambda o: o.study)
    assert loso["picks"] == {"s1": "A", "s2": "B", "s3": "A"}
    assert (loso["within"], loso["studies"]) == (2, 3)
    assert loso["fold_epochs_fraction"] == pytest.approx(120 / 300)
    assert loso["within_bounds"] == pytest.approx(list(clopper_pearson(2, 3)))
    lodo = cf.leave_out(table, lambda o: o.dataset)
    assert lodo["picks"] == {"d1": "B", "d2": "A"}
    assert (lodo["within"], lodo["fold_epochs_fraction"]) == (2, pytest.approx(90 / 300))
    assert lodo["worst_regret"] == pytest.approx(0.05)


def test_the_oracle_and_the_floor_of_a_hand_worked_study():
    """Values 0.5, 0.6, 0.595, 0.3 over 4, 3, 2, 4 epochs, δ 0.01. Oracle: complete 0.595
    (within δ, 2 epochs), 1 epoch of each other: 5 of 13. Floor: 0.5 (first) and 0.6 (> 0.5 +
    δ) complete, 1 epoch of each other: 9 of 13."""
    s = _study("s", "omniglot", [[0.4, 0.5, 0.5, 0.5], [0.5, 0.6, 0.6], [0.595, 0.59], [0.3] * 4])
    got = cf.bounds([s], 4, {"omniglot": 0.01})
    assert got == pytest.approx({"oracle": 5 / 13, "floor": 9 / 13})


def test_trials_needed_is_the_first_trial_within_delta_of_the_best_of_n():
    """Values 0.5, 0.6, 0.595, 0.3, 0.7: within 0.01 of the best of 4 (0.6) first at trial 2;
    of the best of 5 (0.7) at trial 5; within 0.2 of 0.7 at trial 1 (0.5 ≥ 0.7 − 0.2)."""
    s = _study("s", "omniglot", [[0.5], [0.6], [0.595], [0.3], [0.7]])
    assert cf.trials_needed([s], {"omniglot": 0.01}, 4) == {"s": 2}
    assert cf.trials_needed([s], {"omniglot": 0.01}, 5) == {"s": 5}
    assert cf.trials_needed([s], {"omniglot": 0.2}, 5) == {"s": 1}


def test_within_delta_is_the_regret_against_the_best_of_the_first_n_trials():
    """On the committed corpus: δ = 0 within is the exact choice (no tied values there), a
    huge δ holds everywhere, and within counts grow with δ; each study's regret is the best of
    its first N trials minus the chosen one's recorded value."""
    _, studies = rp.read_corpus(CORPUS)
    counts = []
    for delta in (0.0, 0.002, 0.005, 1.0):
        outs = [cf.outcome(s, GAIN, 20, delta) for s in studies]
        counts.append(sum(o.within for o in outs))
        if delta == 0.0:
            assert [o.within for o in outs] == [o.same_choice for o in outs]
    assert counts == sorted(counts) and counts[-1] == len(studies)
    for s in studies:
        r = rp.replay(rp.first_trials(s, 20), GAIN)
        best = max(t.value for t in s.trials[:20] if t.value is not None)
        chosen = next(t.value for t in s.trials if t.number == r.choice)
        assert cf.outcome(s, GAIN, 20, 0.0).regret == pytest.approx(best - chosen)


def test_a_permuted_study_has_the_same_trials_and_folds_in_another_order():
    _, studies = rp.read_corpus(CORPUS)
    s = studies[0]
    p = cf.permuted(s, random.Random(3))
    assert p != s and cf.permuted(s, random.Random(3)) == p
    assert sorted(t.number for t in p.trials) == sorted(t.number for t in s.trials)
    for t in p.trials:
        orig = next(u for u in s.trials if u.number == t.number)
        assert sorted(t.folds, key=lambda f: f.fold) == list(orig.folds)
    assert replace(p, trials=s.trials) == s


def _mlrc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlrc.cli", "replay", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_replay_certify_as_a_user_runs_it():
    rule = "none+gain:slack=0.01,fold_slack=0.04"
    done = _mlrc("--corpus", str(CORPUS), "--certify", "--rule", rule, "--budgets", "50,20",
                 "--delta", "0.005", "--permutations", "2", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert list(out["budgets"]) == ["20", "50"] and out["delta"]["glyphs"] == 0.005
    at = out["budgets"]["50"]
    # the in-fold rule keeps every 50-trial choice of the corpus for 0.56× (performance.md)
    assert at["rules"][GAIN.label()]["fold_epochs_fraction"] == pytest.approx(0.56, abs=0.005)
    assert at["rules"][Rules().label()]["fold_epochs_fraction"] == 1.0
    assert set(at["leave_one_study_out"]["picks"]) == set(out["studies"])
    assert set(at["leave_one_dataset_out"]["picks"]) == {"omniglot", "glyphs"}
    assert at["oracle"] <= at["floor"] < 1
    assert out["robustness"]["permutations"] == 2 and "20" in out["robustness"]


@pytest.mark.parametrize(
    "args,line",
    [
        (["--budgets", "20,x"], "--budgets 20,x: expected whole numbers separated by commas"),
        (["--budgets", "60", "--delta", "0.01"], "has fewer than 60 trials"),
        ([], "has 2 or more reproductions to measure δ"),  # the old corpus has no reseeds
        (["--rule", "median:p=0.3", "--delta", "0.01"], "median has no setting 'p'"),
    ],
)
def test_replay_certify_refuses_bad_input_in_one_line(args, line):
    done = _mlrc("--corpus", str(CORPUS), "--certify", *args)
    assert done.returncode != 0
    assert line in done.stderr.strip().splitlines()[-1], done.stderr
