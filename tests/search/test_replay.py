"""Replay (``mlrc replay``) against a live pruned run of the same study, and the in-fold
stopping rule against its formula computed by hand.

The live-vs-replay test trains for real (glyphs, a tiny cpu preset): an unpruned study first;
then the same trials (enqueued in the same order, so the same parameters, fold seeds and
curves) searched live with a pruner and ``search.stop``. Replaying the unpruned study under the
same rules must take the same decision for every trial, spend the same fold-epochs and stop the
same folds at the same epochs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from mlrc import search as S
from mlrc import store
from mlrc.cli import app
from mlrc.config import load_study
from mlrc.config.schema import StopSpec
from mlrc.protocol.stopping import FoldStop, Incumbent, later_gains
from mlrc.search import replay as rp
from mlrc.search.errors import StudyError
from mlrc.search.pruning import Rules

runner = CliRunner()
TRIALS = 7
OVERRIDES = {"max_epochs": 5, "iterations_per_epoch": 2, "patience": {"default": 1}, "folds": 3}
RULES = {
    "pruner": "wilcoxon",
    "prune_p": 0.3,
    "stop": {"quantile": 0.5, "slack": 0.0, "fold_slack": 0.01, "startup": 1},
}


def _study_file(tmp_path, name: str, search: dict) -> object:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": TRIALS, "sampler": "tpe", "seed": 3, **search},
        "overrides": OVERRIDES,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_study(path)


def _run(tmp_path, name: str, url: str, search: dict) -> None:
    with S.open_study(
        _study_file(tmp_path, name, search), url, tmp_path / "art", progress=False
    ) as ctx:
        S.run_search(ctx)


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    url = f"sqlite:///{tmp / 'replay.db'}"
    _run(tmp, "full", url, {})
    engine = store.connect(url)
    full = rp.recorded_study(engine, "full")
    enqueue = [t.params for t in full.trials]  # the same trials, in the same order
    _run(tmp, "live", url, {**RULES, "enqueue": enqueue})
    return engine, full


def test_replay_takes_the_live_runs_decisions(studies):
    engine, full = studies
    sid = store.studies.study_named(engine, "live").id
    live = {t.number: t for t in store.trials.study_trials(engine, sid)}
    curves = store.curves.search_curves(engine, sid)
    res = rp.replay(full, Rules("wilcoxon", prune_p=0.3, stop=StopSpec(**RULES["stop"])))
    assert res.decisions == {n: t.state for n, t in live.items()}
    assert res.pruned >= 1 and res.stopped >= 1  # the rules did something in this study
    assert res.fold_epochs == sum(max(e for e, _ in c.points) for c in curves)
    assert res.fold_epochs < res.full_fold_epochs
    stopped = sorted(
        (c.params_hash, c.fold, max(e for e, _ in c.points))
        for c in curves
        if c.status == "stopped"
    )
    assert len(stopped) == res.stopped
    # a pruned trial's reason says why; a stopped fold's says where
    reasons = [t.reason for t in live.values() if t.state == "pruned"]
    assert all(r.startswith("pruned") for r in reasons)
    assert any("stopped at epoch" in r and "search.stop" in r for r in reasons)
    # the choice: the best complete trial of the live run
    done = [(t.value, -t.number) for t in live.values() if t.state == "complete"]
    assert res.choice == -max(done)[1]


def test_no_rules_spend_everything_and_choose_the_full_choice(studies):
    _, full = studies
    res = rp.replay(full, Rules())
    assert res.fold_epochs == res.full_fold_epochs and res.pruned == 0
    assert res.same_choice and res.regret == 0.0
    best = max(full.trials, key=lambda t: (t.value, -t.number))
    assert res.full_choice == best.number


def test_corpus_file_round_trip(studies, tmp_path):
    _, full = studies
    path = rp.write_corpus([full], tmp_path / "c.json.gz", {"machine": "here"})
    about, back = rp.read_corpus(path)
    assert about == {"machine": "here"} and back == [full]
    rules = Rules("wilcoxon", prune_p=0.3, stop=StopSpec(quantile=0.5))
    assert rp.replay(back[0], rules) == rp.replay(full, rules)


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def test_replay_refuses_pruned_and_unfinished_studies(studies):
    engine, _ = studies
    with pytest.raises(StudyError, match="searched with pruning.*replay needs an unpruned study"):
        rp.recorded_study(engine, "live")
    with pytest.raises(StudyError, match="no study named 'nope'"):
        rp.recorded_study(engine, "nope")
    url = str(engine.url)
    out = cli("replay", "live", "--storage", url, "--pruner", "median", code=2)
    assert out.output.count("\n") == 1 and "replay needs an unpruned study" in out.output
    out = cli(
        "replay",
        "full",
        "--storage",
        url,
        "--pruner",
        "median",
        "--stop",
        "gain:quantile=0.5",
        "--json",
    )
    doc = json.loads(out.stdout)
    assert {"study", "fold_epochs_fraction", "same_choice", "regret"} <= set(doc)
    assert doc["study"] == "full" and 0 < doc["fold_epochs_fraction"] <= 1


def test_unfinished_study_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'u.db'}"
    resolved = _study_file(tmp_path, "half", {"trials": 1})
    with S.open_study(resolved, url, tmp_path / "art", progress=False) as ctx:
        S.run_search(ctx)
    engine = store.connect(url)
    grown = _study_file(tmp_path, "half", {"trials": 2})
    with S.open_study(grown, url, tmp_path / "art", progress=False):
        pass  # the budget grows to 2: one trial done
    with pytest.raises(StudyError, match=r"not finished \(1 of 2 trials done\)"):
        rp.recorded_study(engine, "half")


@pytest.mark.parametrize(
    ("pruner", "stop", "message"),
    [
        ("medain", None, "unknown pruner 'medain'; did you mean 'median'?"),
        ("median:p=0.1", None, "median has no setting 'p'"),
        ("wilcoxon:p=2", None, "p must be in (0, 1]"),
        ("wilcoxon:p=x", None, "p: not a number ('x')"),
        ("sequential:alpha=0.5", None, "alpha must be in (0, 0.5) (got 0.5)"),
        ("sequential:delta=0", None, "delta must be in (0, 1] (got 0)"),
        ("sequential:p=0.1", None, "sequential has no setting 'p'"),
        ("sequential:delt=0.1", None, "did you mean 'delta'?"),
        ("forgiving:p=0.1", None, "forgiving has no setting 'p'"),
        ("none", "gain:quantile=0", "quantile: Input should be greater than 0"),
        ("none", "gain:slak=1", "gain has no setting 'slak'; did you mean 'slack'?"),
        ("none", "gain:fold_slak=1", "did you mean 'fold_slack'?"),
        ("none", "gain:fold_slack=2", "fold_slack: Input should be less than or equal to 1"),
        ("none", "gain:quantile", "expected NAME:key=value"),
        ("none", "gian", "rule"),
    ],
)
def test_bad_rule_specs_are_one_line(pruner, stop, message):
    with pytest.raises(StudyError) as e:
        rp.parse_rules(pruner, stop)
    assert message in str(e.value) and "\n" not in str(e.value)


# --- the stopping rule, against a hand computation ------------------------------------------


def _naive_gain(curves, e, q):
    gains = []
    for c in curves:
        upto = [v for t, v in c if t <= e]
        if upto:
            gains.append(max(v for _, v in c) - max(upto))
    return None if not gains else float(np.quantile(gains, q))


def test_later_gains_match_a_naive_loop():
    rng = np.random.default_rng(0)
    curves = []
    for _ in range(30):
        n = int(rng.integers(1, 9))
        start = int(rng.integers(1, 3))
        curves.append([(start + i, float(v)) for i, v in enumerate(rng.random(n))])
    for q in (0.5, 0.9, 1.0):
        g = later_gains(curves, range(1, 12), q)
        for e in range(1, 12):
            want = _naive_gain(curves, e, q)
            assert (
                (e not in g) if want is None else math.isclose(g[e], want, rel_tol=0, abs_tol=1e-15)
            )


def test_fold_stop_is_the_papers_bound():
    inc = Incumbent(4, 0.5, {0: 0.4, 1: 0.6, 2: 0.5})
    stop = FoldStop(fold=1, ahead=1 * 0.02, done={0: 0.45}, incumbent=inc, gains={3: 0.05})
    # (0.45 − 0.4) + (b + 0.05 − 0.6) + 1·0.02 < 0  ⇔  b < 0.48
    assert stop.reason(3, 0.479) is not None and stop.reason(3, 0.481) is None
    assert stop.reason(2, 0.0) is None  # no later gain known at epoch 2: no decision
    assert "stopped at epoch 3 of fold 1" in stop.reason(3, 0.2)
    # ε, the fold slack, lifts the bound of the fold that trains: b + 0.05 + 0.01
    lifted = FoldStop(1, 0.02, {0: 0.45}, inc, {3: 0.05}, fold_slack=0.01)
    assert lifted.reason(3, 0.469) is not None and lifted.reason(3, 0.471) is None
    assert "+ later gain 0.0500 + slack 0.01 cannot lift" in lifted.reason(3, 0.2)


def _naive_wilcoxon(study, p_threshold):
    """Decisions of Wilcoxon pruning by hand (scipy's test, Optuna's documented rule: after
    fold k ≥ 2 of n, prune when p < threshold unless the trial's mean so far is not below the
    best trial's on the same folds)."""
    from scipy import stats

    best, out = None, {}
    for t in study.trials:
        folds = [f for f in t.folds if f.status == "complete"]
        how = "complete" if t.state == "complete" else "failed"
        for k in range(2, len(folds) + 1):
            if best is None or k >= study.n_folds:
                break
            v = np.array([f.objective for f in folds[:k]])
            b = np.array([best[1][f.fold] for f in folds[:k]])
            p = stats.wilcoxon(v - b, alternative="less", zero_method="zsplit").pvalue
            if p < p_threshold and not v.mean() >= b.mean():
                how = "pruned"
                break
        out[t.number] = how
        if how == "complete" and (best is None or t.value > best[0]):
            best = (t.value, {f.fold: f.objective for f in t.folds})
    return out


def test_wilcoxon_replay_matches_a_hand_computation(studies):
    _, full = studies
    res = rp.replay(full, Rules("wilcoxon", prune_p=0.3))
    assert res.decisions == _naive_wilcoxon(full, 0.3)
    assert res.stopped == 0


def test_status_names_the_rules_and_their_measured_risk(studies):
    engine, _ = studies
    out = cli("study", "status", "live", "--storage", str(engine.url)).output
    line = next(x for x in out.splitlines() if x.startswith("pruning:"))
    label = Rules("wilcoxon", prune_p=0.3, stop=StopSpec(**RULES["stop"])).label()
    assert line.startswith(f"pruning: {label} (not the protocol's search); ")
    settings = store.studies.study_named(engine, "live").settings
    risk = settings["pruning_risk"]
    assert risk["rules"] == label
    if risk["measured"]:  # a rule of the tuned grid: its replay figures on the corpus
        assert f"{risk['fold_epochs_fraction']:.2f}× the fold-epochs" in line
    else:
        assert "risk not measured on the corpus" in line
    full = store.studies.study_named(engine, "full").settings
    assert "pruning_risk" not in full  # an unpruned study carries none


def test_replay_reads_a_postgresql_store(tmp_path, fresh_database):
    resolved = _study_file(tmp_path, "pg", {"trials": 2})
    with S.open_study(resolved, fresh_database, tmp_path / "art", progress=False) as ctx:
        S.run_search(ctx)
    out = cli("replay", "pg", "--storage", fresh_database, "--pruner", "wilcoxon", "--json")
    doc = json.loads(out.output)
    engine = store.connect(fresh_database)
    curves = store.curves.search_curves(engine, store.studies.study_named(engine, "pg").id)
    assert doc["full_fold_epochs"] == sum(max(e for e, _ in c.points) for c in curves)
    assert doc["same_choice"] and doc["study"] == "pg"


def _synthetic_study() -> rp.RecordedStudy:
    """Three complete trials of two folds (epochs 1–4, one ended on patience at 3), no
    training: what the replay hooks are checked on."""

    def fold(j: int, vals: list[float]) -> rp.RecordedFold:
        pts = ((0, 0.1), *((e + 1, v) for e, v in enumerate(vals)))
        return rp.RecordedFold(j, "complete", max(vals), pts)

    curves = {
        0: ([0.2, 0.3, 0.4, 0.5], [0.2, 0.35, 0.45, 0.5]),
        1: ([0.1, 0.15, 0.12], [0.2, 0.25, 0.3, 0.3]),
        2: ([0.3, 0.2, 0.25, 0.6], [0.3, 0.4, 0.5, 0.55]),
    }
    trials = tuple(
        rp.RecordedTrial(
            n, {"x": n}, f"h{n}", "complete", (max(a) + max(b)) / 2, (fold(0, a), fold(1, b))
        )
        for n, (a, b) in curves.items()
    )
    return rp.RecordedStudy("syn", "contrastive", "glyphs", "cpu", 2, (1, 2, 3, 4), trials)


def test_replay_hook_spends_what_a_hand_count_says():
    """A rule given through ``stop_with`` (stop at epoch 2 wherever the fold has an earlier
    complete curve) ends trials 1 and 2 at epoch 2 of fold 0: the per-trial fold-epochs, the
    stops and the curves the hook saw are those counted by hand."""
    study, seen = _synthetic_study(), []

    class AtTwo:
        def reason(self, epoch: int, best: float) -> str | None:
            return "stop" if epoch == 2 else None

    def hook(base, fold, same):
        seen.append((fold, [list(c) for c in same]))
        return AtTwo() if same else None

    res = rp.replay(study, Rules(), hook)
    assert res.decisions == {0: "complete", 1: "pruned", 2: "pruned"}
    assert res.trial_epochs == {0: 8, 1: 2, 2: 2} and res.fold_epochs == 12
    assert res.stopped_at == {1: (0, 2), 2: (0, 2)} and res.stopped == 2
    assert res.full_fold_epochs == 8 + 7 + 8 and res.choice == 0 and res.full_choice == 2
    t0 = [
        [(e + 1, v) for e, v in enumerate(a)]
        for a in ([0.2, 0.3, 0.4, 0.5], [0.2, 0.35, 0.45, 0.5])
    ]
    assert seen == [(0, []), (1, []), (0, [t0[0]]), (0, [t0[0]])]
    assert rp.replay(study, Rules()).trial_epochs == {0: 8, 1: 7, 2: 8}  # no rule: everything


# --- the sequential pruner (#42): replay against the formula, and against a live run --------

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "corpus" / "cpu-reality-check.json.gz"


def _naive_sequential(study, delta: float, alpha: float, startup: int) -> dict[int, str]:
    """Decisions of the sequential pruner by hand, in the recorded order: Kim & Nelson's region
    −max(0, h² s²/(2δ) − δr/2) for the sum of the paired fold differences against the best
    complete trial, h² = df·((2α)^(−2/df) − 1), s² pooled over the 5 next-best complete
    trials with every fold (each trial's differences around their own mean)."""
    complete, out = [], {}  # complete: (number, value, {fold: value}) as the replay ends them
    for t in study.trials:
        folds = []
        for f in t.folds:
            if f.status != "complete" or f.objective is None:
                break
            folds.append(f)
        how = "complete" if t.state == "complete" else "failed"
        full = sorted(
            (c for c in complete if len(c[2]) == study.n_folds), key=lambda c: (-c[1], c[0])
        )
        if len(complete) >= max(2, startup) and full:
            inc = full[0][2]
            groups = [[c[2][k] - inc[k] for k in sorted(c[2])] for c in full[1:6]]
            df = sum(len(g) - 1 for g in groups)
            ss = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in groups)
            for r in range(1, min(len(folds), study.n_folds - 1) + 1) if df else ():
                h2 = df * ((2 * alpha) ** (-2 / df) - 1)
                total = sum(f.objective - inc[f.fold] for f in folds[:r])
                if total < -max(0.0, h2 * (ss / df) / (2 * delta) - delta * r / 2):
                    how = "pruned"
                    break
        out[t.number] = how
        if how == "complete" and t.value is not None:
            complete.append((t.number, t.value, {f.fold: f.objective for f in folds}))
    return out


