"""Image transforms of the protocol, adapted to the trunk's input convention."""

from __future__ import annotations

import torch
from torchvision import transforms as T
from torchvision.transforms import functional as F


class ToTrunkInput:
    """RGB PIL image (uint8) → float32 CHW tensor in the trunk's convention: values scaled to
    ``input_range`` (1 or 255), channels RGB or BGR, then ``(x − mean) / std``.

    The same float32 operations, in the same order, as ``ToTensor → ×range → [BGR] → Normalize``
    (bit-identical, tested), in one step: the channel swap happens on uint8."""

    def __init__(self, spec: dict) -> None:
        self.input_range, self.bgr = float(spec["input_range"]), bool(spec["bgr"])
        self.mean = torch.tensor(spec["mean"], dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(spec["std"], dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, pic: object) -> torch.Tensor:
        x = F.pil_to_tensor(pic)
        if self.bgr:
            x = x.flip(0)
        return x.float().div_(255).mul_(self.input_range).sub_(self.mean).div_(self.std)


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
    return [ToTrunkInput(spec)]
