"""Confidence intervals against scipy's Student-t interval."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mlrc.protocol.stats import confidence_interval


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
