"""Kim & Nelson's fully sequential test (mlrc.protocol.sequential) against the paper's formulas
written out here, numpy's variances and a simulation of its error guarantee."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlrc.protocol.sequential import eliminated, h_squared, pooled_variance, region


def test_h_squared_is_kims_constant_and_tends_to_its_limit():
    # KN (2001): h² = (n0 − 1)·[(2α/(k − 1))^(−2/(n0 − 1)) − 1], here k = 2 systems
    for alpha, n0 in [(0.05, 10), (0.01, 4), (0.2, 100)]:
        want = (n0 - 1) * ((2 * alpha / (2 - 1)) ** (-2 / (n0 - 1)) - 1)
        assert h_squared(alpha, n0 - 1) == pytest.approx(want, rel=1e-12)
    # df → ∞: −2 ln(2α), approached from above (a small df is more cautious)
    for alpha in (0.05, 0.01):
        limit = -2 * math.log(2 * alpha)
        assert h_squared(alpha, 10**7) == pytest.approx(limit, rel=1e-5)
        assert h_squared(alpha, 3) > h_squared(alpha, 30) > limit


def test_region_is_the_triangle():
    s2, delta, alpha, df = 0.03**2, 0.04, 0.05, 12
    h2 = h_squared(alpha, df)
    for r in range(1, 6):
        assert region(r, s2, delta, alpha, df) == pytest.approx(
            max(0.0, h2 * s2 / (2 * delta) - delta * r / 2), abs=1e-15
        )
    # the region closes: after enough stages any sum below 0 eliminates
    closed = math.ceil(h2 * s2 / delta**2)
    assert region(closed, s2, delta, alpha, df) == 0.0
    assert eliminated([-1e-9] * closed, s2, delta, alpha, df)
    assert not eliminated([0.0] * closed, s2, delta, alpha, df)


def test_a_clearly_bad_first_fold_is_eliminated():
    s2, delta, alpha, df = 0.03**2, 0.04, 0.05, 12
    first = region(1, s2, delta, alpha, df)
    assert first > delta  # after one fold only a trial far below the incumbent leaves
    assert eliminated([-first - 1e-6], s2, delta, alpha, df)
    assert not eliminated([-first + 1e-6], s2, delta, alpha, df)


def test_pooled_variance_is_numpys():
    rng = np.random.default_rng(0)
    groups = [rng.normal(size=n).tolist() for n in (4, 4, 3, 1, 2)]
    ss = sum(np.var(g, ddof=0) * len(g) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    s2, got_df = pooled_variance(groups)
    assert got_df == df == 9 and s2 == pytest.approx(ss / df, rel=1e-12)
    # one group: its sample variance
    assert pooled_variance([groups[0]])[0] == pytest.approx(np.var(groups[0], ddof=1))
    s2, df = pooled_variance([[1.0], []])
    assert math.isnan(s2) and df == 0


def test_a_trial_delta_better_is_eliminated_at_most_alpha_of_the_time():
    """KN's guarantee for two systems: when one is better by δ or more, it is eliminated with
    probability ≤ α (a trial within δ may be: the choice then loses at most δ). Simulated:
    normal paired differences with mean +δ, s² estimated with 30 degrees of freedom, 4
    stages (folds); a tie, for contrast, is eliminated more often."""
    rng = np.random.default_rng(1)
    sigma, delta, alpha, df, stages, n = 0.03, 0.02, 0.05, 30, 4, 20000

    def rate(mean: float) -> float:
        wrong = 0
        for _ in range(n):
            s2 = sigma**2 * rng.chisquare(df) / df
            d = rng.normal(mean, sigma, size=stages)
            wrong += any(eliminated(d[:r], s2, delta, alpha, df) for r in range(1, stages + 1))
        return wrong / n

    better = rate(delta)
    assert better <= alpha
    assert rate(0.0) > better


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: h_squared(0.5, 3), "alpha must be in (0, 0.5)"),
        (lambda: h_squared(0.05, 0), "df must be ≥ 1"),
        (lambda: region(1, 0.01, 0.0, 0.05, 3), "delta must be > 0"),
    ],
)
def test_bad_settings_are_refused(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()
