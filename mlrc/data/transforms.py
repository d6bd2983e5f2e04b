"""Image transforms of the protocol, adapted to the trunk's input convention."""

from __future__ import annotations

import functools

import torch
from torchvision import transforms as T
from torchvision.transforms import functional as F


class ToTrunkInput:
    """RGB PIL image (uint8) → float32 CHW tensor in the trunk's convention: values scaled to
    ``input_range`` (1 or 255), channels RGB or BGR, then ``(x − mean) / std``.

    The same float32 operations, in the same order, as ``ToTensor → ×range → [BGR] → Normalize``
    (bit-identical, tested), in one step: the channel swap happens on uint8. Split in two for
    the training loop: :class:`ToUint8Input` on the CPU, :func:`to_trunk_input` on the device."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.to_uint8 = ToUint8Input(spec)

    def __call__(self, pic: object) -> torch.Tensor:
        return to_trunk_input(self.to_uint8(pic), self.spec)


class ToUint8Input:
    """RGB PIL image → uint8 CHW tensor in the trunk's channel order (RGB or BGR), 0–255."""

    def __init__(self, spec: dict) -> None:
        self.bgr = bool(spec["bgr"])

    def __call__(self, pic: object) -> torch.Tensor:
        x = F.pil_to_tensor(pic)
        return x.flip(0) if self.bgr else x


def to_trunk_input(x: torch.Tensor, spec: dict) -> torch.Tensor:
    """uint8 (…, 3, H, W) from :class:`ToUint8Input` → the trunk's float32 input, on ``x``'s
    device: ``(x / 255 · input_range − mean) / std``, elementwise, so the same bits on any
    device and for a batch as for one image. A float tensor passes through unchanged."""
    if x.dtype != torch.uint8:
        return x
    mean, std = _constants(tuple(spec["mean"]), tuple(spec["std"]), x.device)
    return x.float().div_(255).mul_(float(spec["input_range"])).sub_(mean).div_(std)


def batch_to_trunk_input(
    x: torch.Tensor, spec: dict, device: str | torch.device, non_blocking: bool = False
) -> torch.Tensor:
    """A loader's batch (uint8 CHW from the CPU) → the trunk's float32 input on ``device``:
    copied (asynchronously from pinned memory with ``non_blocking``), then normalised there by
    :func:`to_trunk_input`. The one place a fold's batches go to the device."""
    return to_trunk_input(x.to(device, non_blocking=non_blocking), spec)


@functools.lru_cache(maxsize=64)
def _constants(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) as float32 (C, 1, 1) tensors on ``device``, built once per device: a host →
    device copy per batch would make every training step wait for the host."""
    return (
        torch.tensor(mean, dtype=torch.float32, device=device).view(-1, 1, 1),
        torch.tensor(std, dtype=torch.float32, device=device).view(-1, 1, 1),
    )


def train_transform(
    resize: int,
    crop: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
    input_spec: dict,
    uint8: bool = False,
) -> T.Compose:
    """Resize(resize) → RandomResizedCrop(crop, scale, ratio) → [flip] → trunk input
    (``uint8``: stop at uint8 CHW; finish with :func:`to_trunk_input` on the batch)."""
    steps = [T.Resize(resize), T.RandomResizedCrop(crop, scale=tuple(scale), ratio=tuple(ratio))]
    if flip:
        steps.append(T.RandomHorizontalFlip(0.5))
    return T.Compose(steps + _tail(input_spec, uint8))


def eval_transform(resize: int, crop: int, input_spec: dict, uint8: bool = False) -> T.Compose:
    """Resize(resize) → CenterCrop(crop) → trunk input (``uint8``: as in train_transform)."""
    return T.Compose([T.Resize(resize), T.CenterCrop(crop)] + _tail(input_spec, uint8))


def _tail(spec: dict, uint8: bool) -> list:
    return [ToUint8Input(spec) if uint8 else ToTrunkInput(spec)]
