"""studies/modern/ (issue #16): the modern campaign's study files are generated, not hand-kept —
the committed files equal scripts/modern_studies.py's output, and each resolves with the modern
preset (ViT-S/16 DINO through timm, AdamW) without its dataset (roots are the user's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mlrc.config import StudyConfig, load_yaml, resolve

REPO = Path(__file__).resolve().parents[2]
MODERN = REPO / "studies" / "modern"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "modern_studies", REPO / "scripts" / "modern_studies.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_study_files_are_the_generated_ones():
    generated = _generator().study_files()
    committed = {str(p.relative_to(MODERN)): p.read_text() for p in MODERN.rglob("*.yaml")}
    assert committed == generated
    assert len(generated) == 60  # 10 losses × cub200, cars196, sop; again at 4 GPUs (4gpu/)


@pytest.mark.parametrize(
    "path", sorted(MODERN.rglob("*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_every_modern_study_resolves_with_the_modern_preset(path):
    r = resolve(StudyConfig.model_validate(load_yaml(path)), str(path))
    assert r.preset.trunk == "timm:vit_small_patch16_224.dino"
    assert r.preset.optimizer.name == "adamw" and r.preset.embedding_size == 384
    assert (r.trials, r.reproductions, r.preset.folds) == (50, 10, 4)  # the reality check's
    assert r.keep == "best"
    four = path.parent.parent.name == "4gpu"
    assert r.preset.processes_per_trial == (4 if four else 1)
    if four:  # the global batch: whole classes on each of the 4 ranks
        m = r.preset.batch.images_per_class["pair"]
        assert r.preset.batch.size % (4 * m) == 0 and m == r.preset.batch.images_per_class["class"]
