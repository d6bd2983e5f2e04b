"""Image transforms of the protocol, adapted to the trunk's input convention.

Two families give the same tensors (bit for bit, tested against torchvision):

* :func:`train_transform` / :func:`eval_transform`: torchvision's chains on PIL images, for any
  dataset (``Resize → RandomResizedCrop → flip`` and ``Resize → CenterCrop``);
* for a decoded cache's uint8 HWC arrays (:mod:`mlrc.data.cache`): :class:`CachedTrainTransform`
  (images already resized: the same torch RNG draws, the crop sliced in numpy so only the crop
  region becomes a PIL image, the flip and channel swap on the uint8 tensor) and
  :class:`ArrayToUint8Input` (the evaluation crops, already cropped: only the layout step).

Why the crop's resize stays in PIL: torchvision's uint8 *tensor* ``resized_crop`` (bilinear,
``antialias=True``) is not bit-identical to PIL's bilinear resize (it rounds differently: pixels
differ by 1–2 levels), so it would change a fold's numbers; ``tests/data/test_input_pipeline.py::
test_uint8_tensor_resize_is_not_pil_so_training_crops_stay_in_pil`` decides this, and fails if a
later torchvision makes them equal.

Opt-in, numbers change (``augment_on_device: true``, by interpolation noise): the workers draw
the same crop and flip and send the crop region, uncropped and unresized, padded into a fixed
canvas (:class:`DeviceCropTransform` → :class:`DeviceCrop`); :func:`batch_to_trunk_input`
resizes it (torchvision's tensor ``resize``, bilinear, antialias) and flips it on the device.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
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


class ArrayToUint8Input:
    """uint8 ``(H, W, 3)`` RGB image (a cache's array view, or a PIL image) → uint8 CHW tensor in
    the trunk's channel order: :class:`ToUint8Input`'s tensor (same values, same strides: a
    permuted view of an HWC copy) with no PIL image made of an array."""

    def __init__(self, spec: dict) -> None:
        self.bgr = bool(spec["bgr"])

    def __call__(self, pic: object) -> torch.Tensor:
        x = hwc_to_chw(pic)
        return x.flip(0) if self.bgr else x


def hwc_to_chw(pic: object) -> torch.Tensor:
    """uint8 ``(H, W, 3)`` array or RGB PIL image → uint8 ``(3, H, W)`` tensor, as
    ``pil_to_tensor`` makes it (a copy, permuted)."""
    return torch.from_numpy(np.array(pic, dtype=np.uint8, copy=True)).permute(2, 0, 1)


class CachedTrainTransform:
    """``train_transform(resize, crop, scale, ratio, flip, spec, uint8=True)`` for images already
    ``Resize(resize)``-d (a decoded cache's uint8 HWC arrays; PIL images are accepted too):
    bit-identical tensors, leaving the torch RNG in the same state.

    ``Resize`` leaves such an image as it is, so it is skipped; then the same draws in the same
    order (``RandomResizedCrop.get_params``, then the flip's ``torch.rand(1) < 0.5``), the crop
    sliced in numpy (only the crop region becomes a PIL image), resized by PIL exactly as
    torchvision's PIL path does (``img.resize((w, h), BILINEAR)``, skipped when the crop already
    has the output size), flipped and channel-swapped on the uint8 pixels in the one copy that
    makes the tensor. An image whose
    shorter edge is not ``resize`` is a ``ValueError`` (it would need the resize)."""

    def __init__(
        self,
        resize: int,
        crop: int,
        scale: tuple[float, float],
        ratio: tuple[float, float],
        flip: bool,
        spec: dict,
    ) -> None:
        self.resize, self.flip, self.bgr = resize, flip, bool(spec["bgr"])
        self.rrc = T.RandomResizedCrop(crop, scale=tuple(scale), ratio=tuple(ratio))
        self.pil_interpolation = F.pil_modes_mapping[self.rrc.interpolation]

    def __call__(self, pic: object) -> torch.Tensor:
        a = np.asarray(pic)
        height, width = a.shape[:2]
        if min(height, width) != self.resize:
            raise ValueError(
                f"CachedTrainTransform: image of {width}x{height} px, not resized to {self.resize}"
            )
        shape_only = torch.empty(()).expand(3, height, width)  # what get_params reads: the size
        i, j, h, w = self.rrc.get_params(shape_only, self.rrc.scale, self.rrc.ratio)
        out_h, out_w = self.rrc.size
        im = Image.fromarray(a[i : i + h, j : j + w])  # = PIL's crop((j, i, j + w, i + h))
        if (h, w) != (out_h, out_w):  # torchvision returns an image of the right size as it is
            im = im.resize((out_w, out_h), self.pil_interpolation)
        out = np.asarray(im)
        if self.flip and torch.rand(1) < 0.5:  # RandomHorizontalFlip(0.5)'s draw
            out = out[:, ::-1]
        if self.bgr:
            out = out[..., ::-1]
        return hwc_to_chw(out)  # one copy: flipped, swapped, laid out as pil_to_tensor's


class DeviceCrop(NamedTuple):
    """A training image whose crop is resized on the device (``augment_on_device``): the crop
    region, uint8 CHW in the trunk's channel order, at the top left of a zero ``canvas``
    (3, L, L), and ``params`` int64 (h, w, flip 0/1, output side). The default collate makes a
    batch of them one ``DeviceCrop`` of (B, 3, L, L) and (B, 4)."""

    canvas: torch.Tensor
    params: torch.Tensor


class DeviceCropTransform:
    """The CPU half of ``augment_on_device`` for images already ``Resize(resize)``-d (arrays or
    PIL): the very draws of :class:`CachedTrainTransform` (same torch RNG calls, same order,
    so the same crop boxes and flips), the crop region sliced and padded into a ``canvas`` ×
    ``canvas`` uint8 image (``canvas`` ≥ the longer edge of every resized image), channels in
    the trunk's order; the resize and flip wait for :func:`batch_to_trunk_input`."""

    def __init__(
        self,
        resize: int,
        crop: int,
        scale: tuple[float, float],
        ratio: tuple[float, float],
        flip: bool,
        spec: dict,
        canvas: int,
    ) -> None:
        self.cpu = CachedTrainTransform(resize, crop, scale, ratio, flip, spec)
        self.canvas = canvas

    def __call__(self, pic: object) -> DeviceCrop:
        t = self.cpu
        a = np.asarray(pic)
        height, width = a.shape[:2]
        if min(height, width) != t.resize or max(height, width) > self.canvas:
            raise ValueError(
                f"DeviceCropTransform: image of {width}x{height} px, not resized to {t.resize} "
                f"or larger than the {self.canvas} px canvas"
            )
        shape_only = torch.empty(()).expand(3, height, width)
        i, j, h, w = t.rrc.get_params(shape_only, t.rrc.scale, t.rrc.ratio)
        flipped = bool(t.flip and torch.rand(1) < 0.5)
        region = a[i : i + h, j : j + w]
        canvas = torch.zeros((3, self.canvas, self.canvas), dtype=torch.uint8)
        pixels = np.array(region[..., ::-1] if t.bgr else region)  # a copy, HWC
        canvas[:, :h, :w] = torch.from_numpy(pixels).permute(2, 0, 1)
        params = torch.tensor([h, w, int(flipped), t.rrc.size[0]], dtype=torch.int64)
        return DeviceCrop(canvas, params)


def crops_on_device(
    batch: DeviceCrop, device: str | torch.device, non_blocking: bool = False
) -> torch.Tensor:
    """A :class:`DeviceCrop` batch → uint8 (B, 3, S, S) on ``device``: each region resized by
    torchvision's tensor ``resize`` (bilinear, antialias; float, rounded back to uint8), then
    flipped. The parameters are read on the host (no device sync)."""
    canvas = batch.canvas.to(device, non_blocking=non_blocking)
    out = []
    for k, (h, w, flipped, side) in enumerate(batch.params.tolist()):
        x = F.resize(canvas[k, :, :h, :w], [side, side], antialias=True)
        out.append(x.flip(-1) if flipped else x)
    return torch.stack(out)


def to_trunk_input(x: torch.Tensor, spec: dict) -> torch.Tensor:
    """uint8 (…, 3, H, W) from :class:`ToUint8Input` → the trunk's float32 input, on ``x``'s
    device: ``(x / 255 · input_range − mean) / std``, elementwise, so the same bits on any
    device and for a batch as for one image. A float tensor passes through unchanged."""
    if x.dtype != torch.uint8:
        return x
    mean, std = _constants(tuple(spec["mean"]), tuple(spec["std"]), x.device)
    return x.float().div_(255).mul_(float(spec["input_range"])).sub_(mean).div_(std)


def batch_to_trunk_input(
    x: torch.Tensor | DeviceCrop,
    spec: dict,
    device: str | torch.device,
    non_blocking: bool = False,
) -> torch.Tensor:
    """A loader's batch (uint8 CHW from the CPU) → the trunk's float32 input on ``device``:
    copied (asynchronously from pinned memory with ``non_blocking``), then normalised there by
    :func:`to_trunk_input`; a :class:`DeviceCrop` batch (``augment_on_device``) is cropped,
    resized and flipped there first (:func:`crops_on_device`). The one place a fold's batches
    go to the device."""
    if isinstance(x, DeviceCrop):
        return to_trunk_input(crops_on_device(x, device, non_blocking), spec)
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


def cached_train_transform(
    resize: int,
    crop: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
    input_spec: dict,
) -> CachedTrainTransform:
    """:func:`train_transform` (``uint8=True``) for a decoded cache's arrays: the same tensors."""
    return CachedTrainTransform(resize, crop, scale, ratio, flip, input_spec)


def _tail(spec: dict, uint8: bool) -> list:
    return [ToUint8Input(spec) if uint8 else ToTrunkInput(spec)]
