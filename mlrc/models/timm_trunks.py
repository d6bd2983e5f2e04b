"""timm backbones as trunks: ``trunk: timm:<model>`` (e.g. ``timm:vit_small_patch16_224.dino``).

* The model is ``timm.create_model(<model>, pretrained=False, num_classes=0)``; the trunk's
  output is timm's pooled pre-logits feature, ``forward_head(forward_features(x),
  pre_logits=True)``, of dimension ``head_hidden_size`` (else ``num_features``).
* ``input_spec`` comes from the model's ``pretrained_cfg`` (mean, std; RGB, pixels 0–1), and
  :func:`timm_defaults` gives its input size (``crop`` = the config's ``input_size``, ``resize`` =
  ``floor(crop / crop_pct)`` as in timm's own eval transform) for a preset that leaves them out.
  ``<model>`` may carry a pretrained tag (``resnet50.a1_in1k``); without one, timm's default
  tag's config is used.
* ``pretrained``: ``False`` (random init); a path to a local ``.safetensors`` or torch state-dict
  file; a mapping ``{file: path, sha256: hex}`` (the file's SHA-256, or a prefix of at least 8
  hex digits, is checked before loading) or ``{url: ..., sha256: hex}`` (downloaded once into
  ``$MLRC_CACHE/weights/timm``, checked); ``True``: the weights of the model's pretrained tag
  (timm's Hugging Face Hub file ``model.safetensors``, else the config's URL), downloaded once
  into the same cache — timm publishes no checksum for them, so the SHA-256 of the first
  download is written beside the file and every later load is checked against it.
* Classifier-head keys (the config's ``classifier``) are dropped; everything else must match.
  A checkpoint in the original authors' format (e.g. Facebook's DINO ``.pth``) is converted by
  the model family's own ``checkpoint_filter_fn`` when it does not match as it is. Files are
  read, checked and downloaded by :func:`mlrc.models.weights.load_timm_weights`.

Importing this module registers the ``timm`` name prefix of :data:`~mlrc.models.base.TRUNKS`
(:mod:`mlrc.models` imports it); timm itself is imported only when a timm trunk is resolved or
built (it takes seconds to import).
"""

from __future__ import annotations

import difflib
import functools
import math
from typing import Any

from torch import Tensor

from mlrc.models.base import TRUNKS, InputSpec, Trunk
from mlrc.models.weights import load_timm_weights
from mlrc.registry import Entry, RegistryError

__all__ = ["TimmTrunk", "build_timm_trunk", "timm_defaults", "timm_entry"]


def _timm() -> Any:
    import timm  # noqa: PLC0415 - seconds to import: only when a timm trunk is used

    return timm


def _pretrained_cfg(name: str) -> Any:
    """timm's pretrained config of ``name`` (None for an architecture without one); a one-line
    RegistryError with the closest names for an unknown model or tag."""
    timm = _timm()
    if not name or not timm.is_model(name):
        arch = name.split(".", 1)[0]
        close = difflib.get_close_matches(arch, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(f'timm:{c}' for c in close)}?" if close else ""
        raise RegistryError(f"unknown timm model {name!r}{hint}")
    try:
        return timm.get_pretrained_cfg(name)
    except RuntimeError:  # a known architecture with an unknown pretrained tag
        arch = name.split(".", 1)[0]
        tags = timm.list_pretrained(f"{arch}.*")
        close = difflib.get_close_matches(name, tags, n=3)
        shown = close or tags[:5]
        raise RegistryError(
            f"unknown pretrained tag in timm model {name!r}"
            + (f"; did you mean {', '.join(f'timm:{t}' for t in shown)}?" if shown else "")
        ) from None


def timm_defaults(name: str) -> dict[str, Any]:
    """What a preset takes from the model when it does not set it: ``{"crop", "resize",
    "mean", "std"}`` from timm's pretrained config (224 px and ImageNet statistics for an
    architecture without one), and ``"fixed"``: whether the model takes only that input size
    (a ViT's position embedding). Checks the name (RegistryError with suggestions)."""
    cfg = _pretrained_cfg(name)
    size = int(cfg.input_size[-1]) if cfg is not None else 224
    crop_pct = float(cfg.crop_pct) if cfg is not None and cfg.crop_pct else 0.875
    timm = _timm()
    mean = cfg.mean if cfg is not None else timm.data.IMAGENET_DEFAULT_MEAN
    std = cfg.std if cfg is not None else timm.data.IMAGENET_DEFAULT_STD
    return {
        "crop": size,
        "resize": int(math.floor(size / crop_pct)),
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "fixed": bool(cfg is not None and cfg.fixed_input_size),
    }


class TimmTrunk(Trunk):
    """A timm model without its classifier: ``(N, 3, H, W)`` → pooled pre-logits ``(N, D)``.

    The timm model is ``self.model``, so its parameter names are timm's under ``model.``.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        timm = _timm()
        _pretrained_cfg(name)  # a one-line error for an unknown name before timm's own
        self.model_name = name
        self.model = timm.create_model(name, pretrained=False, num_classes=0)
        self.output_size = int(
            getattr(self.model, "head_hidden_size", None) or self.model.num_features
        )
        defaults = timm_defaults(name)
        cfg = getattr(self.model, "pretrained_cfg", None) or {}
        self.input_spec = InputSpec(
            mean=[float(v) for v in cfg.get("mean", defaults["mean"])],
            std=[float(v) for v in cfg.get("std", defaults["std"])],
            input_range=1,
            bgr=False,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)


def timm_entry(name: str) -> Entry:
    """The registry entry of ``timm:<name>`` (checked: RegistryError naming close models)."""
    _pretrained_cfg(name)
    return Entry(
        name=f"timm:{name}",
        factory=functools.partial(build_timm_trunk, name),
        params={},
        doc=f"timm model {name}: pooled pre-logits features",
    )


def build_timm_trunk(name: str, *, pretrained: Any = False) -> TimmTrunk:
    """``timm:<name>`` with the weights ``pretrained`` says (see the module docstring)."""
    trunk = TimmTrunk(name)
    load_timm_weights(trunk.model, pretrained, name)
    return trunk


TRUNKS.register_prefix("timm", timm_entry)
