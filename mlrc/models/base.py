"""The trunk interface (:class:`Trunk`, :class:`InputSpec`) and the trunk registry :data:`TRUNKS`.

Conventions
-----------
* A trunk maps a float batch ``(N, 3, H, W)`` to a pooled feature ``(N, D)``; ``D`` is its
  ``output_size``. The global pooling is an adaptive average over the whole final feature map, so
  any input large enough for the network's strides works.
* ``input_spec`` says how the pixels must be prepared, in the trunk's own pixel range:
  ``x = (pixel * input_range - mean) / std`` per channel, where ``pixel`` is in [0, 1],
  ``input_range`` is 255 or 1, and the channels are in BGR order when ``bgr`` is true (RGB
  otherwise). ``mean`` and ``std`` are therefore in units of the trunk's range (e.g. 0–255 for
  BN-Inception).
* Every factory in :data:`TRUNKS` has the signature ``factory(*, pretrained=False) -> Trunk``.
  ``pretrained`` is ``False`` (random init), ``True`` (ImageNet weights downloaded once into
  ``$MLRC_CACHE/weights``, default ``~/.cache/mlrc/weights``, sha-256 prefix checked) or a path to
  a local ``.pth`` state dict (read by :mod:`mlrc.models.weights`).
* A name ``<prefix>:<rest>`` is resolved by the handler registered for ``<prefix>``
  (:meth:`TrunkRegistry.register_prefix`): :mod:`mlrc.models.timm_trunks` registers ``timm``
  when :mod:`mlrc.models` is imported, so ``timm:<model>`` names any timm model.

The built-in trunks live one module each (:mod:`~mlrc.models.bninception`,
:mod:`~mlrc.models.resnet`, :mod:`~mlrc.models.small`, :mod:`~mlrc.models.timm_trunks`) and
register themselves here when :mod:`mlrc.models` imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from torch import nn

from mlrc.registry import Entry, Registry

__all__ = ["TRUNKS", "InputSpec", "Trunk", "TrunkRegistry", "copy_spec"]


class InputSpec(TypedDict):
    """Pixel preparation a trunk expects (see the module docstring for the formula)."""

    mean: list[float]  # per channel, in the trunk's pixel range, in the trunk's channel order
    std: list[float]  # idem
    input_range: int  # 255 (pixels 0–255) or 1 (pixels 0–1)
    bgr: bool  # channel order BGR instead of RGB


class Trunk(nn.Module):
    """Base of every trunk: ``forward`` gives ``(N, output_size)`` pooled features."""

    output_size: int
    input_spec: InputSpec


def copy_spec(spec: InputSpec) -> InputSpec:
    """A per-instance copy, so editing one model's spec never changes the class default."""
    return InputSpec(
        mean=list(spec["mean"]),
        std=list(spec["std"]),
        input_range=spec["input_range"],
        bgr=spec["bgr"],
    )


class TrunkRegistry(Registry[Trunk]):
    """The trunk registry, plus name prefixes: ``timm:<model>`` is resolved by the handler
    registered for ``timm`` (:mod:`mlrc.models.timm_trunks`), not by a fixed entry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefixes: dict[str, Callable[[str], Entry]] = {}

    def register_prefix(self, prefix: str, resolve: Callable[[str], Entry]) -> None:
        """Names ``<prefix>:<rest>`` are looked up as ``resolve(rest)``."""
        self.prefixes[prefix] = resolve

    def info(self, name: str) -> Any:
        prefix, sep, rest = name.partition(":")
        if sep and prefix in self.prefixes:
            return self.prefixes[prefix](rest)
        return super().info(name)


TRUNKS = TrunkRegistry("trunk", group="mlrc.trunks")