def test_sequential_replay_matches_a_hand_computation_on_the_corpus():
    _, recorded = rp.read_corpus(CORPUS)
    pruned = 0
    for delta, alpha, startup in [(0.04, 0.05, 5), (0.02, 0.2, 3)]:
        rules = Rules("sequential", startup, prune_delta=delta, prune_alpha=alpha)
        for study in recorded:
            res = rp.replay(study, rules)
            assert res.decisions == _naive_sequential(study, delta, alpha, startup), study.name
            pruned += res.pruned
    assert pruned > 50  # the rule prunes on this corpus: the comparison is not of two no-ops


def test_a_live_sequential_study_takes_the_replays_decisions(studies, tmp_path):
    engine, full = studies
    url = str(engine.url)
    search = {"pruner": "sequential", "prune_delta": 0.02, "prune_alpha": 0.2, "prune_startup": 2}
    _run(tmp_path, "live-seq", url, {**search, "enqueue": [t.params for t in full.trials]})
    sid = store.studies.study_named(engine, "live-seq").id
    live = {t.number: t for t in store.trials.study_trials(engine, sid)}
    res = rp.replay(full, Rules("sequential", 2, prune_delta=0.02, prune_alpha=0.2))
    assert res.decisions == {n: t.state for n, t in live.items()}
    assert res.decisions == _naive_sequential(full, 0.02, 0.2, 2)
    assert "pruned" in res.decisions.values()  # the rule acted in this study
    for t in live.values():
        if t.state == "pruned":
            assert t.reason.startswith("pruned after ") and "sequential test, α = 0.2" in t.reason


