"""Trunks (backbones), their weights, frozen normalisation and the embedder.

One module per job: :mod:`~mlrc.models.base` (the :class:`Trunk` interface, :class:`InputSpec`
and the registry :data:`TRUNKS`), one module per built-in trunk
(:mod:`~mlrc.models.bninception`, :mod:`~mlrc.models.resnet`, :mod:`~mlrc.models.small`,
:mod:`~mlrc.models.timm_trunks` for ``timm:<model>``), :mod:`~mlrc.models.weights` (every
weights file read, checked or downloaded), :mod:`~mlrc.models.freezing`,
:mod:`~mlrc.models.embedder` and :mod:`~mlrc.models.baselines`.

Importing this package imports all its modules, so each trunk registers itself in :data:`TRUNKS`
(timm itself is imported only when a ``timm:`` trunk is resolved). A trunk from another package
registers with ``@mlrc.models.TRUNKS.register(name)`` (see the plug-in guide).
"""

from mlrc.models.base import TRUNKS, InputSpec, Trunk, TrunkRegistry
from mlrc.registry import import_submodules

__all__ = ["TRUNKS", "InputSpec", "Trunk", "TrunkRegistry"]

import_submodules(__name__)
