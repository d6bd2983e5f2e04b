"""Spending less on trials that cannot win, at two levels, by one set of rules for a live study
and for its replay (:mod:`mlrc.search.replay`):

- between folds, ``search.pruner``: ``median`` (Optuna's ``MedianPruner`` on the running mean
  of fold values after fold k), ``wilcoxon`` (Optuna's ``WilcoxonPruner`` on the fold values
  against the best trial's, fold by fold, at p < ``prune_p``) or ``sequential``
  (:class:`SequentialPruner`: Kim & Nelson's indifference-zone test of the paired fold
  differences against the best trial's, :mod:`mlrc.protocol.sequential`) or ``forgiving``
  (:class:`ForgivingPruner`: Bergman, Purucker & Hutter's baseline for cross-validation);
- inside a fold, ``search.stop: gain`` (:mod:`mlrc.protocol.stopping`): the fold ends when the
  trial cannot plausibly beat the incumbent; the trial is then pruned.

Which value a pruner is told after a fold (:func:`fold_reports`) and what a fold may stop on
(:func:`fold_stop`) are plain functions of what is known when the fold ends or starts, so a
replay of the recorded curves in trial order takes the same decisions as the live run.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import optuna

from mlrc import store
from mlrc.config import RUNTIME_ONLY, ResolvedStudy
from mlrc.config.schema import StopSpec
from mlrc.protocol.sequential import eliminated, pooled_variance
from mlrc.protocol.stopping import Curve, FoldStop, Incumbent, later_gains

__all__ = [
    "RISK_TABLE",
    "FoldValues",
    "best_fold_values",
    "certified_risk",
    "Rules",
    "SequentialPruner",
    "ForgivingPruner",
    "measured_risk",
    "fold_reports",
    "fold_stop",
    "incumbent_of",
    "live_fold_stop",
    "make_pruner",
    "pruned_reason",
    "trained_curve",
    "validation_epochs",
]

FoldValues = Mapping[int, float]  # fold index → fold value (validation MAP@R, a fraction)


@dataclass(frozen=True)
class Rules:
    """A pruner (``none`` | ``median`` | ``wilcoxon`` | ``sequential``, with its settings) and
    an in-fold stopping rule (None: off), as a study's ``search`` section sets them."""

    pruner: str = "none"
    prune_startup: int = 5
    prune_p: float = 0.3
    stop: StopSpec | None = None
    prune_delta: float = 0.04  # sequential: the indifference zone δ (MAP@R, a fraction)
    prune_alpha: float = 0.05  # sequential: the error α of one trial's test

    def __post_init__(self) -> None:
        if not 0 < self.prune_p <= 1:
            raise ValueError(f"p must be in (0, 1] (got {self.prune_p})")
        if self.prune_startup < 0 or int(self.prune_startup) != self.prune_startup:
            raise ValueError(f"startup must be a whole number ≥ 0 (got {self.prune_startup})")
        if not 0 < self.prune_delta <= 1:
            raise ValueError(f"delta must be in (0, 1] (got {self.prune_delta})")
        if not 0 < self.prune_alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5) (got {self.prune_alpha})")

    def label(self) -> str:
        """``wilcoxon(p=0.3) + stop gain(q=1, slack=0, startup=2)``, for tables."""
        parts = {
            "none": "no pruner",
            "median": f"median(startup={self.prune_startup})",
            "sequential": f"sequential(delta={self.prune_delta:g}, alpha={self.prune_alpha:g}, "
            f"startup={self.prune_startup})",
            "forgiving": f"forgiving(startup={self.prune_startup})",
        }
        out = parts.get(self.pruner, f"wilcoxon(p={self.prune_p:g})")
        if self.stop is not None:
            s = self.stop
            future = ", future=best" if s.future == "best" else ""
            fold = f", fold slack={s.fold_slack:g}" if s.fold_slack else ""
            out += (
                f" + stop gain(q={s.quantile:g}, slack={s.slack:g}{fold}, startup={s.startup}"
                f"{future})"
            )
        return out

    @classmethod
    def of(cls, r: ResolvedStudy) -> Rules:
        """The rules a resolved study searches with."""
        return cls(r.pruner, r.prune_startup, r.prune_p, r.stop, r.prune_delta, r.prune_alpha)


RISK_TABLE = "pruning_risk.json"  # in mlrc/resources, written by bench/pruning.py


