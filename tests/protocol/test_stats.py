"""Confidence intervals against scipy's Student-t interval."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mlrc.protocol.stats import confidence_interval, separated_mean


@pytest.mark.parametrize("n", [2, 3, 10, 40])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_matches_scipy_t_interval(n, level):
    x = np.random.default_rng(n).normal(0.4, 0.02, n)
    mean, hw = confidence_interval(x, level=level)
    low, high = stats.t.interval(level, n - 1, loc=x.mean(), scale=stats.sem(x))
    assert mean == pytest.approx(x.mean(), abs=1e-15)
    assert mean - hw == pytest.approx(low, abs=1e-12)
    assert mean + hw == pytest.approx(high, abs=1e-12)


def test_known_value():
    # 10 reproductions, s = 1: t(0.975, 9) = 2.262157 (printed t tables) → half-width 2.262157/√10
    x = np.array([-1.5, -1, -0.5, 0, 0, 0, 0, 0.5, 1, 1.5])
    x = x / x.std(ddof=1)
    _, hw = confidence_interval(x)
    assert hw == pytest.approx(2.262157 / np.sqrt(10), rel=1e-6)


def test_constant_values_have_zero_width():
    assert confidence_interval([0.5, 0.5, 0.5]) == (0.5, 0.0)


@pytest.mark.parametrize(
    ("values", "level", "message"),
    [
        ([0.3], 0.95, "at least 2 reproductions, got 1"),
        ([], 0.95, "at least 2 reproductions, got 0"),
        ([0.1, float("nan")], 0.95, "non-finite"),
        ([0.1, 0.2], 1.5, "confidence level must be in"),
    ],
)
def test_bad_input_is_a_clear_error(values, level, message):
    with pytest.raises(ValueError, match=message):
        confidence_interval(values, level=level)


def test_separated_mean_leaves_out_untrained_folds_as_the_reference_aggregator():
    """The reference's MeanAggregator adds a fold's TRAINED value only when the fold has a best
    epoch outside (-1, 0) (its aggregators/base_aggregator.py: ``if len(accuracies) > 0``)."""
    folds = [
        {"map_at_r": 0.1, "best_epoch": 0.0},
        {"map_at_r": 0.3, "best_epoch": 4.0},
        {"map_at_r": 0.5, "best_epoch": 2.0},
        {"map_at_r": 0.2, "best_epoch": 0.0},
    ]
    epochs = [int(f["best_epoch"]) for f in folds]
    means, kept = separated_mean(folds, epochs)
    reference = [f["map_at_r"] for f in folds if f["best_epoch"] not in (-1, 0)]
    assert kept == [1, 2]
    assert means["map_at_r"] == pytest.approx(sum(reference) / len(reference))
    assert means["best_epoch"] == 3.0


def test_separated_mean_of_all_untrained_folds_averages_them_all():
    folds = [{"map_at_r": 0.1}, {"map_at_r": 0.3}]
    means, kept = separated_mean(folds, [0, 0])
    assert kept == [0, 1] and means["map_at_r"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="2 fold results for 1 best epochs"):
        separated_mean(folds, [0])
