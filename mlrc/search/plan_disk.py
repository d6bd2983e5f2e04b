"""Checkpoint disk of a study once it is done, under its retention (``artifacts.keep``,
:mod:`mlrc.search.retention`): ``all`` keeps every fold's ``best.pt`` and ``last.pt``; ``best``
keeps the ``best.pt`` of every test fold and of the best trial's folds; ``resume`` keeps the
``best.pt`` of one reproduction's folds (what ``mlrc study export-model`` exports). While a fold runs it holds one ``last.pt`` and one ``best.pt`` whatever the policy.

``best.pt`` is the trunk + embedder state dict (its tensors' bytes, counted on a model built on
torch's ``meta`` device: nothing is allocated or downloaded); ``last.pt`` ≈ 3 × ``best.pt`` (the
weights plus two optimiser state tensors per weight, RMSprop with momentum or Adam(W); measured
2.8–3.0 × by ``bench/artifacts.py``, ``bench/results/artifacts.md``).

Every tested reproduction also keeps its test embeddings under every policy
(:mod:`mlrc.search.embeddings`): folds × test images × embedding size numbers (float16 by
default, ``artifacts.embeddings``) plus a label and a role per image, counted for the datasets
whose test-set size is known (:data:`TEST_IMAGES`)."""

from __future__ import annotations

from mlrc.config import Preset, ResolvedStudy, canonical_json

__all__ = ["LAST_OVER_BEST", "TEST_IMAGES", "checkpoint_bytes", "disk_bytes", "embedding_bytes"]

LAST_OVER_BEST = 3
# Test images of the standard datasets under their default split (MLRC: the second half of the
# classes; In-Shop: its 14,218 queries + 12,612 gallery images) and of the embedded glyphs
TEST_IMAGES = {"cub200": 5_924, "cars196": 8_131, "sop": 60_502, "inshop": 26_830, "glyphs": 896}
# Per image besides the embeddings: its int64 label and its role (a 7-character numpy string)
PER_IMAGE = 8 + 4 * 7
NPZ_OVERHEAD = 1_024  # zip headers and .npy headers of a file's arrays


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


def embedding_bytes(resolved: ResolvedStudy) -> int:
    """Bytes of the study's stored test embeddings once its reproductions are tested (0 for a
    dataset whose test-set size is not in :data:`TEST_IMAGES`: an image folder's)."""
    n = TEST_IMAGES.get(resolved.study.dataset.name, 0)
    if n == 0:
        return 0
    p = resolved.preset
    itemsize = 2 if resolved.study.artifacts.embeddings == "float16" else 4
    per_file = p.folds * n * p.embedding_size * itemsize + n * PER_IMAGE + NPZ_OVERHEAD
    return resolved.reproductions * per_file


def disk_bytes(resolved: ResolvedStudy, best: int | None) -> int | None:
    """Bytes the study keeps once it is done under its ``keep``: its checkpoints (``best``: one
    ``best.pt``; None: unknown) and its stored test embeddings (:func:`embedding_bytes`)."""
    if best is None:
        return None
    folds = resolved.preset.folds
    if resolved.keep == "all":
        kept = (resolved.trials + resolved.reproductions) * folds * best * (1 + LAST_OVER_BEST)
    elif resolved.keep == "best":
        kept = (resolved.reproductions + 1) * folds * best
    else:  # resume: one reproduction's fold models, for export-model
        kept = folds * best
    return kept + embedding_bytes(resolved)
