"""Warm starts that do not fit (``search.warm_start``): each is refused by ``mlrc study run`` in
one line ``error: FILE: search.warm_start: reason``, exit code 2, before the study is stored.

The source ``src`` (contrastive, pos_margin and neg_margin searched over [-0.2, 2]) is run with
folds scored without training: its best trial is its first enqueued point, pos_margin 0.0 and
neg_margin 1.0, which the value cases below misfit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mlrc import search as S
from mlrc import store
from mlrc.config import load_study
from mlrc.search import objective
from mlrc.store import studies
from mlrc.train import FoldResult

from .conftest import assert_message, invoke, message_of

SPACE = {"pos_margin": {"low": -0.2, "high": 2.0}, "neg_margin": {"low": -0.2, "high": 2.0}}
CONTRASTIVE = {"name": "contrastive", "search": SPACE}
FIELD = "search.warm_start: "
SOURCE = "study 'src'"


def scored_fold(ctx, kind, params, reproduction, fold, trial_number):
    value = -abs(params["pos_margin"]) - abs(params["neg_margin"] - 1.0)
    best = {"map_at_r": value, "precision_at_1": value, "r_precision": value}
    return FoldResult("complete", None, 1, best, objective=value)


def study_file(folder: Path, name: str, search: dict, loss: dict | None = None) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": loss or CONTRASTIVE,
        "search": {"sampler": "tpe", "seed": 0, **search},
        "test": {"reproductions": 2},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, str]:
    """A store with the finished study ``src`` and the registered, never run, ``pending``."""
    tmp = tmp_path_factory.mktemp("warm-refusals")
    url = f"sqlite:///{tmp / 'store.db'}"
    points = [{"pos_margin": 0.0, "neg_margin": 1.0}, {"pos_margin": 1.0, "neg_margin": 1.5}]
    path = study_file(tmp, "src", {"trials": 2, "enqueue": points})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(objective, "run_fold", scored_fold)
        with S.open_study(load_study(path), url, tmp / "art", progress=False) as ctx:
            S.run_search(ctx)
    pending = load_study(study_file(tmp, "pending", {"trials": 2}))
    with S.open_study(pending, url, tmp / "art", progress=False):
        pass
    return tmp, url


def export(folder: Path, name: str, doc: dict[str, Any]) -> str:
    path = folder / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def refused(tmp: Path, url: str, path: Path, expected: str) -> None:
    art = tmp / "art"
    result = invoke(["study", "run", path, "--storage", url, "--artifacts", art, "--quiet"])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    message = message_of(result.output, path)
    assert message.startswith(FIELD), message
    assert_message(message.removeprefix(FIELD), expected)
    engine = store.connect(url)
    assert studies.study_named(engine, load_study(path).study.name) is None  # nothing stored


STUDY_CASES = {
    "other-loss": (
        {"study": "src"},
        {"name": "triplet"},
        f"{SOURCE} tuned loss 'contrastive', this study tunes loss 'triplet'",
    ),
    "searched-there-fixed-here": (
        {"study": "src"},
        {
            "name": "contrastive",
            "params": {"neg_margin": 1.0},
            "search": {"pos_margin": SPACE["pos_margin"]},
        },
        f"{SOURCE} searched 'neg_margin', which this study does not search (searched: pos_margin)",
    ),
    "outside-the-range": (
        {"study": "src", "top": 1},
        {"name": "contrastive", "search": {**SPACE, "pos_margin": {"low": 0.5, "high": 2.0}}},
        f"{SOURCE}: pos_margin = 0.0 is outside this study's range [0.5, 2.0]",
    ),
    "not-a-choice": (
        {"study": "src", "top": 1},
        {"name": "contrastive", "search": {**SPACE, "neg_margin": {"choices": [0.5, 2.0]}}},
        f"{SOURCE}: neg_margin = 1.0 is not one of this study's choices [0.5, 2.0]",
    ),
    "off-the-grid": (
        {"study": "src", "top": 1},
        {
            "name": "contrastive",
            "search": {**SPACE, "pos_margin": {**SPACE["pos_margin"], "step": 0.3}},
        },
        f"{SOURCE}: pos_margin = 0.0 is not on this study's grid -0.2 + k × 0.3 (up to 2.0)",
    ),
    "unknown-study": (
        {"study": "srd"},
        None,
        "no study 'srd' in the store; did you mean 'src'? (known: pending, src)",
    ),
    "unfinished-study": (
        {"study": "pending"},
        None,
        "study 'pending' has no complete trial yet (a warm start takes the best of a finished "
        "study: run it first)",
    ),
    "the-study-itself": (
        {"study": "warm"},
        None,
        "study 'warm' is this study itself (a warm start takes another, finished study)",
    ),
}


@pytest.mark.parametrize("case", list(STUDY_CASES))
def test_a_warm_start_from_a_study_that_does_not_fit_is_refused(source, case):
    tmp, url = source
    warm, loss, expected = STUDY_CASES[case]
    path = study_file(tmp, "warm", {"trials": 2, "warm_start": warm}, loss)
    refused(tmp, url, path, expected)


def test_a_warm_start_from_a_file_that_does_not_fit_is_refused(source):
    tmp, url = source
    both = {"pos_margin": 0.1, "neg_margin": 1.0}
    files = [
        ("nothing.yaml", "file nothing.yaml does not exist (looked in ..."),
        (
            export(tmp, "plain.yaml", {"a": 1}),
            "{} is not a study export (what `mlrc study export` writes: the best parameters in "
            "loss.params)",
        ),
        (
            export(
                tmp, "one.yaml", {"loss": {"name": "contrastive", "params": {"pos_margin": 0.1}}}
            ),
            "file {} never had parameter 'neg_margin', which this study searches",
        ),
        (
            export(
                tmp,
                "miner.yaml",
                {
                    "loss": {"name": "contrastive", "params": both},
                    "miner": {"name": "multi_similarity", "params": {}},
                },
            ),
            "file {} tuned miner 'multi_similarity', this study tunes no miner",
        ),
        (
            export(
                tmp, "extra.yaml", {"loss": {"name": "contrastive", "params": {**both, "x": 1}}}
            ),
            "file {} has x = 1; this study neither searches nor fixes it",
        ),
    ]
    for file, expected in files:
        path = study_file(tmp, "warm", {"trials": 2, "warm_start": {"file": file}})
        refused(tmp, url, path, expected.replace("{}", file))
    fixed_here = {
        "name": "contrastive",
        "params": {"neg_margin": 0.5},
        "search": {"pos_margin": SPACE["pos_margin"]},
    }
    file = export(tmp, "both.yaml", {"loss": {"name": "contrastive", "params": both}})
    path = study_file(tmp, "warm", {"trials": 2, "warm_start": {"file": file}}, fixed_here)
    refused(tmp, url, path, f"file {file} has neg_margin = 1.0; this study fixes it at 0.5")


def test_a_preset_takes_no_warm_start(tmp_path):
    """A warm start names a study: a preset's would be silently unused, so it is refused,
    naming the preset file."""
    preset = tmp_path / "p.yaml"
    text = (Path(__file__).parents[2] / "mlrc/resources/presets/cpu.yaml").read_text()
    old = "search: {trials: 4, sampler: gp}"
    assert old in text
    preset.write_text(text.replace(old, "search: {trials: 4, warm_start: {study: x}}"))
    path = study_file(tmp_path, "uses-preset", {"trials": 2})
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "preset": str(preset)}))
    result = invoke(["study", "run", path, "--storage", f"sqlite:///{tmp_path / 'db'}"])
    assert result.exit_code == 2, result.output
    assert message_of(result.output, preset) == (
        "search.warm_start: a preset takes none (give it in the study file)"
    )
    assert not (tmp_path / "db").exists()