def measured_risk(r: ResolvedStudy, trials: int | None = None) -> dict[str, Any] | None:
    """The replay figures of the study's rules on the committed corpus (``bench/corpus/``, via
    ``mlrc/resources/pruning_risk.json``), for a search of ``trials`` trials (default: the
    study's budget): ``rules``, ``measured`` and, when measured, ``studies``, ``trials`` (the
    corpus studies' length the figures are for: the shortest measured one that is not shorter
    than the search, else the longest), ``study_trials``, ``fold_epochs_fraction``,
    ``choice_pruned`` (studies whose full-protocol choice is pruned), ``mean_regret`` (a
    fraction) and, for the tuned rule, the leave-one-out figures; None without pruning or
    stopping; ``certified``: :func:`certified_risk`. Stored with the study when it is created,
    and again when its budget changes."""
    if r.pruner == "none" and r.stop is None:
        return None
    label = Rules.of(r).label()
    table = json.loads(resources.files("mlrc.resources").joinpath(RISK_TABLE).read_text())
    entry = table["rules"].get(label)
    n = trials or r.trials
    out = {"rules": label, "measured": entry is not None, "corpus": table["corpus"],
           "certified": certified_risk(r, n)}  # fmt: skip
    if entry is None:
        return out
    lengths = sorted(int(k) for k in entry["by_length"])
    length = next((k for k in lengths if k >= n), lengths[-1])
    return {**out, "trials": length, "study_trials": n, **entry["by_length"][str(length)]}


CERTIFIED_TABLE = "certified_risk.json"  # in mlrc/resources, bench/reality_check.py certify


def certified_risk(r: ResolvedStudy, trials: int) -> dict[str, Any]:
    """The certified risk of the study's rules (``mlrc/resources/certified_risk.json``,
    :func:`mlrc.search.certify.risk_table`) for a search of ``trials`` trials: ``measured``;
    when True, the corpus (``corpus``, ``studies``, ``preset``, ``folds``, ``sampler``,
    ``delta`` per dataset), ``trials`` (the shortest certified budget not below the search's, else the
    longest), the rules' ``fold_epochs_fraction``, ``within`` of ``studies`` with
    ``within_bounds`` (one-sided 95 % Clopper–Pearson), ``exact``, the regrets (fractions) and
    ``leave_one_study_out`` (the tuning's figures at that budget); when False, ``why`` ("not
    measured for these settings" off the corpus's preset, folds and sampler, or with overrides
    that change the numbers)."""
    table = json.loads(resources.files("mlrc.resources").joinpath(CERTIFIED_TABLE).read_text())
    corpus = {k: table[k] for k in ("corpus", "studies", "preset", "folds", "sampler", "delta")}
    folds = r.split.folds if r.split is not None else r.preset.folds
    folds = len(folds) if isinstance(folds, list) else folds  # a split file's own folds
    changed = sorted(set(r.study.overrides) - set(RUNTIME_ONLY))  # what changes the numbers
    if (r.study.preset, folds, r.sampler, changed) != (
        table["preset"], table["folds"], table["sampler"], []
    ):  # fmt: skip
        why = (
            f"not measured for these settings (the corpus: preset {table['preset']} without "
            f"overrides, {table['folds']} folds, sampler {table['sampler']})"
        )
        return {"measured": False, "why": why, **corpus}
    entry = table["rules"].get(Rules.of(r).label())
    if entry is None:
        why = "not measured for these rules (`mlrc replay --corpus … --certify --rule …`)"
        return {"measured": False, "why": why, **corpus}
    budget = next((k for k in sorted(map(int, entry)) if k >= trials), max(map(int, entry)))
    loso = table["leave_one_study_out"].get(str(budget))
    return {"measured": True, **corpus, "trials": budget, "study_trials": trials,
            **entry[str(budget)], "leave_one_study_out": loso}  # fmt: skip


def make_pruner(r: ResolvedStudy | Rules) -> optuna.pruners.BasePruner:
    """The study's between-fold pruner. ``median``: after fold k, a trial whose running mean of
    fold values is below the median of the complete trials' running means after fold k stops;
    nothing is pruned before ``prune_startup`` complete trials. ``wilcoxon``: a trial whose fold
    values are worse than the best complete trial's on the same folds by a one-sided Wilcoxon
    signed-rank test at p < ``prune_p`` stops (after 2 folds at the earliest; with 4 folds the
    smallest p is 0.25 after 2 folds and 0.125 after 3, so Optuna's default 0.1 never prunes)."""
    if r.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=r.prune_startup, n_warmup_steps=0)
    if r.pruner == "wilcoxon":
        with warnings.catch_warnings():  # experimental since Optuna 3.6: we pin the version
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.pruners.WilcoxonPruner(p_threshold=r.prune_p, n_startup_steps=2)
    if r.pruner == "sequential":
        return SequentialPruner(r.prune_delta, r.prune_alpha, r.prune_startup)
    if r.pruner == "forgiving":
        return ForgivingPruner(r.prune_startup)
    return optuna.pruners.NopPruner()


