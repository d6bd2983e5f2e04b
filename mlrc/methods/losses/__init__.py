"""Loss registry. ``build(name, num_classes=..., embedding_size=..., **params)`` → ``nn.Module``.

Every loss's ``forward(embeddings, labels)`` returns the scalar loss; its own parameters (proxies,
class weights, mean fields, margin β) are its ``.parameters()`` and get the separate loss
optimiser (learning rate searched as ``loss_lr``). ``labels`` are 0..num_classes−1 over the
fold's training classes. A new loss is one module here plus ``studies/spaces/<name>.yaml``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mlrc.methods.params import ParamType, declared_types
from mlrc.registry import Registry


@dataclass(frozen=True)
class LossInfo:
    """What the rest of mlrc needs to know about a loss without building it.

    ``batch``: ``"pair"`` (m images per class, e.g. 8 × 4) or ``"class"`` (one image per class,
    32 × 1) — the protocol's batch composition. ``params``: accepted parameters and defaults.
    ``has_parameters``: the loss owns trainable parameters (then ``loss_lr`` is searched).
    ``loss_weight_decay``: weight decay of the loss optimiser when the protocol fixes it for this
    loss (MLRC trained the Margin losses' β without weight decay); None → the preset's.
    ``types``: each parameter's declared type and range (:mod:`mlrc.methods.params`), read from
    the factory's annotations; a study's values are checked against them at validation.
    """

    name: str
    factory: Callable[..., torch.nn.Module]
    batch: Literal["pair", "class"]
    params: dict[str, Any] = field(default_factory=dict)
    has_parameters: bool = False
    doc: str = ""
    loss_weight_decay: float | None = None  # overrides the preset's loss_optimizer.weight_decay
    types: dict[str, ParamType] = field(default_factory=dict)


LOSSES: Registry[LossInfo] = Registry("loss")


def register(
    name: str,
    *,
    batch: Literal["pair", "class"],
    has_parameters: bool = False,
    loss_weight_decay: float | None = None,
):
    """Decorator for ``factory(num_classes, embedding_size, **params)``; defaults and types
    (annotations such as ``float``, ``Count``, ``Literal[...]``, see :mod:`mlrc.methods.params`)
    are read from it."""

    def decorate(factory: Callable[..., torch.nn.Module]) -> Callable[..., torch.nn.Module]:
        sig = inspect.signature(factory)
        params = {
            k: p.default
            for k, p in sig.parameters.items()
            if k not in ("num_classes", "embedding_size") and p.kind == p.KEYWORD_ONLY
        }
        doc = (factory.__doc__ or "").strip().splitlines()[0] if factory.__doc__ else ""
        types = declared_types(factory)
        info = LossInfo(name, factory, batch, params, has_parameters, doc, loss_weight_decay, types)
        LOSSES.register(name)(lambda info=info: info)
        return factory

    return decorate


def available() -> list[str]:
    return LOSSES.available()


def info(name: str) -> LossInfo:
    return LOSSES.get(name)()


def build(name: str, *, num_classes: int, embedding_size: int, **params: Any) -> torch.nn.Module:
    """Build loss ``name``; unknown parameters are a ``TypeError`` naming the accepted ones."""
    spec = info(name)
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise TypeError(
            f"loss {name!r} takes no parameter {', '.join(map(repr, unknown))} "
            f"(it takes: {', '.join(spec.params) or 'none'})"
        )
    return spec.factory(num_classes=num_classes, embedding_size=embedding_size, **params)


# Register the built-in losses (import for side effects).
from mlrc.methods.losses import mean_field as _mean_field  # noqa: E402,F401
from mlrc.methods.losses import pml as _pml  # noqa: E402,F401
