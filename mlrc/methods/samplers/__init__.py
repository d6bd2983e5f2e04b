"""Batch samplers: the registry's public face (:mod:`mlrc.methods.samplers.base`) and the
built-ins.

``register``, ``build``, ``SAMPLERS``, ``SamplerInfo`` and the interface :class:`BatchSampler`
are the plug-in API (with SPC-m's :class:`ClassBalancedBatchSampler`, a base for samplers that
fill batches class by class); each built-in lives in a module of this package.
"""

from mlrc.methods.samplers.base import (
    SAMPLERS,
    BatchSampler,
    SamplerInfo,
    available,
    build,
    info,
    params,
    register,
)
from mlrc.methods.samplers.m_per_class import ClassBalancedBatchSampler
from mlrc.registry import import_submodules

# Register the built-in samplers: every module of this package registers itself on import.
import_submodules(__name__)

__all__ = [
    "SAMPLERS",
    "BatchSampler",
    "ClassBalancedBatchSampler",
    "SamplerInfo",
    "available",
    "build",
    "info",
    "params",
    "register",
]
