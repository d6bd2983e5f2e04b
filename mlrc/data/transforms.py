"""Image transforms of the protocol, adapted to the trunk's input convention."""

from __future__ import annotations

import torch
from torchvision import transforms as T


class _ToTrunkInput:
    """Tensor in [0, 1] RGB → the trunk's range (1 or 255) and channel order (RGB or BGR)."""

    def __init__(self, input_range: float, bgr: bool) -> None:
        self.input_range, self.bgr = float(input_range), bool(bgr)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.input_range
        return x[[2, 1, 0]] if self.bgr else x


def train_transform(
    resize: int,
    crop: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
    input_spec: dict,
) -> T.Compose:
    """Resize(resize) → RandomResizedCrop(crop, scale, ratio) → [flip] → trunk input."""
    steps = [T.Resize(resize), T.RandomResizedCrop(crop, scale=tuple(scale), ratio=tuple(ratio))]
    if flip:
        steps.append(T.RandomHorizontalFlip(0.5))
    return T.Compose(steps + _tail(input_spec))


def eval_transform(resize: int, crop: int, input_spec: dict) -> T.Compose:
    """Resize(resize) → CenterCrop(crop) → trunk input."""
    return T.Compose([T.Resize(resize), T.CenterCrop(crop)] + _tail(input_spec))


def _tail(spec: dict) -> list:
    return [
        T.ToTensor(),
        _ToTrunkInput(spec["input_range"], spec["bgr"]),
        T.Normalize(spec["mean"], spec["std"]),
    ]
