"""studies/campaigns/cpu-reality-check.yaml (issue #41): the protocol's budget on the two datasets a
clone has without a network, 12 losses of the three families, Omniglot first; its contrastive,
multi_similarity and ntxent studies are the pruning corpus's (bench/pruning.py) but for their
names, budgets and the Omniglot root."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from mlrc.config import resolve
from mlrc.config.campaign import load_campaign, resolve_campaign
from mlrc.config.study import StudyConfig

REPO = Path(__file__).resolve().parents[2]
FILE = REPO / "studies/campaigns/cpu-reality-check.yaml"
PAIR = {"contrastive", "triplet", "ntxent", "margin", "fastap", "snr", "multi_similarity"}
PROXY = {"proxy_nca", "soft_triple"}
CLASSIFICATION = {"normalized_softmax", "cosface", "arcface"}


def plan():
    return resolve_campaign(load_campaign(FILE, check_roots=False), str(FILE))


def test_the_grid_is_the_protocol_on_omniglot_then_glyphs():
    cells = plan()
    assert len(cells) == 24
    assert [c.column for c, _ in cells] == ["omniglot"] * 12 + ["glyphs"] * 12
    losses = [c.row for c, _ in cells[:12]]
    assert set(losses) == PAIR | PROXY | CLASSIFICATION and len(set(losses)) == 12
    for cell, r in cells:
        assert cell.name == f"cpu-reality-check-{cell.column}-{cell.row}"
        assert r.study.dataset.root is None  # nothing outside the clone: MLRC_OMNIGLOT_URL
        assert (r.trials, r.reproductions, r.sampler, r.study.search.seed) == (50, 10, "gp", 0)
        assert (r.pruner, r.stop, r.preset.folds, r.study.preset) == ("none", None, 4, "cpu")


def comparable(fingerprint: dict) -> dict:
    """A fingerprint without the study's name, Omniglot root and budgets."""
    out = copy.deepcopy(fingerprint)
    for key in ("trials", "reproductions"):
        out.pop(key, None)
    out["study"].pop("name")
    out["study"].pop("test", None)
    out["study"]["dataset"].pop("root", None)
    out["study"]["search"].pop("trials", None)
    return out


def test_the_corpus_studies_are_the_same_studies():
    sys.path.insert(0, str(REPO / "bench"))
    from pruning import study_docs

    docs = {d["name"]: d for d in study_docs(50, REPO / "omniglot.zip")}
    found = 0
    for cell, r in plan():
        doc = docs.get(f"corpus-{cell.row}-{cell.column}")
        if doc is None:
            continue
        corpus = resolve(StudyConfig.model_validate(doc), "corpus")
        assert comparable(r.fingerprint()) == comparable(corpus.fingerprint())
        assert r.space == corpus.space
        found += 1
    assert found == 6
