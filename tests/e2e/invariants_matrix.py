"""The settings matrix of tests/e2e/test_invariants.py (issue #37): a pairwise covering array
written out row by row, the study file of each row, and the query→gallery folder built from
the real Omniglot subset with a ``roles.csv``. Plain data and builders; no checks."""

from __future__ import annotations

import itertools
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FACTORS = {
    "folds": (2, 3, 4),
    "keep": ("resume", "best", "all"),
    "procs": (1, 2),
    "retrieval": ("all vs all", "query→gallery"),
    "embedding_size": (64, 128),
    "embeddings": ("float16", "float32"),
}

# The covering array: every pair of levels of every two factors is in some row (9 rows, the
# lower bound for two 3-level factors: folds × keep is the full 3 × 3 core). K = 2 ranks
# (gloo, slow to start) is in 3 rows, the fewest that meet folds and keep at 2 each.
MATRIX = (
    # folds, keep,  procs, retrieval,        D,   embeddings
    (2, "resume", 1, "all vs all", 64, "float16"),
    (2, "best", 1, "all vs all", 64, "float16"),
    (2, "all", 2, "query→gallery", 128, "float32"),
    (3, "resume", 1, "all vs all", 128, "float32"),
    (3, "best", 2, "all vs all", 64, "float32"),
    (3, "all", 1, "query→gallery", 64, "float16"),
    (4, "resume", 2, "query→gallery", 64, "float16"),
    (4, "best", 1, "query→gallery", 128, "float16"),
    (4, "all", 1, "all vs all", 64, "float32"),
)

# A budget that leaves some folds at epoch 0: one trained epoch of 2 batches; validation
# (epoch 0 = the untrained model, then epoch 1) keeps epoch 0 wherever epoch 1 is no better.
BUDGET = {
    "iterations_per_epoch": 2,
    "max_epochs": 1,
    "validate_every": {"default": 1},
    "decoded_cache": True,  # runtime only (not identity): decoded images cached, shared
    "image": {"resize": 20, "crop": 16},  # 16-px crops: a quarter of the 32-px compute
}


def uncovered(matrix=MATRIX) -> list[tuple[str, Any, str, Any]]:
    """The pairs of levels (factor a, level, factor b, level) no row of ``matrix`` holds."""
    names = list(FACTORS)
    missing = []
    for (i, a), (j, b) in itertools.combinations(enumerate(names), 2):
        seen = {(row[i], row[j]) for row in matrix}
        missing += [(a, u, b, v) for u in FACTORS[a] for v in FACTORS[b] if (u, v) not in seen]
    return missing


@dataclass
class Point:
    """One row of the matrix and the study that ran it (in the shared store and folder)."""

    index: int
    folds: int
    keep: str
    procs: int
    retrieval: str
    embedding_size: int
    embeddings: str
    path: Path  # the study file
    url: str  # the shared store
    art: Path  # the shared artifacts folder
    dataset_root: Path | None  # the query→gallery folder (None: the embedded glyphs)
    tmp: Path  # a folder of this point's own
    ctx: dict[str, Any] = field(default_factory=dict)  # shared: the browser

    @property
    def name(self) -> str:
        return f"m{self.index}"

    @property
    def query_gallery(self) -> bool:
        return self.retrieval == "query→gallery"

    def doc(self, **changes: Any) -> dict[str, Any]:
        """This point's study file, with ``changes`` to its name, loss, overrides or artifacts."""
        return study_doc(self, **changes)


def study_doc(
    p: Point, name: str | None = None, loss: dict | None = None, **changes: Any
) -> dict[str, Any]:
    """The study file of point ``p``: contrastive, 1 trial, 2 reproductions, preset cpu, the
    tiny budget, the point's folds, embedding size, K (only where 2: a study sets it) and
    retention and embeddings dtype; ``changes``: overrides fields (or ``keep``/``embeddings``)."""
    overrides: dict[str, Any] = {**BUDGET, "folds": p.folds, "embedding_size": p.embedding_size}
    if p.procs != 1:
        overrides["processes_per_trial"] = p.procs
    artifacts = {"keep": p.keep, "embeddings": p.embeddings}
    for k, v in changes.items():
        (artifacts if k in artifacts else overrides)[k] = v
    dataset = (
        {"name": "image_folder", "root": str(p.dataset_root)}
        if p.query_gallery
        else {"name": "glyphs"}
    )
    return {
        "name": name or p.name,
        "dataset": dataset,
        "preset": "cpu",
        "loss": loss or {"name": "contrastive"},
        "search": {"trials": 1, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": {k: v for k, v in overrides.items() if v is not None},
        "artifacts": artifacts,
    }


def write_doc(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


# The query→gallery folder: 16 Omniglot characters train (4 folds of 4 validation classes at
# most), 8 test characters with 3 queries and 5 gallery images each; 8 images a character.
TRAIN_CLASSES, TEST_CLASSES, PER_CLASS, QUERIES = 16, 8, 8, 3


def omniglot_roles_folder(zip_path: Path, root: Path) -> Path:
    """``root/<alphabet>_<character>/<image>.png`` from the Omniglot subset (the first
    ``TRAIN_CLASSES + TEST_CLASSES`` characters in sorted order, ``PER_CLASS`` images each) and
    a ``roles.csv`` giving the last ``TEST_CLASSES`` characters' images their roles."""
    with zipfile.ZipFile(zip_path) as z:
        by_class: dict[str, list[str]] = {}
        for n in sorted(z.namelist()):
            parts = n.split("/")
            if len(parts) == 4 and n.endswith(".png"):
                by_class.setdefault(f"{parts[1]}_{parts[2]}", []).append(n)
        chosen = sorted(by_class)[: TRAIN_CLASSES + TEST_CLASSES]
        roles = ["path,role"]
        for c, cls in enumerate(chosen):
            (root / cls).mkdir(parents=True, exist_ok=True)
            for k, member in enumerate(by_class[cls][:PER_CLASS]):
                rel = f"{cls}/{Path(member).name}"
                (root / rel).write_bytes(z.read(member))
                if c >= TRAIN_CLASSES:
                    roles.append(f"{rel},{'query' if k < QUERIES else 'gallery'}")
    (root / "roles.csv").write_text("\n".join(roles) + "\n")
    return root
