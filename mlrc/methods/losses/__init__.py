"""Losses: the registry's public face (:mod:`mlrc.methods.losses.base`) and the built-ins.

``register``, ``build``, ``LOSSES`` and ``LossInfo`` are the plug-in API; each built-in lives in
its own module of this package (:mod:`~mlrc.methods.losses.pml`,
:mod:`~mlrc.methods.losses.mean_field`) with its search space in ``spaces/<name>.yaml``.
"""

from mlrc.methods.losses.base import (
    LOSSES,
    LossInfo,
    available,
    build,
    info,
    probe_takes_tuples,
    register,
    takes_tuples,
)
from mlrc.registry import import_submodules

# Register the built-in losses: every module of this package registers itself on import.
import_submodules(__name__)

__all__ = [
    "LOSSES",
    "LossInfo",
    "available",
    "build",
    "info",
    "probe_takes_tuples",
    "register",
    "takes_tuples",
]
