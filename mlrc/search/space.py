"""Search spaces (``ParamSpace``) → Optuna suggestions. Knows nothing of the loss being tuned."""

from __future__ import annotations

from typing import Any

import optuna

from mlrc.config import ParamSpace


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


def sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """``gp`` (Gaussian-process BO, the default) or ``tpe``, seeded."""
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r} (gp or tpe)")
