"""The network a fold trains: trunk → embedder, and the ways to build or load it."""

from __future__ import annotations

from pathlib import Path

import torch

from mlrc.config import Preset
from mlrc.models import TRUNKS
from mlrc.models.embedder import Embedder
from mlrc.models.freezing import freeze_layernorm


class Model(torch.nn.Module):
    """Trunk → Embedder (one Linear, no ReLU). Outputs are *not* normalised, always float32.

    ``fast_paths`` sets the preset's mixed precision (autocast of the forward pass only: losses
    and metrics stay in float32) and channels_last memory format; neither changes the weights'
    names, so checkpoints are the same either way."""

    def __init__(self, trunk: torch.nn.Module, embedder: torch.nn.Module) -> None:
        super().__init__()
        self.trunk, self.embedder = trunk, embedder
        self.amp_dtype: torch.dtype | None = None
        self.channels_last = False

    def fast_paths(self, amp: str, channels_last: bool) -> Model:
        """Use the preset's ``amp`` (a key of :data:`AMP_DTYPES`) and memory format; returns
        ``self``."""
        self.amp_dtype = AMP_DTYPES[amp]
        self.channels_last = channels_last
        if channels_last:
            self.to(memory_format=torch.channels_last)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.amp_dtype is None:
            return self.embedder(self.trunk(x))
        with torch.autocast(x.device.type, dtype=self.amp_dtype):
            return self.embedder(self.trunk(x)).float()


AMP_DTYPES: dict[str, torch.dtype | None] = {
    "off": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def build_model(preset: Preset, *, pretrained: bool | str | None = None) -> Model:
    """The preset's trunk and a fresh embedder (drawn from the current torch RNG);
    ``pretrained`` overrides the preset's trunk weights (``False``: none)."""
    trunk = preset_trunk(preset, preset.pretrained if pretrained is None else pretrained)
    return Model(trunk, Embedder(trunk.output_size, preset.embedding_size))


def preset_trunk(preset: Preset, pretrained: object) -> torch.nn.Module:
    """The preset's trunk with ``pretrained`` weights, its ``normalize`` (if set) replacing the
    trunk's own mean/std, its LayerNorms frozen if the preset says so."""
    trunk = TRUNKS.get(preset.trunk)(pretrained=pretrained)
    if preset.normalize is not None:
        trunk.input_spec = {
            **trunk.input_spec,
            "mean": list(preset.normalize.mean),
            "std": list(preset.normalize.std),
        }
    if preset.freeze_layernorm:
        freeze_layernorm(trunk)
    return trunk


UNTRAINED_SEED = 0  # the random draw of an untrained trunk trained from scratch (baseline row)


def untrained_trunk(preset: Preset) -> Model:
    """The preset's trunk before any training, alone (no embedder; outputs its pooled features,
    not normalised): the reference's "untrained_trunk" (epoch −1). ImageNet weights when the
    preset has ``pretrained``; else randomly initialised from :data:`UNTRAINED_SEED`."""
    torch.manual_seed(UNTRAINED_SEED)
    trunk = preset_trunk(preset, preset.pretrained)
    return Model(trunk, torch.nn.Identity()).eval()


def load_model(preset: Preset, checkpoint: str | Path, device: str = "cpu") -> Model:
    """A fold's best model from its ``best.pt`` (no pretrained download: weights come from it)."""
    model = build_model(preset, pretrained=False)
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return model.to(device).eval()
