"""Image trunks (backbones), ImageNet weight loading, frozen BatchNorm and the linear embedder.

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
  a local ``.pth`` state dict. Classifier heads in a checkpoint (``last_linear.*``, ``fc.*``) are
  dropped; everything else must match the trunk exactly.
* ``timm:<model>`` names any timm model (:mod:`mlrc.models.timm_trunk`, a name prefix of
  :data:`TRUNKS`).
* BatchNorm is frozen in DML training: call :func:`freeze_batchnorm` after **every**
  ``model.train()``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor, nn
from torchvision.models import ResNet, ResNet50_Weights
from torchvision.models.resnet import Bottleneck

from mlrc import paths
from mlrc.errors import first_line
from mlrc.registry import Entry, Registry

__all__ = [
    "BN_INCEPTION_HASH",
    "BN_INCEPTION_URL",
    "HEAD_PREFIXES",
    "RESNET50_HASH",
    "TRUNKS",
    "BNInception",
    "Embedder",
    "InputSpec",
    "ResNet50Trunk",
    "SmallCNN",
    "Trunk",
    "TrunkRegistry",
    "check_weights",
    "freeze_batchnorm",
    "load_weights",
    "weights_cache_dir",
]

BN_INCEPTION_URL = "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth"
BN_INCEPTION_HASH = "52deb4733"
RESNET50_HASH = "0676ba61"  # ResNet50_Weights.IMAGENET1K_V1: .../models/resnet50-0676ba61.pth

#: State-dict prefixes of ImageNet classifier heads; dropped before loading into a trunk.
HEAD_PREFIXES: tuple[str, ...] = ("last_linear.", "fc.")

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


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


class TrunkRegistry(Registry[Trunk]):
    """The trunk registry, plus name prefixes: ``timm:<model>`` is resolved by the handler
    registered for ``timm`` (:mod:`mlrc.models.timm_trunk`), not by a fixed entry."""

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


def _timm_entry(model_name: str) -> Entry:
    from mlrc.models.timm_trunk import timm_entry  # noqa: PLC0415 - imports timm lazily

    return timm_entry(model_name)


TRUNKS = TrunkRegistry("trunk", group="mlrc.trunks")
TRUNKS.register_prefix("timm", _timm_entry)


def _copy_spec(spec: InputSpec) -> InputSpec:
    """A per-instance copy, so editing one model's spec never changes the class default."""
    return InputSpec(
        mean=list(spec["mean"]),
        std=list(spec["std"]),
        input_range=spec["input_range"],
        bgr=spec["bgr"],
    )


# --------------------------------------------------------------------------------------------
# Weight loading


def weights_cache_dir() -> Path:
    """Download cache: ``$MLRC_CACHE/weights``, :func:`mlrc.paths.weights_dir`."""
    return paths.weights_dir()


def _examples(keys: set[str], n: int = 3) -> str:
    shown = ", ".join(sorted(keys)[:n])
    return shown + (", ..." if len(keys) > n else "")


