"""``sampler: ax``: the reference harness's search as an Optuna sampler, so that mlrc drives an
Optuna study as with ``gp`` and ``tpe``. That search is Ax's default of 2020: Sobol for max(5,
#params) trials, then a GP with expected improvement, each trial's fold SEM given as its known
noise.

The sampler keeps no state between suggestions: each one rebuilds an Ax experiment from the
Optuna study's trials, so any number of processes (``mlrc worker``, a resumed study) propose
the same sequence as one uninterrupted process would.

- The k-th suggested trial (k counts the study's trials that Ax suggested, i.e. every trial
  but the enqueued ones: ``search.enqueue``, retries of lost trials) is point k of Ax's scrambled
  Sobol sequence of seed ``search.seed`` while k < max(5, #params), or while fewer than
  ceil(max(5, #params) / 2) trials are complete (the reference's ``min_arms_observed``).
- After that Ax's Bayesian optimisation (``method="fast"``: a BoTorch ``SingleTaskGP`` with the
  trials' SEM as fixed noise, log noisy expected improvement) proposes it, from every complete
  trial: value and SEM (user attribute ``sem``; a trial without one, e.g. of a one-fold preset,
  leaves Ax to infer the noise). Trials RUNNING elsewhere are given to Ax as pending points.
- Pruned and failed trials are not shown to Ax (as Optuna's ``GPSampler`` ignores them); a
  non-finite trial is complete with value 0 and SEM 0, as in the reference.

Ax is imported only when a suggestion is made (``import ax`` takes seconds)."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import warnings
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from mlrc.config.identity import derive_seed

OBJECTIVE = "map_at_r"
SEM_ATTR = "sem"  # the Optuna user attribute holding a trial's fold SEM
MISSING = "sampler: ax needs the ax extra: pip install 'mlrc[ax]'"


def ax_available() -> bool:
    """Whether the ``ax`` package (the ``ax`` extra) is installed."""
    return importlib.util.find_spec("ax") is not None


def n_sobol(space: dict[str, BaseDistribution]) -> int:
    """Sobol trials before the GP: max(5, #params), Ax's default in the reference's time."""
    return max(5, len(space))


class AxSampler(BaseSampler):
    """An Optuna sampler that asks Ax for each trial's point (see the module's docstring).

    ``space``: the searched parameters as Optuna distributions, in the study's order;
    ``seed``: the study's ``search.seed`` (Sobol scrambling; each GP step derives its own)."""

    def __init__(self, space: dict[str, BaseDistribution], seed: int) -> None:
        self._space = {k: d for k, d in space.items() if not d.single()}
        self._seed = seed
        self._fallback = RandomSampler(seed=seed)
        self.last_node: str | None = None  # "Sobol" or "MBM": how the last point was made

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}  # an enqueued trial: its parameters are given
        trials = study.get_trials(deepcopy=False)
        k = sum(t.number < trial.number and "fixed_params" not in t.system_attrs for t in trials)
        seen = [t for t in trials if t.number != trial.number and self._in_space(t)]
        complete = [t for t in seen if t.state == TrialState.COMPLETE]
        n = n_sobol(self._space)
        if k < n or len(complete) < math.ceil(n / 2):
            self.last_node = "Sobol"
            return sobol_point(self._space, self._seed, k)
        self.last_node = "MBM"
        running = [t for t in seen if t.state == TrialState.RUNNING]
        return gp_point(self._space, derive_seed(self._seed, "ax", k), complete, running)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        """A parameter outside the space given (a single-valued range): drawn at random."""
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def _in_space(self, t: FrozenTrial) -> bool:
        return all(
            name in t.params and _inside(t.params[name], d) for name, d in self._space.items()
        )


def _inside(value: Any, d: BaseDistribution) -> bool:
    """Whether ``value`` lies in ``d`` (an enqueued point may lie outside the space)."""
    if isinstance(d, CategoricalDistribution):
        return value in d.choices
    return isinstance(d, IntDistribution | FloatDistribution) and d.low <= value <= d.high


def _client(space: dict[str, BaseDistribution], seed: int) -> Any:
    """An Ax ``Client`` with the experiment (``space``) and the objective (maximised)."""
    from ax.api import Client
    from ax.utils.common.logger import set_ax_logger_levels

    set_ax_logger_levels(logging.WARNING)  # not a line per trial
    client = Client(random_seed=seed)
    client.configure_experiment(parameters=[ax_parameter(n, d) for n, d in space.items()])
    client.configure_optimization(objective=OBJECTIVE)
    return client


