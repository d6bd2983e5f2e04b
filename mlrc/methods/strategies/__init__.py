"""Training strategies: the registry's public face (:mod:`mlrc.methods.strategies.base`) and the
built-ins.

``register``, ``build``, ``STRATEGIES``, ``StrategyInfo`` and the interface :class:`Strategy` are
the plug-in API; each built-in lives in its own module of this package (``das``, ``metrix``,
``rho_distance``) with its search space in ``spaces/<name>.yaml``.
"""

from mlrc.methods.strategies.base import (
    PREFIX,
    STRATEGIES,
    Strategy,
    StrategyInfo,
    available,
    build,
    info,
    param_types,
    params,
    register,
)
from mlrc.registry import import_submodules

# Register the built-in strategies: every module of this package registers itself on import.
import_submodules(__name__)

__all__ = [
    "PREFIX",
    "STRATEGIES",
    "Strategy",
    "StrategyInfo",
    "available",
    "build",
    "info",
    "param_types",
    "params",
    "register",
]
