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
  the model family's own ``checkpoint_filter_fn`` when it does not match as it is.

timm is imported only when a timm trunk is resolved or built (it takes seconds to import).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mlrc import paths
from mlrc.errors import first_line
from mlrc.models.trunks import InputSpec, Trunk
from mlrc.registry import Entry, RegistryError

__all__ = [
    "TimmTrunk",
    "build_timm_trunk",
    "file_sha256",
    "freeze_layernorm",
    "load_timm_weights",
    "timm_defaults",
    "timm_entry",
]

_LAYERNORMS = (nn.LayerNorm,)  # timm's LayerNorm / LayerNorm2d subclass nn.LayerNorm


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


# --------------------------------------------------------------------------------------------
# Weights


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_sha256(path: Path, expected: str | None) -> None:
    if not expected:
        return
    got = file_sha256(path)
    if not got.startswith(expected.lower()):
        raise ValueError(f"weights file {path} has SHA-256 {got}, expected {expected.lower()}")


def _download(url: str, sha256: str | None) -> Path:
    """``url`` in ``$MLRC_CACHE/weights/timm`` (downloaded once, with torch.hub's downloader,
    which checks ``sha256`` as a prefix); the file's path. Without ``sha256``, the first
    download's SHA-256 is kept in ``<file>.sha256`` and later loads are checked against it."""
    cache = paths.timm_weights_dir()
    tail = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "weights"
    key = hashlib.sha256(url.encode()).hexdigest()[:12]
    path = cache / f"{key}-{tail}"
    recorded = path.with_name(path.name + ".sha256")
    if not path.is_file():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(url, str(path), hash_prefix=sha256, progress=False)
        except Exception as exc:  # network, hash mismatch, disk
            raise ValueError(
                f"could not get weights {url} (cache {cache}): {type(exc).__name__}: "
                f"{first_line(exc, '(no message)')} (download it by hand and give its path)"
            ) from exc
        if not sha256:
            recorded.write_text(file_sha256(path) + "\n")
    if sha256:
        _check_sha256(path, sha256)
    elif recorded.is_file():
        _check_sha256(path, recorded.read_text().strip())
    return path


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    """A flat name → tensor mapping from a ``.safetensors`` or torch file (``state_dict`` /
    ``model`` / ``state_dict_ema`` wrappers unwrapped); ValueError naming the file."""
    if not path.is_file():
        raise ValueError(f"weights file {path} does not exist")
    if path.stat().st_size == 0:
        raise ValueError(f"weights file {path} is empty (0 bytes)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file  # noqa: PLC0415

            obj: Any = load_file(str(path), device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated, wrong format, unsafe pickle
        raise ValueError(
            f"weights file {path} is not a readable state dict: {type(exc).__name__}: "
            f"{first_line(exc, '(no message)')}"
        ) from exc
    for wrapper in ("state_dict", "model", "state_dict_ema"):
        if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
            obj = obj[wrapper]
            break
    if not isinstance(obj, Mapping) or not obj:
        raise ValueError(f"weights file {path} is not a state dict (got {type(obj).__name__})")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise ValueError(f"weights file {path} is not a state dict: entry {bad[0]!r}")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _mismatch(model: nn.Module, state: Mapping[str, Tensor]) -> str:
    """ "" when ``state`` fits ``model`` exactly (names and shapes), else what does not."""
    own = model.state_dict()
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    shapes = sorted(
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in set(own) & set(state)
        if state[k].shape != own[k].shape
    )
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            shown = ", ".join(sorted(keys)[:3]) + (", ..." if len(keys) > 3 else "")
            problems.append(f"{len(keys)} {label} keys ({shown})")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatches, file vs model ({', '.join(shapes[:3])})")
    return "; ".join(problems)


def _without_head(model: nn.Module, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    heads = cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    own = model.state_dict()
    prefixes = tuple(f"{h}." for h in heads)
    return {k: v for k, v in state.items() if k in own or not k.startswith(prefixes)}


def load_timm_weights(model: nn.Module, pretrained: Any, name: str) -> None:
    """Load ``pretrained`` (see the module docstring) into the timm ``model`` in place,
    strictly once its classifier head is dropped; a one-line ValueError naming the file."""
    if hasattr(pretrained, "model_dump"):  # the preset's {file|url, sha256} mapping
        pretrained = pretrained.model_dump()
    if pretrained is False or pretrained is None:
        return
    if pretrained is True:
        cfg = getattr(model, "pretrained_cfg", None) or {}
        if cfg.get("hf_hub_id"):
            url = f"https://huggingface.co/{cfg['hf_hub_id']}/resolve/main/model.safetensors"
        elif cfg.get("url"):
            url = cfg["url"]
        else:
            raise ValueError(
                f"timm model {name!r} has no published weights; give pretrained a local file"
            )
        path = _download(url, None)
    elif isinstance(pretrained, str | os.PathLike):
        path = Path(pretrained).expanduser()
    elif isinstance(pretrained, Mapping):
        sha = pretrained.get("sha256")
        if pretrained.get("url"):
            path = _download(str(pretrained["url"]), sha)
        else:
            path = Path(str(pretrained.get("file"))).expanduser()
            if not path.is_file():
                raise ValueError(f"weights file {path} does not exist")
            _check_sha256(path, sha)
    else:
        raise ValueError(
            f"pretrained must be false, true, a path or {{file|url, sha256}}: {pretrained!r}"
        )
    state = _without_head(model, _read_state_dict(path))
    problem = _mismatch(model, state)
    if problem:  # the original authors' format? the model family's own converter
        convert = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
        if convert is not None:
            try:
                converted = _without_head(model, convert(dict(state), model))
            except Exception:  # noqa: BLE001 - a converter that does not apply: report the first
                converted = None
            if converted is not None and not _mismatch(model, converted):
                state, problem = converted, ""
    if problem:
        raise ValueError(f"weights {path} do not fit timm model {name!r}: {problem}")
    model.load_state_dict(state, strict=True)


# --------------------------------------------------------------------------------------------
# Frozen LayerNorm


def freeze_layernorm(module: nn.Module) -> int:
    """Stop training every LayerNorm's affine weight and bias in ``module`` (``requires_grad``
    false, so optimisers skip them); returns how many LayerNorms there are. LayerNorm keeps no
    running statistics, so unlike :func:`~mlrc.models.trunks.freeze_batchnorm` this holds
    across ``model.train()``."""
    n = 0
    for m in module.modules():
        if isinstance(m, _LAYERNORMS):
            for p in m.parameters(recurse=False):
                p.requires_grad_(False)
            n += 1
    return n
