"""A trained study's model for use outside mlrc: the best reproduction's fold models as one
module whose output is MLRC's test-time embedding — L2-normalised, 128-D (one fold model) or
512-D (the four fold models' normalised embeddings concatenated and normalised again, the
"concatenated" mode of the reality check).

Two file formats:

- ``state-dict`` (``.pt``): the fold models' weights, the resolved preset and what they were
  trained on; :func:`load_exported` rebuilds the module (needs mlrc installed);
- ``export`` (``.pt2``): a ``torch.export`` program of the same module (batch size free), loaded
  with ``torch.export.load(path).module()`` — torch alone, no mlrc.

Either takes the trunk's float input: images resized to ``image.resize``, centre-cropped to
``image.crop`` and normalised as ``(x / 255 · input_range − mean) / std`` per channel (the
file's ``input`` entry), N × 3 × crop × crop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlrc.config import Preset
from mlrc.train.model import Model, build_model, load_model

__all__ = ["FORMAT", "EmbeddingModel", "export_model", "load_exported"]

FORMAT = "mlrc-model/1"


class EmbeddingModel(torch.nn.Module):
    """Fold models → the test-time embedding: each output L2-normalised; with several models,
    concatenated and normalised again (MLRC's concatenated mode). Float32, eval mode."""

    def __init__(self, models: list[Model]) -> None:
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [F.normalize(m(x).float(), dim=1) for m in self.models]
        if len(parts) == 1:
            return parts[0]
        return F.normalize(torch.cat(parts, dim=1), dim=1)


def export_model(
    preset: Preset,
    checkpoints: list[Path],
    out: Path,
    meta: dict[str, Any],
    fmt: str = "state-dict",
) -> Path:
    """Write the module of the fold models in ``checkpoints`` (their ``best.pt``) to ``out`` in
    format ``fmt`` ("state-dict" or "export"); ``meta`` (study, parameters, test metrics) goes
    with it. Returns ``out``."""
    module = EmbeddingModel([load_model(preset, c) for c in checkpoints]).eval()
    crop = preset.image.crop
    spec = module.models[0].trunk.input_spec
    info = {
        "format": FORMAT,
        **meta,
        "dim": preset.embedding_size * len(checkpoints),
        "folds": len(checkpoints),
        "preset": preset.model_dump(mode="json", by_alias=True),
        "input": {
            "resize": preset.image.resize,
            "crop": crop,
            "mean": list(spec["mean"]),
            "std": list(spec["std"]),
            "input_range": float(spec["input_range"]),
        },
    }
    if fmt == "state-dict":
        torch.save({**info, "state_dict": module.state_dict()}, out)
    elif fmt == "export":
        batch = torch.export.Dim("batch", min=1)
        example = torch.zeros(2, 3, crop, crop)
        with torch.no_grad():
            program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program, out, extra_files={"mlrc.json": _json(info)})
    else:
        raise ValueError(f"unknown export format {fmt!r} (state-dict or export)")
    return out


def load_exported(path: str | Path, device: str = "cpu") -> tuple[EmbeddingModel, dict[str, Any]]:
    """The module of a ``state-dict`` export (eval mode, on ``device``) and its metadata."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError(f"{path}: not an mlrc model export ({FORMAT})")
    preset = Preset.model_validate(saved["preset"])
    module = EmbeddingModel([build_model(preset, pretrained=False) for _ in range(saved["folds"])])
    module.load_state_dict(saved["state_dict"])
    meta = {k: v for k, v in saved.items() if k != "state_dict"}
    return module.to(device).eval(), meta


def _json(info: dict[str, Any]) -> str:
    import json

    return json.dumps(info, sort_keys=True, default=str)
