"""The tidy summary of the test-result tables: per (study or baseline, mode, metric) the mean and
its 95% Student-t interval over reproductions. The marks within each (dataset, protocol) block: best
mean, best row, Welch's t-test against the column's best. A traditional study's lines
(``test_set_selection``) are Recall@K, MAP@R (in %) and its chosen epoch (in epochs, never
marked)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from mlrc.protocol import confidence_interval
from mlrc.protocol.scoring import higher_is_better
from mlrc.report.values import META_COLUMNS, SIZES, UNMARKED_METRICS

__all__ = [
    "ALPHA",
    "SAMPLES",
    "TIDY_COLUMNS",
    "summarize",
    "tidy_columns",
    "welch_p",
    "with_defaults",
]

ALPHA = 0.05
TIDY_COLUMNS = [
    "study",
    "dataset",
    "protocol",
    "protocol_fields",
    "loss",
    "strategy",
    "pruner",
    "mode",
    "metric",
    "mean",
    "half_width",
    "n",
    "low",
    "high",
    "best",
    "best_row",
    "p_value",
    "not_worse",
    "complete_trials",
    "nonfinite_trials",
    "test_set_selection",  # True: the traditional protocol, epoch chosen on the test set
    "retrieval",  # how the test stage ranked: "all vs all" or "query→gallery" (the dataset's roles)
    "failed_trials",  # trials failed with a reason (an error stopped them)
    "failures",  # each failed trial and test fold with its reason, "; "-separated
    "archived",  # True: archived by study run --force-new (NAME.old-K), never compared
    "untrained_test",  # True: every test fold kept epoch 0, the untrained model
    "warm_start",  # the study's warm start ("study X top 5 (trials 3, 7)"), "" for none
    "pruning_risk",  # a pruned study's rules' risk measured by replay on the corpus, or ""
    "fold_models",  # the study's folds: the models a separated line averages (baseline: empty)
    "embedding_size",  # one fold model's output size; a concatenated line: fold_models × it
]
# after the tidy columns when a line has it: computed after the fact from stored embeddings
AFTER_COLUMN = "after_the_fact"


def tidy_columns(summary: pd.DataFrame) -> list[str]:
    """:data:`TIDY_COLUMNS`, and :data:`AFTER_COLUMN` when a line was re-scored (``mlrc report
    --metrics``)."""
    after = AFTER_COLUMN in summary.columns and bool(summary[AFTER_COLUMN].any())
    return TIDY_COLUMNS + ([AFTER_COLUMN] if after else [])


# the line's values by reproduction (a tuple, in %): for mlrc.report.stability, never exported
SAMPLES = "reproduction_values"
_KEYS = ["study", "dataset", "protocol", "loss", "strategy", "pruner", "mode", "metric"]


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test; NaN when either side has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    from scipy import stats  # here, not at import: scipy.stats takes ~1 s to import

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def with_defaults(values: pd.DataFrame) -> pd.DataFrame:
    """``values`` with the columns :func:`~mlrc.report.values.collect` adds (a frame built by
    hand may lack them)."""
    values = values.copy()
    defaults = {
        "protocol": "",
        "baseline": False,
        "protocol_fields": "",
        "protocol_diff": "",
        "trials_budget": pd.NA,
        "complete_trials": pd.NA,
        "nonfinite_trials": pd.NA,
        "budget_history": "",
        "fold_threads": "",
        "fold_compute": "",
        "mixed_compute": "",
        "test_set_selection": False,
        "retrieval": "all vs all",
        "failed_trials": pd.NA,
        "failures": "",
        "archived": False,
        "untrained_test": False,
        "pruning_risk": "",
        "warm_start": "",
        "after_the_fact": False,
        "rescore_note": "",
        "fold_models": pd.NA,
        "embedding_size": pd.NA,
    }
    for c, v in defaults.items():
        if c not in values.columns:
            values[c] = v
    for c in ("baseline", "test_set_selection", "archived", "untrained_test", "after_the_fact"):
        values[c] = values[c].astype(bool)
    return values


def summarize(values: pd.DataFrame, level: float = 0.95, alpha: float = ALPHA) -> pd.DataFrame:
    """Tidy summary, one line per (study or baseline, mode, metric), in percent, in the order of
    ``values``: mean, CI half-width, n, low, high; ``best`` (best mean of its dataset ×
    protocol × mode × metric), ``best_row`` (the studies with their block's highest concatenated
    MAP@R), ``p_value`` (Welch's t-test against the column's best study in the block; NaN for
    that study itself and when n < 2 on either side) and ``not_worse`` (True for the best study
    and when p ≥ ``alpha``, False when p < ``alpha``, missing when p is NaN); :data:`SAMPLES`
    holds the line's values by reproduction (for :mod:`mlrc.report.stability`; not in the
    CSV/JSON lines). Exact ties: every
    study with the top mean is best (and every one with the top concatenated MAP@R a best row),
    none of them has a p-value, and another study's p is the smallest of its tests against each
    of them. Baseline lines (``baseline`` True), archived studies (``archived``) and the chosen
    epoch (:data:`UNMARKED_METRICS`) take no part: never best, no p-value. The
    :data:`META_COLUMNS` follow."""
    summary, samples = _intervals(with_defaults(values), level)
    _mark(summary, samples, alpha)
    return summary


def _intervals(values: pd.DataFrame, level: float) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """The summary's lines without marks, and each line's values (by reproduction)."""
    out, samples = [], []
    for key, g in values.groupby(_KEYS, sort=False, dropna=False):
        v = g.sort_values("reproduction")["value"].to_numpy(dtype=np.float64)
        mean, hw = confidence_interval(v, level) if len(v) >= 2 else (float(v.mean()), math.nan)
        samples.append(v)
        first = g.iloc[0]
        out.append(
            {
                **dict(zip(_KEYS, key, strict=True)),
                "mean": mean,
                "half_width": hw,
                "n": len(v),
                "low": mean - hw,
                "high": mean + hw,
                **{c: first[c] for c in META_COLUMNS},
                SAMPLES: tuple(float(x) for x in v),
            }
        )
    columns = [c for c in TIDY_COLUMNS if c in _KEYS or c in ("mean", "half_width", "n")]
    columns += ["low", "high"] + [c for c in META_COLUMNS if c not in columns] + [SAMPLES]
    summary = pd.DataFrame(out, columns=columns)
    for c in ("baseline", "test_set_selection", "archived", "untrained_test", "after_the_fact"):
        summary[c] = summary[c].astype(bool)
    for c in ("trials_budget", "complete_trials", "nonfinite_trials", "failed_trials", *SIZES):
        summary[c] = summary[c].astype("Int64")
    return summary, samples


def _mark(summary: pd.DataFrame, samples: list[np.ndarray], alpha: float) -> None:
    """Adds (in place) ``best``, ``best_row``, ``p_value`` and ``not_worse``, within each block
    and among its studies only."""
    summary["best"] = False
    summary["best_row"] = False
    summary["p_value"] = math.nan
    summary["not_worse"] = pd.Series([pd.NA] * len(summary), dtype="boolean")
    compared = summary[
        ~summary["baseline"] & ~summary["archived"] & ~summary["metric"].isin(UNMARKED_METRICS)
    ]
    for (*_, metric), col in compared.groupby(
        ["dataset", "protocol", "mode", "metric"], sort=False
    ):
        # exact ties: every row with the best mean (the lowest for an error rate) is the
        # column's best, and none is tested
        oriented = col["mean"] if higher_is_better(metric) else -col["mean"]
        tied = col.index[oriented == oriented.max()]
        summary.loc[tied, "best"] = True
        summary.loc[tied, "not_worse"] = True
        for i in col.index.drop(tied):
            p = _against_best(samples[i], [samples[r] for r in tied])
            summary.loc[i, "p_value"] = p
            if not math.isnan(p):
                summary.loc[i, "not_worse"] = p >= alpha
    for _, d in compared.groupby(["dataset", "protocol"], sort=False):
        best = _best_rows(d)
        summary.loc[d.index[d["study"].isin(best)], "best_row"] = True


def _against_best(row: np.ndarray, best: list[np.ndarray]) -> float:
    """Welch's p of a row against the column's best: against each row tied for it, the
    smallest p (significantly worse than any of them is significantly worse than the best);
    NaN when no test can be made."""
    ps = [p for p in (welch_p(row, b) for b in best) if not math.isnan(p)]
    return min(ps) if ps else math.nan


def _best_rows(d: pd.DataFrame) -> list[str]:
    """Studies of one block with the highest concatenated MAP@R (else separated MAP@R)."""
    for mode in ("concatenated", "separated"):
        c = d[(d["mode"] == mode) & (d["metric"] == "map_at_r")]
        if not c.empty:
            return c.loc[c["mean"] == c["mean"].max(), "study"].tolist()
    return []