def sobol_point(space: dict[str, BaseDistribution], seed: int, k: int) -> dict[str, Any]:
    """Point ``k`` (0-based) of Ax's scrambled Sobol sequence of ``seed`` over ``space``."""
    from ax.adapter.registry import Generators
    from ax.generation_strategy.generation_node import GenerationNode
    from ax.generation_strategy.generation_strategy import GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec

    client = _client(space, seed)
    spec = GeneratorSpec(
        generator_enum=Generators.SOBOL, generator_kwargs={"seed": seed, "init_position": k}
    )
    node = GenerationNode(name="Sobol", generator_specs=[spec])
    client.set_generation_strategy(GenerationStrategy(name="Sobol", nodes=[node]))
    return _one(client, space)


def gp_point(
    space: dict[str, BaseDistribution],
    seed: int,
    complete: list[FrozenTrial],
    running: list[FrozenTrial],
) -> dict[str, Any]:
    """Ax's Bayesian-optimisation point given the ``complete`` trials (value, SEM as known
    noise) and the ``running`` ones (pending points)."""
    client = _client(space, seed)
    client.configure_generation_strategy(
        method="fast", initialization_budget=0, initialize_with_center=False
    )
    # known noise only when every trial has its SEM (one without: Ax infers the noise)
    known = all(t.user_attrs.get(SEM_ATTR) is not None for t in complete)
    with warnings.catch_warnings():  # pandas' deprecation notes about Ax's own code
        warnings.simplefilter("ignore")
        _attach(client, space, complete, running, known)
    return _one(client, space)


def _attach(
    client: Any,
    space: dict[str, BaseDistribution],
    complete: list[FrozenTrial],
    running: list[FrozenTrial],
    known: bool,
) -> None:
    """Give Ax the complete trials (value, and SEM when ``known``) and the running ones."""
    for t in complete:
        index = client.attach_trial(parameters=_ax_params(t.params, space))
        value = float(t.value)
        outcome = (value, float(t.user_attrs[SEM_ATTR])) if known else value
        client.complete_trial(index, raw_data={OBJECTIVE: outcome})
    for t in running:
        client.attach_trial(parameters=_ax_params(t.params, space))


def _one(client: Any, space: dict[str, BaseDistribution]) -> dict[str, Any]:
    """The client's next point, in Optuna's types (ints as int, choices as given)."""
    with warnings.catch_warnings():  # pandas' deprecation notes about Ax's own code
        warnings.simplefilter("ignore")
        (params,) = client.get_next_trials(max_trials=1).values()
    return {name: _optuna_value(params[name], d) for name, d in space.items()}


def _ax_params(params: dict[str, Any], space: dict[str, BaseDistribution]) -> dict[str, Any]:
    """A trial's parameters as Ax has them (choices as their labels)."""
    return {
        n: _label(params[n]) if isinstance(d, CategoricalDistribution) else params[n]
        for n, d in space.items()
    }


def _label(choice: Any) -> str:
    """The Ax value of a choice: its JSON text (Ax's choices are one type and never null)."""
    return json.dumps(choice)


def _optuna_value(value: Any, d: BaseDistribution) -> Any:
    if isinstance(d, IntDistribution):
        return int(round(value))
    if isinstance(d, FloatDistribution):
        return min(max(float(value), d.low), d.high)
    return {_label(c): c for c in d.choices}[value]  # type: ignore[attr-defined]


def ax_parameter(name: str, d: BaseDistribution) -> Any:
    """The Ax parameter of Optuna distribution ``d``: a float or int range (log scale, step)
    or an unordered choice (labelled by the choices' JSON texts)."""
    from ax.api import ChoiceParameterConfig, RangeParameterConfig

    if isinstance(d, CategoricalDistribution):
        return ChoiceParameterConfig(
            name=name,
            values=[_label(c) for c in d.choices],
            parameter_type="str",
            is_ordered=False,
        )
    if isinstance(d, IntDistribution | FloatDistribution):
        unit = isinstance(d, IntDistribution) and d.step == 1
        step = None if d.step is None or unit else d.step
        return RangeParameterConfig(
            name=name,
            bounds=(d.low, d.high),
            parameter_type="int" if isinstance(d, IntDistribution) else "float",
            step_size=step,
            scaling="log" if d.log else "linear",
        )
    raise TypeError(f"sampler ax: no Ax parameter for {name!r} ({type(d).__name__})")
