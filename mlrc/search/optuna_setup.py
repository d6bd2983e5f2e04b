"""The Optuna study behind a mlrc study, in the same database under the same name: its sampler
and pruner, and which of its trials count towards the budget."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from mlrc import store
from mlrc.search.pruning import make_pruner
from mlrc.search.session import StudySession
from mlrc.search.space import sampler as make_sampler

optuna.logging.set_verbosity(optuna.logging.WARNING)


def optuna_study(ctx: StudySession, storage: Any = None) -> optuna.Study:
    """Create or load the study's Optuna study (maximising), seeded sampler and pruner set;
    ``storage``: an Optuna storage to use instead of the URL (e.g. one with heartbeats)."""
    r = ctx.resolved
    return store.retry(
        lambda: optuna.create_study(
            study_name=ctx.name,
            storage=storage or ctx.url,
            direction="maximize",
            load_if_exists=True,
            sampler=make_sampler(r.sampler, r.study.search.seed, r.space),
            pruner=make_pruner(r),
        ),
        ctx.engine,
        "opening the Optuna study",
    )


def finished(ostudy: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards the budget: complete, pruned (Ray scheduler), or failed for a
    reason of their own (a trial failed as "interrupted" or lost by a dead worker is retried,
    not counted)."""
    return [t for t in ostudy.get_trials(deepcopy=False) if counts(t)]


def counts(t: optuna.trial.FrozenTrial) -> bool:
    """Whether trial ``t`` counts towards the budget (see :func:`finished`)."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    reason = t.user_attrs.get("reason")
    # "interrupted", or "interrupted: rank 1 of 2 ended by SIGKILL": retried, not counted
    return (
        t.state == TrialState.FAIL and reason is not None and not reason.startswith("interrupted")
    )
