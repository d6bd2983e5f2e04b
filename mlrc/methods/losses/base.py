"""The loss interface, its registration metadata (:class:`LossInfo`) and the registry ``LOSSES``.

``build(name, num_classes=..., embedding_size=..., **params)`` → ``nn.Module``.

Every loss's ``forward(embeddings, labels)`` returns the scalar loss; its own parameters (proxies,
class weights, mean fields, margin β) are its ``.parameters()`` and get the separate loss
optimiser (learning rate searched as ``loss_lr``). ``labels`` are 0..num_classes−1 over the
fold's training classes. A new loss is one module in this package plus ``spaces/<name>.yaml``
beside it (the package's modules are imported automatically); a loss from another distribution
registers through the entry-point group ``mlrc.losses`` (see :mod:`mlrc.registry`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from mlrc.registry import Entry, Registry


@dataclass(frozen=True, kw_only=True)
class LossInfo(Entry):
    """What the rest of mlrc needs to know about a loss without building it.

    ``batch``: ``"pair"`` (m images per class, e.g. 8 × 4) or ``"class"`` (one image per class,
    32 × 1) — the protocol's batch composition. ``params``: accepted parameters and defaults.
    ``has_parameters``: the loss owns trainable parameters (then ``loss_lr`` is searched).
    ``loss_weight_decay``: weight decay of the loss optimiser when the protocol fixes it for this
    loss (MLRC trained the Margin losses' β without weight decay); None → the preset's.
    ``types``: each parameter's declared type and range (:mod:`mlrc.params`), read from
    the factory's annotations; a study's values are checked against them at validation.
    ``space``: the loss's own search-space file (plug-ins; see :mod:`mlrc.registry`).
    ``takes_tuples``: ``forward(embeddings, labels, indices_tuple)`` uses a miner's pairs or
    triplets (PML's convention); None: not declared (a plug-in's), found by
    :func:`probe_takes_tuples` when needed.
    """

    batch: Literal["pair", "class"]
    has_parameters: bool = False
    takes_tuples: bool | None = None
    loss_weight_decay: float | None = None  # overrides the preset's loss_optimizer.weight_decay


LOSSES: Registry[torch.nn.Module] = Registry(
    "loss", group="mlrc.losses", entry=LossInfo, fixed=("num_classes", "embedding_size")
)


def register(
    name: str,
    *,
    batch: Literal["pair", "class"],
    takes_tuples: bool | None = None,
    has_parameters: bool = False,
    loss_weight_decay: float | None = None,
    space: str | Path | Any | None = None,
) -> Callable[[Callable[..., torch.nn.Module]], Callable[..., torch.nn.Module]]:
    """Decorator for ``factory(num_classes, embedding_size, **params)``; defaults and types
    (annotations such as ``float``, ``Count``, ``Literal[...]``, see :mod:`mlrc.params`)
    are read from it. ``takes_tuples``: the loss uses a miner's pairs/triplets (every built-in
    declares it; left out, it is probed). ``space``: the loss's search-space file (default:
    ``<name>.yaml`` or ``spaces/<name>.yaml`` beside its module, see :mod:`mlrc.registry`)."""
    return LOSSES.register(
        name,
        batch=batch,
        takes_tuples=takes_tuples,
        has_parameters=has_parameters,
        loss_weight_decay=loss_weight_decay,
        space=space,
    )


available = LOSSES.available
info: Callable[[str], LossInfo] = LOSSES.info


def build(name: str, *, num_classes: int, embedding_size: int, **params: Any) -> torch.nn.Module:
    """Build loss ``name``; unknown parameters are a ``TypeError`` naming the accepted ones."""
    return LOSSES.build(name, num_classes=num_classes, embedding_size=embedding_size, **params)


def probe_takes_tuples(name: str) -> bool:
    """Whether loss ``name``'s ``forward`` has PML's ``indices_tuple`` parameter, found by
    building it (2 classes, 2-D embeddings, default parameters) and reading the signature."""
    probe = build(name, num_classes=2, embedding_size=2)
    return "indices_tuple" in inspect.signature(probe.forward).parameters


def takes_tuples(name: str) -> bool:
    """Whether loss ``name`` uses a miner's pairs/triplets: its declaration; a plug-in that
    declares nothing is probed (:func:`probe_takes_tuples`), as before declarations existed,
    so that outside packages written then keep working."""
    declared = info(name).takes_tuples
    return probe_takes_tuples(name) if declared is None else declared
