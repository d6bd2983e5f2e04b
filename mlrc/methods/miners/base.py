"""The miner interface, its registration metadata (:class:`MinerInfo`) and the registry ``MINERS``.

A miner is an ``nn.Module`` called as ``miner(embeddings, labels)`` that returns the pairs or
triplets of the batch a loss then uses (pytorch-metric-learning's ``indices_tuple``:
``loss(emb, labels, miner(emb, labels))``); only losses declaring ``takes_tuples`` take one.
Margins are distances between L2-normalised embeddings unless stated otherwise. A study names at
most one (``miner: {name, params, search}``); in a study its parameters are named
``miner.<param>``. A miner's default search space is ``spaces/<name>.yaml`` beside its module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from mlrc.registry import Entry, Registry

# What a miner is: a module whose ``forward(embeddings, labels)`` returns an indices tuple.
Miner = nn.Module
PREFIX = "miner."  # a study's miner parameters are named miner.<param>


@dataclass(frozen=True, kw_only=True)
class MinerInfo(Entry):
    """What mlrc knows about a miner without building it: its parameters, their defaults and
    declared types, and its search space (the fields of :class:`mlrc.registry.Entry`)."""


MINERS: Registry[Miner] = Registry("miner", group="mlrc.miners", entry=MinerInfo)

available = MINERS.available
info: Callable[[str], MinerInfo] = MINERS.info
params = MINERS.params  # accepted parameters of a miner and their defaults
param_types = MINERS.param_types  # their declared types (mlrc.params)


def register(name: str, **meta: Any) -> Callable[[Callable[..., Miner]], Callable[..., Miner]]:
    """Decorator for ``factory(**params) -> Miner``; keyword-only parameters with defaults and
    annotations (:mod:`mlrc.params`) are its parameters; ``space=`` as for a loss."""
    return MINERS.register(name, **meta)


def build(name: str, **params: Any) -> Miner:
    """Build miner ``name``; an unknown parameter is a ``TypeError`` naming the accepted ones."""
    return MINERS.build(name, **params)
