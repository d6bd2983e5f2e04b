"""The BN-Inception trunk (Ioffe & Szegedy 2015) as ported by Cadene's ``pretrainedmodels``,
registered as ``bninception``.

Input and output conventions: :mod:`mlrc.models.base`. ``pretrained=True`` loads Cadene's
ImageNet weights (:data:`BN_INCEPTION_URL`) through :func:`mlrc.models.weights.load_weights`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mlrc.models.base import TRUNKS, InputSpec, Trunk, copy_spec
from mlrc.models.weights import load_weights

__all__ = ["BN_INCEPTION_HASH", "BN_INCEPTION_URL", "BNInception", "bninception"]

BN_INCEPTION_URL = "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth"
BN_INCEPTION_HASH = "52deb4733"


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
        self.input_spec = copy_spec(BNInception.input_spec)
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
