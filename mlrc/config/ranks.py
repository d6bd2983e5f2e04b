"""Whether a study can train each fold as K processes (``processes_per_trial``,
``--procs-per-trial``): checked before anything runs, each refusal one line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlrc.config.load import ConfigError

__all__ = ["check_ranks"]


def check_ranks(
    resolved: Any, procs: int, source: str = "", train_classes: Sequence[int] = ()
) -> None:
    """``ConfigError`` in one line when the folds of ``resolved`` (a
    :class:`~mlrc.config.ResolvedStudy`) cannot train as ``procs`` ranks: a global batch that
    does not split into whole classes × images per rank — also for a fold whose
    ``train_classes`` (the number of training classes of each fold, when known) are fewer than
    a batch wants, as the m-per-class sampler then draws all of them — or a strategy that needs
    every image of the batch in one process. ``procs`` 1: nothing to check."""
    if procs <= 1:
        return
    src = source or resolved.source or "study"
    p = resolved.preset
    size = p.batch.size
    from mlrc.methods import losses

    m = p.batch.images_per_class.get(losses.info(resolved.study.loss.name).batch, 1)
    if size % procs or (size // procs) % m:
        raise ConfigError(
            f"{src}: batch.size {size} does not split into {procs} processes per trial as whole "
            f"classes of {m} image(s) each (needs a multiple of {procs * m})"
        )
    for fold, n in enumerate(train_classes):  # a fold with fewer classes draws smaller batches
        drawn = min(size // m, n) * m
        if drawn % procs or (drawn // procs) % m:
            raise ConfigError(
                f"{src}: fold {fold} trains on {n} classes, so its batches are {drawn // m} "
                f"classes × {m} = {drawn} images, which do not split into {procs} processes per "
                f"trial as whole classes (make batch.size / {m} ≤ {n} and a multiple of {procs})"
            )
    if resolved.study.strategy is not None:
        reason = _strategy_refusal(resolved)
        if reason is not None:
            raise ConfigError(f"{src}: {procs} processes per trial: {reason}")


def _strategy_refusal(resolved: Any) -> str | None:
    """The study's strategy's reason not to run as K ranks, over every value its parameters
    may take (fixed, searched, or the default)."""
    from mlrc.methods import strategies

    name = resolved.study.strategy.name
    values: dict[str, list[Any]] = {k: [v] for k, v in strategies.params(name).items()}
    for key, value in resolved.fixed.items():
        if key.startswith(strategies.PREFIX):
            values[key.removeprefix(strategies.PREFIX)] = [value]
    for key, space in resolved.space.items():
        if key.startswith(strategies.PREFIX) and space.choices is not None:
            values[key.removeprefix(strategies.PREFIX)] = list(space.choices)
    return strategies.build(name, **{k: v[0] for k, v in values.items()}).ranks_refusal(values)