def _incumbent_folds(study: optuna.Study, startup: int) -> tuple[dict[int, float], list] | None:
    """(the best complete trial's fold values, the complete trials with every fold, best
    first), from the trials' intermediate values (fold index → value); None before
    ``startup`` complete trials or before one with every fold."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < startup:
        return None
    full = [t for t in done if t.value is not None and len(t.intermediate_values) > 0]
    folds = max((len(t.intermediate_values) for t in full), default=0)
    full = sorted(
        (t for t in full if len(t.intermediate_values) == folds), key=lambda t: (-t.value, t.number)
    )
    return (dict(full[0].intermediate_values), full) if full else None


class ForgivingPruner(optuna.pruners.BasePruner):
    """Bergman, Purucker & Hutter's "forgiving" early stopping of cross-validation (AutoML
    2024), a baseline: after each fold, a trial whose mean fold value so far is below the
    incumbent's *worst* fold value (the best complete trial's) stops. Nothing is pruned before
    ``startup`` complete trials. Fold values as intermediate values at step = fold index."""

    def __init__(self, startup: int) -> None:
        self.startup = max(1, startup)

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        mine = trial.intermediate_values
        found = _incumbent_folds(study, self.startup) if mine else None
        if found is None or len(mine) >= len(found[0]):
            return False
        return float(np.mean(list(mine.values()))) < min(found[0].values())


# s² from the complete trials nearest the incumbent: the differences' spread grows with their
# distance from it (a collapsing trial's folds differ by tens of points), and the test's error is
# about near-ties. On the committed corpus the 3, 5 and 10 nearest give s within 15 % of each
# other; all the trials give 1.3–2.4× more (bench/corpus, Omniglot, 8 studies).
NEAR_TRIALS = 5


class SequentialPruner(optuna.pruners.BasePruner):
    """Kim & Nelson's fully sequential indifference-zone test (:mod:`mlrc.protocol.sequential`)
    of a trial's fold values against the incumbent's (the best complete trial's, on the same
    folds): after each fold, the trial is pruned when the sum of its paired differences is below
    ``−max(0, h² s²/(2δ) − δ r/2)``. ``s²``: the variance of one paired difference, pooled over
    the :data:`NEAR_TRIALS` best other complete trials that have every fold (each trial's
    differences from the incumbent, around their own mean), so it rests on up to 15 values, not
    on the trial's own one to four. Nothing is pruned before ``startup`` complete trials (at
    least 2: a variance needs one trial besides the incumbent). The fold values are the trial's
    intermediate values at step = fold index (:func:`fold_reports`); values in MAP@R fractions,
    higher is better.

    It can cut a clearly bad trial after its first fold; a trial better than the incumbent by δ
    or more is cut with probability at most ``alpha`` (for normal differences), and one within
    δ may be, which costs the choice at most δ."""

    def __init__(self, delta: float, alpha: float, startup: int) -> None:
        self.delta, self.alpha, self.startup = delta, alpha, max(2, startup)

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        mine = trial.intermediate_values
        found = _incumbent_folds(study, self.startup) if mine else None
        if found is None or len(mine) >= len(found[0]):
            return False
        inc, full = found
        groups = [
            [v[k] - inc[k] for k in sorted(v) if k in inc]
            for v in (t.intermediate_values for t in full[1 : NEAR_TRIALS + 1])
        ]
        s2, df = pooled_variance(groups)
        if df < 1:
            return False
        diffs = [v - inc[k] for k, v in sorted(mine.items()) if k in inc]
        return eliminated(diffs, s2, self.delta, self.alpha, df)


def fold_reports(pruner: str, order: Sequence[int], values: FoldValues) -> list[tuple[int, float]]:
    """What the trial reports to its pruner once ``values`` (fold → value) are known, the last
    of ``order`` (the folds in the order they finished) being new: ``median``, the running mean
    at step k = folds done, for k below the number of folds; ``wilcoxon``, the new fold's value
    at step = its index (every fold, the last included: the best trial must have them all);
    ``sequential`` and ``forgiving``, as ``wilcoxon``."""
    n = len(order)
    if pruner == "median":
        return [(n, float(np.mean([values[f] for f in order])))]
    if pruner in ("wilcoxon", "sequential", "forgiving"):
        return [(order[-1], values[order[-1]])]
    return []


def pruned_reason(pruner: str, r: ResolvedStudy, k: int, n_folds: int, running: float) -> str:
    """The reason of a trial pruned after ``k`` of ``n_folds`` folds (starts with "pruned")."""
    if pruner == "wilcoxon":
        why = f"fold values worse than the best trial's (Wilcoxon, p < {r.prune_p:g})"
    elif pruner == "forgiving":
        why = "mean of its folds below the best trial's worst fold (forgiving)"
    elif pruner == "sequential":
        why = (
            f"fold values worse than the best trial's by more than δ = {r.prune_delta:g} "
            f"(sequential test, α = {r.prune_alpha:g})"
        )
    else:
        why = "running mean below the median of complete trials"
    return f"pruned after {k} of {n_folds} folds: running mean {running:.4f}, {why}"


def fold_stop(
    spec: StopSpec | None,
    fold: int,
    n_folds: int,
    done: FoldValues,
    incumbent: Incumbent | None,
    complete_trials: int,
    curves: Sequence[Curve],
    epochs: Sequence[int],
    best_folds: FoldValues | None = None,
) -> FoldStop | None:
    """The in-fold stopping rule for ``fold`` of a trial when it starts, or None (no rule, fewer
    than ``spec.startup`` complete trials, no incumbent, no complete fold curve yet). ``done``:
    the trial's folds already complete; ``curves``: the study's complete search folds, trained
    epochs only; ``epochs``: the epochs at which the fold validates; ``best_folds``: fold → the
    best value of the study's complete folds (``future: best``)."""
    if spec is None or incumbent is None or complete_trials < spec.startup or not curves:
        return None
    inc, best_folds = incumbent.folds, best_folds or {}
    later = [j for j in range(n_folds) if j != fold and j not in done]
    if spec.future == "best":
        ahead = sum(max(best_folds.get(j, inc[j]), inc[j]) - inc[j] for j in later)
    else:
        ahead = 0.0
    return FoldStop(
        fold=fold,
        ahead=ahead + len(later) * spec.slack,
        done=dict(done),
        incumbent=incumbent,
        gains=later_gains(curves, epochs, spec.quantile),
        fold_slack=spec.fold_slack,
    )


