"""Certify a search-cost rule on a corpus of finished, unpruned studies (issue #42).

A rule *succeeds* on a study at a budget of N trials when, replaying the study's first N
recorded trials in their recorded order (:func:`mlrc.search.replay.first_trials`: what a search
of budget N runs), the configuration it chooses has a full-protocol value within δ of the best
of those N. δ is the seed-to-seed standard deviation of a configuration's k-fold mean
validation value (same folds, new training seeds), pooled per dataset over the studies' test
reproductions, which are reseeds of the chosen configuration (:func:`seed_spread`; it carries
the chosen one's winner's curse in its mean, not in its spread).

Figures per rule and budget: the fold-epochs spent (a fraction of the unpruned studies',
pooled), the within-δ and exact-choice counts over studies with one-sided 95 % Clopper–Pearson
bounds, mean and worst regret. The rules are tuned two ways, studies as the unit: leave one
study out (:func:`leave_out` with each study its own group) and leave one dataset out (the
studies of a dataset held out together: studies that share a dataset are correlated).
Permutations of the trial order and of each trial's fold order are a robustness figure
(:func:`robustness`), never counted as independent replays.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from mlrc.protocol.stats import clopper_pearson
from mlrc.search.errors import StudyError
from mlrc.search.pruning import Rules
from mlrc.search.replay import RecordedStudy, first_trials, replay

__all__ = [
    "BUDGETS",
    "Outcome",
    "certify",
    "leave_out",
    "permuted",
    "pick",
    "risk_table",
    "robustness",
    "seed_spread",
    "summary",
    "trials_needed",
]

BUDGETS = (20, 30, 40, 50)  # the study lengths the issue certifies at
LEVEL = 0.95  # one-sided Clopper–Pearson bounds


@dataclass(frozen=True)
class Outcome:
    """One rule replayed on one study's first ``trials`` trials. ``regret``: the best value of
    those trials minus the value of the rule's choice (validation MAP@R as a fraction);
    ``within``: regret ≤ δ of the study's dataset."""

    study: str
    dataset: str
    rules: str
    trials: int
    fold_epochs: int
    full_fold_epochs: int
    regret: float
    same_choice: bool
    within: bool


def seed_spread(studies: Sequence[RecordedStudy]) -> dict[str, float]:
    """δ per dataset: the pooled standard deviation (ddof = 1 within each study) of the k-fold
    mean validation value over each study's reproductions, √(Σ (nᵢ − 1) sᵢ² / Σ (nᵢ − 1)),
    over the studies with ≥ 2 reproductions. A dataset without any is left out."""
    num: dict[str, float] = {}
    dof: dict[str, int] = {}
    for s in studies:
        means = [sum(r) / len(r) for r in s.reseeds]
        if len(means) < 2:
            continue
        m = sum(means) / len(means)
        num[s.dataset] = num.get(s.dataset, 0.0) + sum((x - m) ** 2 for x in means)
        dof[s.dataset] = dof.get(s.dataset, 0) + len(means) - 1
    return {d: math.sqrt(num[d] / dof[d]) for d in num}


def _deltas(studies: Sequence[RecordedStudy], delta: float | None) -> dict[str, float]:
    """δ per dataset of ``studies``: ``delta`` for every one when given, else measured."""
    if delta is not None:
        return {s.dataset: delta for s in studies}
    measured = seed_spread(studies)
    if missing := sorted({s.dataset for s in studies} - measured.keys()):
        raise StudyError(
            f"no study of dataset {missing[0]!r} has 2 or more reproductions to measure δ "
            "(the seed-to-seed spread): give δ (--delta)"
        )
    return measured


def outcome(study: RecordedStudy, rules: Rules, trials: int, delta: float) -> Outcome:
    """``rules`` replayed on ``study``'s first ``trials`` trials."""
    r = replay(first_trials(study, trials), rules)
    return Outcome(
        study=study.name,
        dataset=study.dataset,
        rules=rules.label(),
        trials=trials,
        fold_epochs=r.fold_epochs,
        full_fold_epochs=r.full_fold_epochs,
        regret=r.regret,
        same_choice=r.same_choice,
        within=r.regret <= delta + 1e-12,  # a tie at δ is within
    )


def summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Pooled figures of outcomes over studies: fold-epochs fraction, within-δ and exact-choice
    counts with one-sided 95 % Clopper–Pearson bounds, mean and worst regret (fractions)."""
    n = len(outcomes)
    within = sum(o.within for o in outcomes)
    exact = sum(o.same_choice for o in outcomes)
    spent = sum(o.fold_epochs for o in outcomes)
    full = sum(o.full_fold_epochs for o in outcomes)
    return {
        "studies": n,
        "fold_epochs_fraction": spent / full if full else 1.0,
        "within": within,
        "within_bounds": list(clopper_pearson(within, n, LEVEL)) if n else None,
        "exact": exact,
        "exact_bounds": list(clopper_pearson(exact, n, LEVEL)) if n else None,
        "mean_regret": sum(o.regret for o in outcomes) / n if n else 0.0,
        "worst_regret": max((o.regret for o in outcomes), default=0.0),
    }


def pick(by_rule: dict[str, Sequence[Outcome]]) -> str:
    """The rule tuned on these outcomes (rule → its outcome on each study): the cheapest (pooled
    fold-epochs fraction) of those within δ on every study; where none is, the one within δ on
    the most, then the cheapest; ties: the first."""
    scored = [
        (-sum(o.within for o in outs), summary(outs)["fold_epochs_fraction"], i, label)
        for i, (label, outs) in enumerate(by_rule.items())
    ]
    return min(scored)[3]


def leave_out(
    table: dict[str, dict[str, Outcome]], group: Callable[[Outcome], str]
) -> dict[str, Any]:
    """The tuning checked on studies it did not see, at one budget (``table``: rule → study →
    outcome): for each group of studies (``group`` of an outcome: its study for leave one study
    out, its dataset for leave one dataset out), the rule :func:`pick` picks on the other
    groups, replayed on the group's studies; their pooled :func:`summary`, with the picks."""
    first = next(iter(table.values()))
    groups = sorted({group(o) for o in first.values()})
    if len(groups) < 2:
        raise StudyError("leaving a group out needs studies of two or more groups")
    held: list[Outcome] = []
    picks: dict[str, str] = {}
    for g in groups:
        train = {
            lb: [o for o in by.values() if group(o) != g] for lb, by in table.items()
        }  # fmt: skip
        picks[g] = pick(train)
        held += [o for o in table[picks[g]].values() if group(o) == g]
    return {**summary(held), "picks": picks}


def permuted(study: RecordedStudy, rng: random.Random) -> RecordedStudy:
    """``study`` with its trials in another order and each trial's folds in another order (the
    same curves): a search whose sampler had drawn the same configurations otherwise."""
    trials = [replace(t, folds=tuple(rng.sample(t.folds, len(t.folds)))) for t in study.trials]
    return replace(study, trials=tuple(rng.sample(trials, len(trials))))


def _outcomes(job: tuple) -> list[Outcome]:
    studies, rules, trials, deltas = job
    return [outcome(s, r, trials, deltas[s.dataset]) for s in studies for r in rules]


def _run(jobs: list[tuple], processes: int) -> list[list[Outcome]]:
    if processes <= 1:
        return [_outcomes(j) for j in jobs]
    with ProcessPoolExecutor(processes) as ex:
        return list(ex.map(_outcomes, jobs))


def robustness(
    studies: Sequence[RecordedStudy],
    rules: Rules,
    budgets: Sequence[int],
    deltas: dict[str, float],
    permutations: int,
    seed: int,
    processes: int = 1,
) -> dict[str, Any]:
    """``rules`` over ``permutations`` permuted orders of every study (:func:`permuted`, from
    ``random.Random(seed)``), per budget: the within-δ rate and fold-epochs fraction, their mean
    and worst over the permutations (a robustness figure, not independent replays)."""
    rng = random.Random(seed)
    orders = [[permuted(s, rng) for s in studies] for _ in range(permutations)]
    jobs = [(order, [rules], n, deltas) for n in budgets for order in orders]
    results = iter(_run(jobs, processes))
    out: dict[str, Any] = {"rules": rules.label(), "permutations": permutations, "seed": seed}
    for n in budgets:
        runs = [summary(next(results)) for _ in orders]
        rates = [r["within"] / r["studies"] for r in runs]
        fracs = [r["fold_epochs_fraction"] for r in runs]
        out[str(n)] = {
            "within_rate_mean": sum(rates) / len(rates),
            "within_rate_worst": min(rates),
            "fold_epochs_fraction_mean": sum(fracs) / len(fracs),
            "fold_epochs_fraction_worst": max(fracs),
        }
    return out