def _naive_forgiving(study, startup: int) -> dict[int, str]:
    """Bergman, Purucker & Hutter's forgiving rule by hand, in the recorded order: after fold
    r < n, prune when the mean of the trial's first r fold values is below the worst fold value
    of the best complete trial (with every fold)."""
    complete, out = [], {}
    for t in study.trials:
        folds = []
        for f in t.folds:
            if f.status != "complete" or f.objective is None:
                break
            folds.append(f.objective)
        how = "complete" if t.state == "complete" else "failed"
        full = [c for c in complete if len(c[2]) == study.n_folds]
        if len(complete) >= max(1, startup) and full:
            worst = min(max(full, key=lambda c: (c[1], -c[0]))[2])
            if any(
                np.mean(folds[:r]) < worst for r in range(1, min(len(folds), study.n_folds - 1) + 1)
            ):
                how = "pruned"
        out[t.number] = how
        if how == "complete" and t.value is not None:
            complete.append((t.number, t.value, folds))
    return out


def test_forgiving_replay_matches_a_hand_computation_on_the_corpus():
    _, recorded = rp.read_corpus(CORPUS)
    pruned = 0
    for startup in (1, 5):
        for study in recorded:
            res = rp.replay(study, Rules("forgiving", startup))
            assert res.decisions == _naive_forgiving(study, startup), study.name
            pruned += res.pruned
    assert pruned > 50
