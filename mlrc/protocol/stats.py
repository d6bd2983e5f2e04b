"""Confidence intervals over reproductions, as the reality check reports them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confidence_interval(
    values: Sequence[float] | np.ndarray, level: float = 0.95
) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t interval over n reproductions.

    half_width = t(0.5 + level/2, n − 1) · s / √n, with s the sample standard deviation (ddof = 1).
    Units are those of ``values`` (fractions in, fractions out). Raises ``ValueError`` for n < 2
    (no spread can be estimated from one reproduction), for non-finite values and for a level
    outside (0, 1).
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    if x.size < 2:
        raise ValueError(f"a confidence interval needs at least 2 reproductions, got {x.size}")
    if not np.isfinite(x).all():
        raise ValueError("confidence interval over non-finite values")
    from scipy import stats  # here, not at import: scipy.stats takes ~1 s to import

    n = x.size
    s = x.std(ddof=1)
    half_width = float(stats.t.ppf(0.5 + level / 2, n - 1) * s / np.sqrt(n))
    return float(x.mean()), half_width


def separated_mean(
    fold_metrics: Sequence[dict[str, float]], best_epochs: Sequence[int]
) -> tuple[dict[str, float], list[int]]:
    """The separated (128-D) row of a reproduction: each metric's mean over its fold models,
    leaving out a fold whose model is the untrained one (best epoch 0), as the reference's
    ``MeanAggregator`` does (``get_accuracies_of_best_epoch(..., ignore_epoch=(-1, 0))`` finds no
    trained epoch for such a fold, so it adds no value). Returns (means, the folds averaged).

    When every fold's best epoch is 0 the reference records no trained row at all; mlrc then
    averages all folds (its caller says so) rather than leave the reproduction without a row.
    """
    if len(fold_metrics) != len(best_epochs) or not fold_metrics:
        raise ValueError(f"{len(fold_metrics)} fold results for {len(best_epochs)} best epochs")
    kept = [i for i, e in enumerate(best_epochs) if e != 0] or list(range(len(best_epochs)))
    keys = fold_metrics[0].keys()
    means = {k: float(np.mean([fold_metrics[i][k] for i in kept])) for k in keys}
    return means, kept


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """One-sided exact (Clopper–Pearson) bounds on a binomial proportion from k successes in n:
    (lower, upper), each at ``level`` on its own side: P(p < lower) ≤ 1 − level.

    lower = Beta⁻¹(1 − level; k, n − k + 1) (0 when k = 0), upper = Beta⁻¹(level; k + 1, n − k)
    (1 when k = n). With k = n the lower bound is (1 − level)^(1/n): 24 of 24 gives 0.883.
    """
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 ≤ k ≤ n and n ≥ 1 (got k={k}, n={n})")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    from scipy import stats

    alpha = 1.0 - level
    lower = 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))
    upper = 1.0 if k == n else float(stats.beta.ppf(level, k + 1, n - k))
    return lower, upper
