"""mlrc.store.trials.top_trials, a warm start's source: the k best complete trials by value
(the lower number on a tie), without failed, running or scored-0 (non-finite) trials; checked
against a plain sort of the trials written."""

from __future__ import annotations

from mlrc import store
from mlrc.store import studies, trials

# number: (state, value, reason)
WRITTEN = {
    0: ("complete", 0.3, None),
    1: ("complete", 0.5, None),
    2: ("complete", 0.5, None),  # tied with 1: after it
    3: ("failed", None, "unreadable image"),
    4: ("complete", 0.0, "non-finite loss at iteration 1, fold 0"),  # scored 0: left out
    5: ("running", None, None),
    6: ("complete", 0.1, None),
}


def test_top_trials_are_the_best_complete_by_value_then_number(tmp_path):
    engine = store.connect(f"sqlite:///{tmp_path / 'store.db'}")
    study_id, _ = studies.ensure_study(
        engine, "s", dataset="glyphs", loss="contrastive", strategy=None, preset="cpu",
        config={}, code_version="t",
    )  # fmt: skip
    for number, (state, value, reason) in WRITTEN.items():
        trials.start_trial(engine, study_id, number, {"x": number}, f"h{number}")
        if state != "running":
            trials.finish_trial(engine, study_id, number, state, value, None, reason)
    eligible = [n for n, (s, v, r) in WRITTEN.items() if s == "complete" and r is None]
    expected = sorted(eligible, key=lambda n: (-WRITTEN[n][1], n))
    assert expected == [1, 2, 0, 6]
    for k in (1, 2, 3, 10):
        got = trials.top_trials(engine, study_id, k)
        assert [t.number for t in got] == expected[:k]
        assert [t.params for t in got] == [{"x": n} for n in expected[:k]]
    assert trials.best_trial(engine, study_id).number == expected[0]  # the same order as best
