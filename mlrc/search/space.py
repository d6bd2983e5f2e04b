"""Search spaces (``ParamSpace``) → Optuna suggestions and the study's sampler. Knows nothing of
the loss being tuned."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from mlrc.config import ParamSpace
from mlrc.config.identity import derive_seed
from mlrc.search.errors import StudyError


def suggest(trial: optuna.Trial, space: dict[str, ParamSpace]) -> dict[str, Any]:
    """Draw every parameter of ``space`` from ``trial`` (define-by-run)."""
    out: dict[str, Any] = {}
    for name, s in space.items():
        if s.choices is not None:
            out[name] = trial.suggest_categorical(name, s.choices)
        elif s.int_:
            out[name] = trial.suggest_int(
                name, int(s.low), int(s.high), log=s.log, step=int(s.step or 1)
            )
        else:
            out[name] = trial.suggest_float(name, s.low, s.high, log=s.log, step=s.step)
    return out


def distributions(space: dict[str, ParamSpace]) -> dict[str, BaseDistribution]:
    """The Optuna distributions that :func:`suggest` draws ``space`` from, in its order."""
    out: dict[str, BaseDistribution] = {}
    for name, s in space.items():
        if s.choices is not None:
            out[name] = CategoricalDistribution(s.choices)
        elif s.int_:
            out[name] = IntDistribution(int(s.low), int(s.high), log=s.log, step=int(s.step or 1))
        else:
            out[name] = FloatDistribution(s.low, s.high, log=s.log, step=s.step)
    return out


def sampler(
    name: str,
    seed: int,
    space: dict[str, ParamSpace] | None = None,
    position: int | None = None,
) -> optuna.samplers.BaseSampler:
    """The study's sampler, seeded: ``gp`` (Optuna's Gaussian-process BO, the default),
    ``tpe`` or ``ax`` (the reference's Ax search, :mod:`mlrc.search.ax_sampler`; needs
    ``space``).

    ``position``: the number of trials asked before this suggestion, when a sampler is made
    for each one (the local backend): ``gp`` and ``tpe`` then draw with a seed derived from
    (``seed``, position), so a resumed study proposes the same sequence as an uninterrupted
    one; ``ax`` is stateless and keeps ``seed``.

    Parallel workers: both Optuna samplers account for the trials RUNNING elsewhere — TPE as a
    constant liar (running trials counted among the worse ones), the GP with the running
    points as pending in a q-batch log EI (Optuna 5's ``GPSampler`` does this by itself once
    it has its 10 startup trials); ``ax`` gives them to Ax as pending points. With no trial
    running these change nothing."""
    if position is not None and name != "ax":
        seed = derive_seed(seed, "sampler", position)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "ax":
        from mlrc.search.ax_sampler import MISSING, AxSampler, ax_available

        if not ax_available():
            raise StudyError(MISSING)
        if space is None:
            raise ValueError("sampler ax needs the study's search space")
        return AxSampler(distributions(space), seed)
    raise ValueError(f"unknown sampler {name!r} (gp, tpe or ax)")
