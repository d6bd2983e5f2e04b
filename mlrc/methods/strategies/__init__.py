"""Training strategies: wrap the loss (or the model's forward) during training only.

A strategy turns one batch (model, loss, optional miner, images, labels) into the scalar loss to
minimise. The default is the plain protocol step ``loss(model(x), y[, miner pairs])``. A study names
at most one (``strategy: {name, params, search}``); its parameters join the search space as
``strategy.<param>``, with default spaces in ``studies/spaces/strategies/<name>.yaml``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from mlrc.methods.params import ParamType, declared_types
from mlrc.registry import Registry

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


STRATEGIES: Registry[Callable[..., Strategy]] = Registry("strategy")


def available() -> list[str]:
    return STRATEGIES.available()


def params(name: str) -> dict[str, Any]:
    """Accepted parameters of strategy ``name`` and their defaults."""
    sig = inspect.signature(STRATEGIES.get(name))
    return {k: p.default for k, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY}


def param_types(name: str) -> dict[str, ParamType]:
    """Declared type (and range) of each parameter of strategy ``name`` (mlrc.methods.params)."""
    return declared_types(STRATEGIES.get(name))


def build(name: str | None, **kwargs: Any) -> Strategy:
    """Strategy ``name`` (None → the plain protocol step)."""
    if name is None:
        return Strategy()
    unknown = sorted(set(kwargs) - set(params(name)))
    if unknown:
        raise TypeError(f"strategy {name!r} takes no parameter {', '.join(map(repr, unknown))}")
    return STRATEGIES.get(name)(**kwargs)


from mlrc.methods.strategies import das as _das  # noqa: E402,F401
from mlrc.methods.strategies import metrix as _metrix  # noqa: E402,F401
from mlrc.methods.strategies import rho_distance as _rho_distance  # noqa: E402,F401
