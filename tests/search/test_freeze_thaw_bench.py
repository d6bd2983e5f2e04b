"""``bench/freeze_thaw.py``: its search stage takes the decisions ``mlrc replay`` takes (the
product's replay, through Optuna), and its thaw stops only when no paused trial can still beat
the incumbent under the recommended rule, a resumed fold going on from where it paused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import freeze_thaw as ft  # noqa: E402

from mlrc.config.schema import StopSpec  # noqa: E402
from mlrc.search import replay as rp  # noqa: E402
from mlrc.search.pruning import Rules, best_fold_values, fold_stop, incumbent_of  # noqa: E402

AGGRESSIVE = StopSpec(quantile=0.5, slack=0.0, startup=1)


@pytest.fixture(scope="module")
def studies():
    return [rp.first_trials(s, 30) for s in rp.read_corpus(ft.CORPUS)[1]]


@pytest.mark.parametrize("spec", [AGGRESSIVE, StopSpec()], ids=["aggressive", "recommended"])
def test_the_search_stage_takes_mlrc_replays_decisions(studies, spec):
    for st in studies:
        s = ft.search_stage(st, spec, None)
        r = rp.replay(st, Rules(stop=spec))
        by = {t.number: t for t in st.trials}
        assert s.spent == r.fold_epochs, st.name
        assert sorted(s.paused) == sorted(n for n, d in r.decisions.items() if d == "pruned")
        assert {n: (by[n].folds[i].fold, e) for n, (i, e, *_) in s.paused.items()} == (
            r.stopped_at
        ), st.name


@pytest.mark.parametrize("bound", ["end", "paused"])
def test_the_thaw_leaves_no_paused_trial_that_could_beat_the_incumbent(studies, bound):
    for st in studies:
        s = ft.search_stage(st, AGGRESSIVE, None)
        paused_before = set(s.paused)
        assert paused_before, st.name  # the aggressive rule pauses some trials
        ft.thaw(s, StopSpec(), bound)
        by = {t.number: t for t in st.trials}
        n = st.n_folds
        full = {k: v for k, v in s.folds.items() if len(v) == n}
        inc = incumbent_of(s.complete, full)
        for number, (i, e, done, best, snap) in s.paused.items():
            curves, bests = (
                (s.curves[: snap[0]], snap[1])
                if bound == "paused"
                else (s.curves, best_fold_values(s.folds.values()))
            )
            rule = fold_stop(
                StopSpec(), by[number].folds[i].fold, n, done, inc, len(s.complete),
                curves, st.epochs, bests,
            )  # fmt: skip
            assert rule.margin(e, best) < 0, (st.name, number)
        for number, _, value in s.complete:  # a completed trial spent its whole recorded folds
            t = by[number]
            assert value == t.value
            assert all(s.trained[(t.params_hash, f.fold)] == f.epochs for f in t.folds)
        assert set(s.paused) <= paused_before  # the thaw pauses nothing new
        assert s.spent <= rp.replay(st, Rules()).full_fold_epochs


def test_without_a_search_stage_rule_nothing_pauses_and_everything_is_spent(studies):
    st = studies[0]
    s = ft.search_stage(st, None, None)
    assert not s.paused
    assert s.spent == rp.replay(st, Rules()).full_fold_epochs
