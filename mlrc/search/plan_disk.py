"""Checkpoint disk of a study once it is done, under its retention (``artifacts.keep``,
:mod:`mlrc.search.retention`): ``all`` keeps every fold's ``best.pt`` and ``last.pt``; ``best``
keeps the ``best.pt`` of every test fold and of the best trial's folds; ``resume`` keeps
nothing. While a fold runs it holds one ``last.pt`` and one ``best.pt`` whatever the policy.

``best.pt`` is the trunk + embedder state dict (its tensors' bytes, counted on a model built on
torch's ``meta`` device: nothing is allocated or downloaded); ``last.pt`` ≈ 3 × ``best.pt`` (the
weights plus two optimiser state tensors per weight, RMSprop with momentum or Adam(W); measured
2.8–3.0 × by ``bench/artifacts.py``, ``bench/results/artifacts.md``)."""

from __future__ import annotations

from mlrc.config import Preset, ResolvedStudy, canonical_json

__all__ = ["LAST_OVER_BEST", "checkpoint_bytes", "disk_bytes"]

LAST_OVER_BEST = 3


def checkpoint_bytes(preset: Preset) -> int | None:
    """Bytes of one ``best.pt`` of ``preset``'s model (None: the model cannot be built here,
    e.g. a plug-in trunk that is not installed)."""
    key = canonical_json(preset.model_dump(mode="json"))
    if key not in _SIZES:
        _SIZES[key] = _state_bytes(preset)
    return _SIZES[key]


_SIZES: dict[str, int | None] = {}  # by preset: building a model takes a second


def _state_bytes(preset: Preset) -> int | None:
    import torch

    from mlrc.train.model import build_model

    try:
        with torch.device("meta"):
            model = build_model(preset, pretrained=False)
    except Exception:  # noqa: BLE001 — any trunk may fail to build here: disk is then unknown
        return None
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def disk_bytes(resolved: ResolvedStudy, best: int | None) -> int | None:
    """Bytes the study's checkpoints take once it is done under its ``keep`` (``best``: one
    ``best.pt``; None: unknown)."""
    if best is None:
        return None
    folds = resolved.preset.folds
    if resolved.keep == "all":
        return (resolved.trials + resolved.reproductions) * folds * best * (1 + LAST_OVER_BEST)
    if resolved.keep == "best":
        return (resolved.reproductions + 1) * folds * best
    return 0
