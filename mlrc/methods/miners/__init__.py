"""Miners: the registry's public face (:mod:`mlrc.methods.miners.base`) and the built-ins.

``register``, ``build``, ``MINERS`` and ``MinerInfo`` are the plug-in API; the built-ins live in
the modules of this package (:mod:`~mlrc.methods.miners.pml`) with their search spaces in
``spaces/<name>.yaml``.
"""

from mlrc.methods.miners.base import (
    MINERS,
    PREFIX,
    Miner,
    MinerInfo,
    available,
    build,
    info,
    param_types,
    params,
    register,
)
from mlrc.registry import import_submodules

# Register the built-in miners: every module of this package registers itself on import.
import_submodules(__name__)

__all__ = [
    "MINERS",
    "PREFIX",
    "Miner",
    "MinerInfo",
    "available",
    "build",
    "info",
    "param_types",
    "params",
    "register",
]
