"""A trained study's model for use outside mlrc: the best reproduction's fold models as one module
whose output is MLRC's test-time embedding. That embedding is L2-normalised, of D dimensions (one
fold model, D = the preset's ``embedding_size``) or K·D (the K fold models' normalised embeddings
concatenated and normalised again, the "concatenated" mode of the reality check; 512 for the
reference preset's 4 × 128).

Three file formats:

- ``state-dict`` (``.pt``): the fold models' weights, the resolved preset and what they were
  trained on; :func:`load_exported` rebuilds the module (needs mlrc installed);
- ``export`` (``.pt2``): a ``torch.export`` program of the same module (batch size free), loaded
  with ``torch.export.load(path).module()`` — torch alone, no mlrc;
- ``onnx`` (``.onnx``): the same module as an ONNX graph (opset 20 or later, batch axis free;
  input ``images``, output ``embeddings``, already L2-normalised), run by any ONNX runtime; the
  metadata is the model's ``mlrc.json`` metadata entry. Needs the ``onnx`` extra to write.

Each takes the trunk's float input: images resized to ``image.resize``, centre-cropped to
``image.crop`` and normalised as ``(x / 255 · input_range − mean) / std`` per channel (the
file's ``input`` entry), N × 3 × crop × crop."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlrc.config import Preset
from mlrc.train.model import Model, build_model, load_model

__all__ = [
    "FORMAT",
    "FORMATS",
    "EmbeddingModel",
    "OnnxExportError",
    "export_model",
    "load_exported",
]

FORMAT = "mlrc-model/1"
FORMATS = ("state-dict", "export", "onnx")


class OnnxExportError(ValueError):
    """The module cannot be written as ONNX (an operator without an ONNX translation, or the
    exporter's packages missing); its message is one line naming the operator."""


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
    format ``fmt`` (one of :data:`FORMATS`); ``meta`` (study, parameters, test metrics) goes
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
        with torch.no_grad():
            program = torch.export.export(module, (_example(crop),), dynamic_shapes=_BATCH_FREE)
        torch.export.save(program, out, extra_files={"mlrc.json": _json(info)})
    elif fmt == "onnx":
        _write_onnx(module, crop, out, _json(info))
    else:
        raise ValueError(f"unknown export format {fmt!r} ({', '.join(FORMATS)})")
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


def _example(crop: int) -> torch.Tensor:
    """An input of two crop × crop images: the traced batch size (free in the files)."""
    return torch.zeros(2, 3, crop, crop)


_BATCH_FREE = ({0: torch.export.Dim("batch", min=1)},)


def _write_onnx(module: EmbeddingModel, crop: int, out: Path, meta: str) -> None:
    """``module`` as one self-contained ONNX file (weights inside, batch axis free) with
    ``meta`` as its ``mlrc.json`` metadata entry; an operator without an ONNX translation (or
    the exporter's packages missing) is an :class:`OnnxExportError` naming it."""
    try:
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it; say so in one line)
    except ImportError as e:
        raise OnnxExportError(
            "--format onnx needs the onnx and onnxscript packages: pip install 'mlrc[onnx]'"
        ) from e
    try:
        with torch.no_grad():
            program = torch.onnx.export(
                module,
                (_example(crop),),
                dynamo=True,
                verbose=False,
                dynamic_shapes=_BATCH_FREE,
                input_names=["images"],
                output_names=["embeddings"],
            )
    except Exception as e:  # the exporter's errors are RuntimeErrors of many kinds
        raise OnnxExportError(f"the model cannot be exported to ONNX: {_onnx_failure(e)}") from e
    program.model.metadata_props["mlrc.json"] = meta
    program.save(out, external_data=False)


def _onnx_failure(error: BaseException) -> str:
    """What made ``torch.onnx.export`` fail, in one line: the operator without an ONNX
    translation where the message names one, else the message's first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    found = re.search(
        r"No ONNX function found for <OpOverload\(op='([^']+)', overload='([^']+)'", text
    )
    if found:
        return f"no ONNX translation of operator {found[1]}.{found[2]} (use --format export)"
    node = re.search(r"call_function\[target=([^\]]+)\]", text)
    if node:
        return f"operator {node[1]} failed to convert (use --format export)"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(error).__name__)
    return f"{first} (use --format export)"


def _json(info: dict[str, Any]) -> str:
    import json

    return json.dumps(info, sort_keys=True, default=str)
