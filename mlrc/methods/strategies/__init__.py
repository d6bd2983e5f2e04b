"""Training strategies: wrap the loss (or the model's forward) during training only.

A strategy turns one batch (model, loss, optional miner, images, labels) into the scalar loss to
minimise. The default is the plain protocol step ``loss(model(x), y[, miner pairs])``. A study names
at most one (``strategy: {name, params, search}``); its parameters join the search space as
``strategy.<param>``, with default spaces in ``studies/spaces/strategies/<name>.yaml``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from mlrc.registry import Registry, import_submodules

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

    def batch_loss(
        self, model: nn.Module, loss_fn: nn.Module, miner: nn.Module | None, x: Tensor, y: Tensor
    ) -> Tensor:
        emb = model(x)
        return loss_fn(emb, y, miner(emb, y)) if miner is not None else loss_fn(emb, y)


STRATEGIES: Registry[Strategy] = Registry("strategy", group="mlrc.strategies")

available = STRATEGIES.available
params = STRATEGIES.params  # accepted parameters of a strategy and their defaults
param_types = STRATEGIES.param_types  # their declared types (mlrc.params)


def build(name: str | None, **kwargs: Any) -> Strategy:
    """Strategy ``name`` (None → the plain protocol step)."""
    return Strategy() if name is None else STRATEGIES.build(name, **kwargs)


# Every module of this package registers its strategy on import.
import_submodules(__name__)
