"""The ResNet-50 trunk (torchvision's, without its classifier), registered as ``resnet50``.

Input and output conventions: :mod:`mlrc.models.base`. ``pretrained=True`` loads torchvision's
``ResNet50_Weights.IMAGENET1K_V1`` through :func:`mlrc.models.weights.load_weights`.
"""

from __future__ import annotations

from torch import nn
from torchvision.models import ResNet, ResNet50_Weights
from torchvision.models.resnet import Bottleneck

from mlrc.models.base import TRUNKS, InputSpec, Trunk, copy_spec
from mlrc.models.weights import load_weights

__all__ = ["RESNET50_HASH", "ResNet50Trunk", "resnet50"]

RESNET50_HASH = "0676ba61"  # ResNet50_Weights.IMAGENET1K_V1: .../models/resnet50-0676ba61.pth


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
        self.input_spec = copy_spec(ResNet50Trunk.input_spec)


@TRUNKS.register("resnet50")
def resnet50(*, pretrained: bool | str = False) -> Trunk:
    """ResNet-50, 2048-D; ``pretrained=True``: ``ResNet50_Weights.IMAGENET1K_V1``."""
    model = ResNet50Trunk()
    load_weights(model, pretrained, ResNet50_Weights.IMAGENET1K_V1.url, RESNET50_HASH)
    return model