def _matched_state_dict(
    module: nn.Module, state: Mapping[str, Tensor], source: str
) -> dict[str, Tensor]:
    """Drop head keys, fix legacy details, and check names/shapes; ValueError on any mismatch.

    Legacy details tolerated: BatchNorm ``num_batches_tracked`` absent (checkpoints older than
    torch 0.4.1; the module's current counter is kept) and BatchNorm vectors stored as ``(1, C)``
    (some BN-Inception ports) instead of ``(C,)``.
    """
    own = module.state_dict()
    got = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
    for k, v in own.items():
        if k.endswith("num_batches_tracked") and k not in got:
            got[k] = v
    missing = set(own) - set(got)
    unexpected = set(got) - set(own)
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys ({_examples(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys ({_examples(unexpected)})")
    bad_shapes = []
    for k in sorted(set(own) & set(got)):
        want, have = own[k].shape, got[k].shape
        if want == have:
            continue
        if len(want) == 1 and len(have) == 2 and have[0] == 1 and have[1] == want[0]:
            got[k] = got[k].reshape(want)
            continue
        bad_shapes.append(f"{k} {tuple(have)} vs {tuple(want)}")
    if bad_shapes:
        more = ", ..." if len(bad_shapes) > 3 else ""
        problems.append(
            f"{len(bad_shapes)} shape mismatches, file vs model ({', '.join(bad_shapes[:3])}{more})"
        )
    if problems:
        raise ValueError(
            f"weights {source} do not fit {type(module).__name__}: {'; '.join(problems)}"
        )
    return got


def _check_is_state_dict(obj: object, source: str) -> Mapping[str, Tensor]:
    if not isinstance(obj, Mapping) or not obj:
        raise ValueError(
            f"weights {source} are not a state dict (got {type(obj).__name__}); "
            "expected a flat mapping of parameter name to tensor"
        )
    for k, v in obj.items():
        if not isinstance(k, str) or not isinstance(v, Tensor):
            raise ValueError(
                f"weights {source} are not a state dict: entry {k!r} is "
                f"{type(v).__name__}, expected a tensor under a string name"
            )
    return obj


def load_weights(
    module: nn.Module, pretrained: bool | str | os.PathLike[str], url: str, hash_prefix: str
) -> None:
    """Load weights into ``module`` in place, strictly, after dropping classifier-head keys.

    ``pretrained``: ``False`` does nothing; a path loads that local state-dict file with
    ``torch.load(path, map_location="cpu", weights_only=True)``; ``True`` downloads ``url`` into
    :func:`weights_cache_dir` (once, as ``torch.hub.load_state_dict_from_url`` would, without
    its "Downloading" line) with torch.hub's downloader, which checks that the file's sha-256
    starts with the hash in its name; ``hash_prefix`` must be that hash (a guard against a URL
    whose name carries no or another hash, which torch.hub would not check).

    Raises ``ValueError`` with a one-line message naming the file for a missing or unreadable
    file, a file that is not a state dict, a failed download, or keys/shapes that don't match.
    """
    if pretrained is False:
        return
    if pretrained is True:
        name = url.rsplit("/", 1)[-1]
        found = re.search(r"-([a-f0-9]+)\.", name)
        if not hash_prefix or found is None or not found.group(1).startswith(hash_prefix):
            raise ValueError(
                f"weights URL {url} does not carry the expected sha-256 prefix {hash_prefix!r} "
                "in its file name, so its download could not be checked"
            )
        cache = weights_cache_dir()
        source = f"{url} (cache {cache})"
        try:
            cache.mkdir(parents=True, exist_ok=True)
            path = cache / name
            if not path.is_file():  # torch.hub's cache layout; no "Downloading" line on stderr
                torch.hub.download_url_to_file(url, str(path), found.group(1), progress=False)
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # network, hash mismatch, unreadable download
            raise ValueError(
                f"could not get weights {source}: {type(exc).__name__}: {first_line(exc, '(no message)')} "
                "(download it by hand and pass its local path instead)"
            ) from exc
    elif isinstance(pretrained, str | os.PathLike):
        path = Path(pretrained).expanduser()
        source = str(path)
        if not path.is_file():
            raise ValueError(f"weights file {source} does not exist")
        if path.stat().st_size == 0:
            raise ValueError(f"weights file {source} is empty (0 bytes)")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt, truncated, not a torch file, unsafe pickle
            raise ValueError(
                f"weights file {source} is not a readable torch state dict: "
                f"{type(exc).__name__}: {first_line(exc, '(no message)')}"
            ) from exc
    else:
        raise ValueError(
            f"pretrained must be False, True or a path to a .pth file, not {pretrained!r}"
        )
    state = _matched_state_dict(module, _check_is_state_dict(obj, source), source)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # should not happen after the checks above
        raise ValueError(
            f"weights {source} failed to load: {first_line(exc, '(no message)')}"
        ) from exc


def check_weights(name: str, pretrained: Any) -> None:
    """Resolve the weights trunk ``name`` loads for ``pretrained`` without building the trunk:
    its own factory runs on the meta device (parameters without memory or initialisation), so
    the file is found (for ``True``: downloaded into the cache first when absent, as a fold
    would), read, and its names and shapes matched against the trunk by the very code a fold
    runs; a missing or empty file, a failed download, a file that is no state dict or does not
    fit, or weights for a trunk that takes none is the same one-line ``ValueError``. A trunk
    that cannot be built on the meta device is built on the CPU instead; so is one whose meta
    check finds a mismatch (a timm checkpoint converter may need real tensors): the real load
    decides. ``pretrained`` false: nothing to resolve."""
    import warnings

    if pretrained is False or pretrained is None:
        return
    factory = TRUNKS.get(name)
    try:
        with torch.device("meta"):
            factory(pretrained=False)
    except Exception:  # noqa: BLE001 - no meta build for this trunk: the real one decides
        factory(pretrained=pretrained)
        return
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # loading into meta parameters is a no-op (warned)
            factory(pretrained=pretrained)
    except ValueError as e:
        if " do not fit " not in str(e):
            raise
        factory(pretrained=pretrained)


# --------------------------------------------------------------------------------------------
# BN-Inception (Ioffe & Szegedy 2015), as ported by Cadene's `pretrainedmodels`

# name, in_ch, 1x1, 3x3 reduce, 3x3, double-3x3 reduce, double-3x3, pool kind, pool proj, stride
# pool kind: "avg" = AvgPool(3, s1, p1); "max2" = MaxPool(3, s2); "max1" = MaxPool(3, s1, p1).
_BLOCKS: tuple[tuple[str, int, int | None, int, int, int, int, str, int | None, int], ...] = (
    ("3a", 192, 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 256, 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 320, None, 128, 160, 64, 96, "max2", None, 2),
    ("4a", 576, 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 576, 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 576, 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 608, 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 608, None, 128, 192, 192, 256, "max2", None, 2),
    ("5a", 1056, 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 1024, 352, 192, 320, 192, 224, "max1", 128, 1),
)


class BNInception(Trunk):
    """BN-Inception trunk: 1024-D, BGR 0–255 input, mean (104, 117, 128), std 1.

    Module and parameter names are exactly those of ``pretrainedmodels.models.BNInception``
    (flat attributes such as ``inception_3a_1x1`` / ``inception_3a_1x1_bn`` /
    ``inception_3a_relu_1x1``), so the Cadene ImageNet checkpoint loads strictly once its
    ``last_linear`` is dropped. All BatchNorms use torch defaults (eps 1e-5, momentum 0.1), all
    pooling uses ``ceil_mode=True`` as in the original. ``global_pool`` is an adaptive average
    over the final map (the original's ``AvgPool2d(7)`` equals it for 224–231 px inputs, whose
    final map is 7 × 7).
    """

    output_size = 1024
    input_spec: InputSpec = {
        "mean": [104.0, 117.0, 128.0],
        "std": [1.0, 1.0, 1.0],
        "input_range": 255,
        "bgr": True,
    }

    def __init__(self) -> None:
        super().__init__()
        self.input_spec = _copy_spec(BNInception.input_spec)
        # Call plan: a str is a pooling attribute, a pair is (conv attribute, relu attribute) of
        # a conv → BN (conv + "_bn") → ReLU unit. Plain Python data, so not in the state dict.
        self._blocks: list[tuple[str, list[list[str | tuple[str, str]]]]] = []
        self._stem: list[str | tuple[str, str]] = [
            self._unit("conv1_7x7_s2", "conv1_relu_7x7", 3, 64, 7, 2, 3),
            self._pool("pool1_3x3_s2", "max2"),
            self._unit("conv2_3x3_reduce", "conv2_relu_3x3_reduce", 64, 64, 1, 1, 0),
            self._unit("conv2_3x3", "conv2_relu_3x3", 64, 192, 3, 1, 1),
            self._pool("pool2_3x3_s2", "max2"),
        ]
        for name, cin, c1, c3r, c3, cdr, cd, pool, proj, stride in _BLOCKS:
            p = f"inception_{name}_"
            branches: list[list[str | tuple[str, str]]] = []
            if c1 is not None:
                branches.append([self._unit(p + "1x1", p + "relu_1x1", cin, c1, 1, 1, 0)])
            branches.append(
                [
                    self._unit(p + "3x3_reduce", p + "relu_3x3_reduce", cin, c3r, 1, 1, 0),
                    self._unit(p + "3x3", p + "relu_3x3", c3r, c3, 3, stride, 1),
                ]
            )
            branches.append(
                [
                    self._unit(p + "double_3x3_reduce", p + "relu_double_3x3_reduce", cin, cdr),
                    self._unit(p + "double_3x3_1", p + "relu_double_3x3_1", cdr, cd, 3, 1, 1),
                    self._unit(p + "double_3x3_2", p + "relu_double_3x3_2", cd, cd, 3, stride, 1),
                ]
            )
            pool_branch: list[str | tuple[str, str]] = [self._pool(p + "pool", pool)]
            if proj is not None:
                pool_branch.append(self._unit(p + "pool_proj", p + "relu_pool_proj", cin, proj))
            branches.append(pool_branch)
            self._blocks.append((name, branches))
        self.global_pool = nn.AdaptiveAvgPool2d(1)

    def _unit(
        self, conv: str, relu: str, cin: int, cout: int, k: int = 1, s: int = 1, pad: int = 0
    ) -> tuple[str, str]:
        """Register ``conv`` (with bias), ``conv + "_bn"`` and ``relu`` as in the original."""
        setattr(self, conv, nn.Conv2d(cin, cout, kernel_size=k, stride=s, padding=pad))
        setattr(self, conv + "_bn", nn.BatchNorm2d(cout, affine=True))
        setattr(self, relu, nn.ReLU(inplace=True))
        return conv, relu

    def _pool(self, name: str, kind: str) -> str:
        if kind == "avg":
            pool: nn.Module = nn.AvgPool2d(
                3, stride=1, padding=1, ceil_mode=True, count_include_pad=True
            )
        elif kind == "max2":
            pool = nn.MaxPool2d((3, 3), stride=(2, 2), dilation=(1, 1), ceil_mode=True)
        elif kind == "max1":
            pool = nn.MaxPool2d(
                (3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), ceil_mode=True
            )
        else:  # pragma: no cover - table typo
            raise ValueError(f"unknown pool kind {kind!r}")
        setattr(self, name, pool)
        return name

    def _run(self, steps: list[str | tuple[str, str]], x: Tensor) -> Tensor:
        for step in steps:
            if isinstance(step, str):
                x = getattr(self, step)(x)
            else:
                conv, relu = step
                x = getattr(self, relu)(getattr(self, conv + "_bn")(getattr(self, conv)(x)))
        return x

    def features(self, x: Tensor) -> Tensor:
        """The 1024-channel map before pooling, ``(N, 1024, H/32, W/32)`` (rounded up)."""
        x = self._run(self._stem, x)
        for _name, branches in self._blocks:
            x = torch.cat([self._run(branch, x) for branch in branches], dim=1)
        return x

    def forward(self, x: Tensor) -> Tensor:
        return self.global_pool(self.features(x)).flatten(1)


@TRUNKS.register("bninception")
def bninception(*, pretrained: bool | str = False) -> Trunk:
    """BN-Inception, 1024-D; ``pretrained=True``: Cadene's ImageNet weights."""
    model = BNInception()
    load_weights(model, pretrained, BN_INCEPTION_URL, BN_INCEPTION_HASH)
    return model


# --------------------------------------------------------------------------------------------
# ResNet-50


class ResNet50Trunk(ResNet, Trunk):
    """torchvision ResNet-50 with ``fc = Identity``: 2048-D, RGB 0–1, ImageNet mean/std.

    Parameter names are torchvision's, so its checkpoints load once ``fc.*`` is dropped.
    """

    output_size = 2048
    input_spec: InputSpec = {
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "input_range": 1,
        "bgr": False,
    }

    def __init__(self) -> None:
        super().__init__(Bottleneck, [3, 4, 6, 3])
        self.fc = nn.Identity()
        self.input_spec = _copy_spec(ResNet50Trunk.input_spec)


@TRUNKS.register("resnet50")
def resnet50(*, pretrained: bool | str = False) -> Trunk:
    """ResNet-50, 2048-D; ``pretrained=True``: ``ResNet50_Weights.IMAGENET1K_V1``."""
    model = ResNet50Trunk()
    load_weights(model, pretrained, ResNet50_Weights.IMAGENET1K_V1.url, RESNET50_HASH)
    return model


# --------------------------------------------------------------------------------------------
# Small CPU trunk


class SmallCNN(Trunk):
    """4 × (Conv3x3 → BN → ReLU → MaxPool2), widths 32/64/128/256, global average pool: 256-D.

    Random init only. Any input of at least 16 × 16 px; RGB 0–1, mean 0.5, std 0.5.
    """

    output_size = 256
    input_spec: InputSpec = {
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "input_range": 1,
        "bgr": False,
    }
    widths: tuple[int, ...] = (32, 64, 128, 256)

    def __init__(self, widths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.widths = tuple(widths or self.widths)
        self.output_size = self.widths[-1]
        self.input_spec = _copy_spec(SmallCNN.input_spec)
        layers: list[nn.Module] = []
        cin = 3
        for w in self.widths:
            layers += [
                nn.Conv2d(cin, w, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            cin = w
        self.body = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.body(x)).flatten(1)


@TRUNKS.register("small_cnn")
def small_cnn(*, pretrained: bool | str = False) -> Trunk:
    """The CPU preset's trunk, 256-D, random init; any ``pretrained`` but False is an error."""
    if pretrained is not False:
        raise ValueError(
            f"trunk 'small_cnn' has no pretrained weights (got pretrained={pretrained!r}); "
            "use pretrained=False"
        )
    return SmallCNN()


@TRUNKS.register("tiny_cnn")
def tiny_cnn(*, pretrained: bool | str = False) -> Trunk:
    """``small_cnn`` at half width (16/32/64/128 → 128-D): the ``cpu`` preset's trunk."""
    if pretrained is not False:
        raise ValueError(
            f"trunk 'tiny_cnn' has no pretrained weights (got pretrained={pretrained!r}); "
            "use pretrained=False"
        )
    return SmallCNN(widths=(16, 32, 64, 128))


# --------------------------------------------------------------------------------------------
# Training helpers


def freeze_batchnorm(module: nn.Module) -> int:
    """Put every BatchNorm in ``module`` in eval mode; returns how many there are.

    In eval mode a BatchNorm normalises with its stored running mean/var and no longer updates
    them; its affine weight and bias are untouched and keep ``requires_grad`` (they still train).
    ``model.train()`` undoes this, so call ``freeze_batchnorm(model)`` after every
    ``model.train()``.
    """
    n = 0
    for m in module.modules():
        if isinstance(m, _BATCHNORMS):
            m.eval()
            n += 1
    return n


class Embedder(nn.Module):
    """The embedding head: one ``nn.Linear(in_features, embedding_size)``, no ReLU, no norm.

    Any L2 normalisation belongs to the loss/distance, not here.
    """

    def __init__(self, in_features: int, embedding_size: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.output_size = embedding_size
        self.linear = nn.Linear(in_features, embedding_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)