def certify(
    studies: Sequence[RecordedStudy],
    candidates: Sequence[Rules],
    budgets: Sequence[int] = BUDGETS,
    delta: float | None = None,
    processes: int = 1,
    permutations: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """Every figure of the module docstring for ``candidates`` (the unpruned search is always
    one: the fallback a tuning picks where nothing else holds) at each budget: in sample per
    rule, leave one study out, leave one dataset out (where the corpus has two or more), with
    the floor and the oracle of :func:`bounds`; ``recommended``: the rule :func:`pick` picks on
    every study at the longest budget, and with ``permutations`` its :func:`robustness`. δ:
    ``delta`` for every dataset, else measured (:func:`seed_spread`)."""
    if not studies:
        raise StudyError("no study to certify on")
    if short := [s.name for s in studies if len(s.trials) < max(budgets)]:
        raise StudyError(f"study {short[0]!r} has fewer than {max(budgets)} trials")
    deltas = _deltas(studies, delta)
    rules = list({r.label(): r for r in (Rules(), *candidates)}.values())
    jobs = [([s], rules, n, deltas) for n in budgets for s in studies]
    done = iter(_run(jobs, processes))
    out: dict[str, Any] = {
        "studies": [s.name for s in studies],
        "datasets": sorted({s.dataset for s in studies}),
        "delta": deltas,
        "budgets": {},
    }
    for n in budgets:
        table: dict[str, dict[str, Outcome]] = {r.label(): {} for r in rules}
        for s in studies:
            for o in next(done):
                table[o.rules][s.name] = o
        out["budgets"][str(n)] = _at_budget(table, studies, n, deltas)
    best = pick({lb: list(by.values()) for lb, by in table.items()})
    out["recommended"] = best
    out["trials_needed"] = trials_needed(studies, deltas, max(budgets))
    if permutations:
        chosen = next(r for r in rules if r.label() == best)
        out["robustness"] = robustness(
            studies, chosen, budgets, deltas, permutations, seed, processes
        )
    return out


def trials_needed(
    studies: Sequence[RecordedStudy], deltas: dict[str, float], n: int
) -> dict[str, int]:
    """How many trials the search needed, per study: the position (1-based, in the recorded
    order) of the first trial whose value is within δ of the best of the first ``n`` — what a
    budget of that many trials, same sampler and seed, would have chosen within δ."""
    out = {}
    for s in studies:
        values = [t.value for t in s.trials[:n]]
        best = max(v for v in values if v is not None)
        d = deltas[s.dataset]
        out[s.name] = next(
            i for i, v in enumerate(values, 1) if v is not None and v >= best - d - 1e-12
        )
    return out


def _at_budget(
    table: dict[str, dict[str, Outcome]],
    studies: Sequence[RecordedStudy],
    n: int,
    deltas: dict[str, float],
) -> dict[str, Any]:
    """One budget's figures (see :func:`certify`)."""
    two_datasets = len({s.dataset for s in studies}) > 1
    return {
        "rules": {lb: summary(list(by.values())) for lb, by in table.items()},
        "per_study": {lb: [asdict(o) for o in by.values()] for lb, by in table.items()},
        "leave_one_study_out": leave_out(table, lambda o: o.study) if len(studies) > 1 else None,
        "leave_one_dataset_out": leave_out(table, lambda o: o.dataset) if two_datasets else None,
        **bounds(studies, n, deltas),
    }


def bounds(studies: Sequence[RecordedStudy], n: int, deltas: dict[str, float]) -> dict[str, Any]:
    """What any rule must spend at budget ``n``, as fold-epochs fractions of the unpruned:

    - ``oracle``: one who knows every curve completes only the cheapest trial within δ of the
      best and spends one fold-epoch on each other trial;
    - ``floor``: a rule without foresight must complete each trial that beats every earlier
      complete trial by more than δ (stopped, it may leave the choice more than δ short), and
      spends one fold-epoch on each other trial.
    """
    oracle = floor = full = 0
    for s in studies:
        r = replay(first_trials(s, n), Rules())
        spent = r.trial_epochs
        full += r.full_fold_epochs
        values = {t.number: t.value for t in s.trials[:n] if t.value is not None}
        best, d = max(values.values()), deltas[s.dataset]
        near = [k for k, v in values.items() if v >= best - d - 1e-12 and k in spent]
        cheapest = min(near, key=lambda k: spent[k], default=None)
        oracle += sum(e if k == cheapest else min(e, 1) for k, e in spent.items())
        must, top = set(), None
        for t in s.trials[:n]:
            if t.value is not None and (top is None or t.value > top + d):
                must.add(t.number)
            if t.value is not None:
                top = t.value if top is None else max(top, t.value)
        floor += sum(e if k in must else min(e, 1) for k, e in spent.items())
    return {"oracle": oracle / full, "floor": floor / full}


_KEPT = ("studies", "fold_epochs_fraction", "within", "within_bounds", "exact", "mean_regret",
         "worst_regret")  # fmt: skip


def risk_table(result: dict[str, Any], about: dict[str, Any]) -> dict[str, Any]:
    """The certified risk a study carries (``mlrc/resources/certified_risk.json``), from a
    :func:`certify` ``result`` on a corpus described by ``about`` (``corpus``: its file;
    ``preset`` and ``folds``: the settings it was measured for): per rule and budget the
    fold-epochs fraction, the within-δ count with its Clopper–Pearson interval, the exact
    choices and the regrets; per budget the same left one study out (the tuning among the
    rules, checked on studies it did not see); δ per dataset and the recommended rule."""

    def kept(figures: dict[str, Any]) -> dict[str, Any]:
        return {k: figures[k] for k in _KEPT}

    budgets = result["budgets"]
    labels = next(iter(budgets.values()))["rules"]
    return {
        **about,
        "studies": len(result["studies"]),
        "datasets": result["datasets"],
        "delta": result["delta"],
        "recommended": result["recommended"],
        "rules": {lb: {n: kept(b["rules"][lb]) for n, b in budgets.items()} for lb in labels},
        "leave_one_study_out": {
            n: kept(b["leave_one_study_out"])
            for n, b in budgets.items()
            if b["leave_one_study_out"]
        },
    }
