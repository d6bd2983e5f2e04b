"""The strategy interface (:class:`Strategy`), its registration metadata (:class:`StrategyInfo`)
and the registry ``STRATEGIES``.

Training strategies wrap the loss (or the model's forward) during training only.

A strategy turns one batch (model, loss, optional miner, images, labels) into the scalar loss to
minimise. The default is the plain protocol step ``loss(model(x), y[, miner pairs])``. A study names
at most one (``strategy: {name, params, search}``); its parameters join the search space as
``strategy.<param>``, with default spaces in ``spaces/<name>.yaml`` beside each module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from mlrc.registry import Entry, Registry

PREFIX = "strategy."


class Strategy(nn.Module):
    """The plain protocol step; subclasses change what is fed to the loss."""

    uses_miner = True  # False: the strategy chooses the tuples itself (a study's miner is refused)
    losses: frozenset[str] | None = None  # the losses it works with (None: any)
    # Why the strategy needs batches with positive pairs (None: it does not). Validation refuses
    # it with a loss whose batch has none: the m-per-class batch kind "class" is 32 classes × 1
    # image under the protocol's presets (BatchSpec.images_per_class), so there the strategy
    # would silently do nothing (or less than its name says).
    positive_pairs: str | None = None

    def ranks_refusal(self, values: dict[str, list[Any]]) -> str | None:
        """Why the strategy cannot train as K > 1 ranks with any of these parameter values
        (name → the values it may take: fixed, searched or default), or None. Under K ranks
        ``batch_loss`` gets a model whose output is the global batch's embeddings and the
        global labels, but only this rank's images."""
        return None

    def batch_loss(
        self, model: nn.Module, loss_fn: nn.Module, miner: nn.Module | None, x: Tensor, y: Tensor
    ) -> Tensor:
        emb = model(x)
        return loss_fn(emb, y, miner(emb, y)) if miner is not None else loss_fn(emb, y)


@dataclass(frozen=True, kw_only=True)
class StrategyInfo(Entry):
    """What mlrc knows about a strategy without building it: its parameters, their defaults and
    declared types, and its search space (the fields of :class:`mlrc.registry.Entry`)."""


STRATEGIES: Registry[Strategy] = Registry("strategy", group="mlrc.strategies", entry=StrategyInfo)

available = STRATEGIES.available
info: Callable[[str], StrategyInfo] = STRATEGIES.info
params = STRATEGIES.params  # accepted parameters of a strategy and their defaults
param_types = STRATEGIES.param_types  # their declared types (mlrc.params)


def build(name: str | None, **kwargs: Any) -> Strategy:
    """Strategy ``name`` (None → the plain protocol step)."""
    return Strategy() if name is None else STRATEGIES.build(name, **kwargs)


def register(
    name: str, **meta: Any
) -> Callable[[Callable[..., Strategy]], Callable[..., Strategy]]:
    """Decorator for ``factory(**params) -> Strategy``; keyword-only parameters with defaults and
    annotations (:mod:`mlrc.params`) are its parameters; ``space=`` as for a loss."""
    return STRATEGIES.register(name, **meta)