def validation_epochs(every: int, last: int) -> tuple[int, ...]:
    """The trained epochs at which a fold validates: every ``every`` (``validate_every``) and
    the ``last`` (``max_epochs``)."""
    return tuple(sorted({*range(every, last + 1, every), last}))


def trained_curve(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """A stored curve's trained epochs (≥ 1), the objective's points."""
    return [(e, v) for e, v in points if e >= 1]


def incumbent_of(
    trials: Sequence[tuple[int, str, float | None]], folds: Mapping[int, FoldValues]
) -> Incumbent | None:
    """The best complete trial (highest value, the first on a tie, as Optuna's ``best_trial``)
    of ``trials`` (number, params hash, value of the complete ones), with its fold values from
    ``folds`` (params hash → fold values); None before any, or when its folds are not all
    known."""
    if not trials:
        return None
    number, key, value = max(trials, key=lambda t: (t[2], -t[0]))
    if key not in folds or value is None:
        return None
    return Incumbent(number, value, dict(folds[key]))


def live_fold_stop(ctx: Any, params_hash: str, fold: int) -> FoldStop | None:
    """:func:`fold_stop` for a search fold about to start, from the store: the complete trials,
    the incumbent and the complete fold curves as they are now (``ctx``: a
    :class:`~mlrc.search.session.StudySession`)."""
    r: ResolvedStudy = ctx.resolved
    if r.stop is None:
        return None
    rows = store.trials.study_trials(ctx.engine, ctx.study_id)
    complete = [
        (t.number, t.params_hash, t.value)
        for t in rows
        if t.state == "complete" and t.value is not None
    ]
    if len(complete) < r.stop.startup:
        return None
    curves = [
        c
        for c in store.curves.search_curves(ctx.engine, ctx.study_id, r.preset.selection_metric)
        if c.status == "complete"
    ]
    by_hash: dict[str, dict[int, float]] = {}
    for c in curves:
        by_hash.setdefault(c.params_hash, {})[c.fold] = c.objective
    n_folds = len(ctx.split.folds)
    full = {k: v for k, v in by_hash.items() if len(v) == n_folds}
    return fold_stop(
        r.stop,
        fold,
        n_folds,
        by_hash.get(params_hash, {}),
        incumbent_of(complete, full),
        len(complete),
        [trained_curve(c.points) for c in curves],
        validation_epochs(
            r.preset.per_dataset("validate_every", r.study.dataset.name), r.preset.max_epochs
        ),
        best_fold_values(by_hash.values()),
    )


def best_fold_values(folds: Iterable[FoldValues]) -> dict[int, float]:
    """Fold → the best value among ``folds`` (each a trial's fold → value)."""
    out: dict[int, float] = {}
    for values in folds:
        for j, v in values.items():
            out[j] = max(out.get(j, v), v)
    return out
