"""Bad campaign files: every mistake is one line ``error: FILE: KEY: reason`` and exit code 2,
with the campaign's own key (``losses.1.params.x``), or the study named when the key is shared.

As in ``test_study_files``: a snippet's top-level keys replace those of ``VALID`` (``patch``) or
the whole file is given (``raw``); an expected message ending in ``...`` is a prefix. The cases
run ``mlrc campaign run FILE`` in-process, which validates and resolves every study of the grid
before it opens the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mlrc.config import ConfigError
from mlrc.search.campaign_runner import load_campaign, resolve_campaign

VALID = """\
name: camp
datasets: [{name: glyphs}]
losses: [contrastive, triplet]
strategies: [null]
preset: cpu
search: {trials: 1, seed: 5}
test: {reproductions: 2}
"""
CI_NEEDS_TWO = (
    "test.reproductions: Input should be greater than or equal to 2 "
    "(a confidence interval needs at least 2 reproductions; got {})"
)
SAME_NAME = "give the same study name {!r}; set a distinct `label` on one of them"


def patch(snippet: str) -> str:
    """``VALID`` with the snippet's top-level keys replaced (or added)."""
    doc = {**yaml.safe_load(VALID), **yaml.safe_load(snippet)}
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def raw(text: str | bytes) -> str | bytes:
    return text


def case(id_: str, text: str | bytes, expected: str) -> Any:
    return pytest.param(text, expected, id=id_)


UNKNOWN_KEYS = [
    case(
        "top",
        patch("sampeler: {name: m_per_class}"),
        "unknown key 'sampeler'; did you mean 'sampler'?",
    ),
    case(
        "study-key-in-a-campaign",
        patch("strategy: metrix"),
        "unknown key 'strategy'; did you mean 'strategies'?",
    ),
    case(
        "dataset-item",
        patch("datasets: [{name: glyphs, lable: g}]"),
        "unknown key 'datasets.0.lable'; did you mean 'label'?",
    ),
    case(
        "loss-item",
        patch("losses: [contrastive, {name: triplet, serch: {}}]"),
        "unknown key 'losses.1.serch'; did you mean 'search'?",
    ),
    case(
        "loss-item-range",
        patch("losses: [{name: contrastive, search: {pos_margin: {low: 0, hihg: 1}}}]"),
        "unknown key 'losses.0.search.pos_margin.hihg'; did you mean 'high'?",
    ),
    case(
        "loss-item-enqueue",
        patch("losses: [{name: contrastive, enqeue: []}]"),
        "unknown key 'losses.0.enqeue'; did you mean 'enqueue'?",
    ),
    case(
        "strategy-item",
        patch("strategies: [null, {name: das, parmas: {}}]"),
        "unknown key 'strategies.1.parmas'; did you mean 'params'?",
    ),
    case(
        "miner",
        patch("miner: {name: batch_hard, parms: {}}"),
        "unknown key 'miner.parms'; did you mean 'params'?",
    ),
    case(
        "sampler",
        patch("sampler: {nmae: m_per_class}"),
        "unknown key 'sampler.nmae'; did you mean 'name'?",
    ),
    case(
        "test",
        patch("test: {reproductons: 3}"),
        "unknown key 'test.reproductons'; did you mean 'reproductions'?",
    ),
    case(
        "overrides-nested",
        patch("overrides: {image: {resise: 40}}"),
        "overrides.image: unknown preset field 'resise'; did you mean 'resize'?",
    ),
]

WRONG_TYPES = [
    case("losses-string", patch("losses: contrastive"), "losses: Input should be a valid list"),
    case(
        "datasets-mapping",
        patch("datasets: {name: glyphs}"),
        "datasets: Input should be a valid list",
    ),
    case(
        "loss-item-number",
        patch("losses: [contrastive, 3]"),
        "losses.1: Input should be a valid dictionary",
    ),
    case("loss-item-null", patch("losses: [null]"), "losses.0: Input should be a valid dictionary"),
    case(
        "strategies-empty",
        patch("strategies: []"),
        "strategies: List should have at least 1 item after validation, not 0",
    ),
    case(
        "label-number",
        patch("losses: [{name: contrastive, label: 3}]"),
        "losses.0.label: Input should be a valid string",
    ),
    case(
        "seed-negative",
        patch("search: {seed: -5}"),
        "search.seed: Input should be greater than or equal to 0",
    ),
    case(
        "trials-string",
        patch("search: {trials: all}"),
        "search.trials: Input should be a valid integer, unable to parse string as an integer",
    ),
    case(
        "root-nul",
        patch('datasets: [{name: omniglot, root: "a\\0b"}]'),
        "datasets.0.root: a path cannot contain a NUL character",
    ),
    case(
        "overrides-section",
        patch("overrides: {image: 32}"),
        "preset cpu.yaml + overrides: image: Input should be a valid dictionary",
    ),
]

UNKNOWN_NAMES = [
    case(
        "loss",
        patch("losses: [contrastive, tripplet]"),
        "losses.1.name: unknown loss 'tripplet'; did you mean 'triplet'? (available: ...",
    ),
    case(
        "dataset",
        patch("datasets: [glyphs, glyph]"),
        "datasets.1.name: unknown dataset 'glyph'; did you mean 'glyphs'? (available: ...",
    ),
    case(
        "strategy",
        patch("strategies: [metrixx]"),
        "strategies.0.name: unknown strategy 'metrixx'; did you mean 'metrix'? (available: ...",
    ),
    case(
        "miner",
        patch("miner: {name: batch_hardd}"),
        "miner.name: unknown miner 'batch_hardd'; did you mean 'batch_hard'? (available: ...",
    ),
    case(
        "preset",
        patch("preset: refrence"),
        "preset: unknown preset 'refrence'; did you mean 'reference'? "
        "(available: cpu, modern, reference, traditional, or a path to a preset YAML)",
    ),
    case(
        "sampler",
        patch("sampler: {name: m_per_clas}"),
        "sampler.name: unknown sampler 'm_per_clas'; did you mean 'm_per_class'? (available: ...",
    ),
]

PARAMETERS_NOT_TAKEN = [
    case(
        "loss-params",
        patch("losses: [contrastive, {name: triplet, params: {marginn: 0.1}}]"),
        "losses.1.params.marginn: loss 'triplet' takes no parameter 'marginn'; did you mean 'margin'? ...",
    ),
    case(
        "dataset-params",
        patch("datasets: [{name: image_folder, root: ., params: {size: 32}}]"),
        "datasets.0.params.size: dataset 'image_folder' takes no parameter 'size' (it takes: none)",
    ),
    case(
        "strategy-params",
        patch("losses: [triplet]\nstrategies: [{name: das, params: {normalise: true}}]"),
        "strategies.0.params.normalise: strategy 'das' takes no parameter 'normalise'; "
        "did you mean 'normalize'? (it takes: T, K, Z, r_s, r_b, normalize)",
    ),
    case(
        "enqueue-not-searched",
        patch("losses: [{name: contrastive, enqueue: [{margin: 0.5}]}]"),
        "losses.0.enqueue.0.margin: 'margin' is not searched (searched: pos_margin, neg_margin)",
    ),
    case(
        "enqueue-outside-range",
        patch("losses: [contrastive, {name: ntxent, enqueue: [{temperature: 0}]}]"),
        "losses.1.enqueue.0.temperature: 0 is outside the range [0.0001, 100.0]",
    ),
]

RANGES_AND_BUDGETS = [
    case(
        "low-above-high",
        patch("losses: [{name: contrastive, search: {neg_margin: {low: 1.5, high: 0.5}}}]"),
        "losses.0.search.neg_margin: low (1.5) > high (0.5)",
    ),
    case(
        "log-low-zero",
        patch(
            "losses: [contrastive, {name: ntxent, search: {temperature: {low: 0, high: 1, log: true}}}]"
        ),
        "losses.1.search.temperature: a log range must be > 0, got low = 0.0",
    ),
    case(
        "empty-space-many-trials",
        patch("losses: [contrastive, npairs]\nsearch: {trials: 2}"),
        "search.trials = 2 but the search space is empty (nothing to search: use trials: 1) "
        "(study camp-glyphs-npairs)",
    ),
    case("reproductions-one", patch("test: {reproductions: 1}"), CI_NEEDS_TWO.format(1)),
    case("reproductions-zero", patch("test: {reproductions: 0}"), CI_NEEDS_TWO.format(0)),
]

COMBINATIONS = [
    case(
        "strategy-with-a-loss-it-does-not-support",
        patch("strategies: [null, metrix]"),
        "strategies.1: 'metrix' works with the losses contrastive, multi_similarity, proxy_anchor; not 'triplet'",
    ),
    case(
        "strategy-mines-its-own-tuples",
        patch("strategies: [rho_distance]\nminer: {name: batch_hard}"),
        "strategies.0: strategy 'rho_distance' mines its own tuples: remove miner",
    ),
    case(
        "miner-with-a-loss-without-pairs",
        patch("losses: [triplet, mean_field_contrastive]\nminer: {name: batch_hard}"),
        "miner: loss 'mean_field_contrastive' does not use a miner's pairs "
        "(study camp-glyphs-mean_field_contrastive)",
    ),
]

DUPLICATE_STUDIES = [
    case(
        "labels-that-sanitise-alike",
        patch(
            "datasets: [{name: glyphs, label: 'my set'}, {name: glyphs, label: my-set, params: {size: 32}}]"
        ),
        "datasets.1 and datasets.0 " + SAME_NAME.format("camp-my-set-contrastive"),
    ),
    case(
        "one-label-for-two-losses",
        patch("losses: [{name: contrastive, label: x}, {name: triplet, label: x}]"),
        "losses.1 and losses.0 " + SAME_NAME.format("camp-glyphs-x"),
    ),
    case(
        "strategy-twice-with-other-params",
        patch("losses: [triplet]\nstrategies: [das, {name: das, params: {normalize: false}}]"),
        "strategies.1 and strategies.0 " + SAME_NAME.format("camp-glyphs-triplet-das"),
    ),
    case(
        "same-loss-twice",
        patch("losses: [triplet, contrastive, triplet]"),
        "losses.2 and losses.0 " + SAME_NAME.format("camp-glyphs-triplet"),
    ),
]

MISSING_FILES = [
    case(
        "preset-file",
        patch("preset: presets/mine.yaml"),
        "preset: presets/mine.yaml is not a file (looked for ...",
    ),
    case(
        "dataset-root",
        patch("datasets: [{name: omniglot, root: data/omniglot.zip}]"),
        "datasets.0.root: data/omniglot.zip does not exist (looked in ...",
    ),
]

FILE_SHAPES = [
    case("empty-file", raw(""), "empty (expected a mapping of keys)"),
    case(
        "a-list",
        raw("- name: camp\n- losses: [contrastive]\n"),
        "expected a mapping of keys, got list",
    ),
    case("missing-losses", raw("name: camp\ndatasets: [glyphs]\n"), "losses: Field required"),
    case(
        "unclosed-bracket",
        raw("name: camp\ndatasets: [glyphs\nlosses: [contrastive]\n"),
        "line 3, column 7: malformed YAML (expected ',' or ']', but got ':')",
    ),
    case(
        "duplicate-key",
        raw(VALID + "losses: [npairs]\n"),
        "line 8, column 1: malformed YAML (duplicate key 'losses')",
    ),
    case(
        "not-utf8",
        raw(b"name: camp\ndatasets: [caf\xe9]\n"),
        "line 2, column 15: not UTF-8 text (byte 0xe9)",
    ),
]

GROUPS = {
    "unknown-key": UNKNOWN_KEYS,
    "wrong-type": WRONG_TYPES,
    "unknown-name": UNKNOWN_NAMES,
    "parameter-not-taken": PARAMETERS_NOT_TAKEN,
    "range-or-budget": RANGES_AND_BUDGETS,
    "combination": COMBINATIONS,
    "duplicate-study": DUPLICATE_STUDIES,
    "missing-file": MISSING_FILES,
    "file": FILE_SHAPES,
}
CASES = [pytest.param(*c.values, id=f"{g}:{c.id}") for g, cases in GROUPS.items() for c in cases]


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "campaign.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def resolve(path: Path) -> list:
    return resolve_campaign(load_campaign(path), str(path))


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_bad_campaign_file(tmp_path, monkeypatch, fails_with, text, expected):
    monkeypatch.chdir(tmp_path)  # relative roots and preset paths: nothing there
    path = write(tmp_path, text)
    message = fails_with(["campaign", "run"], path, expected)
    with pytest.raises(ConfigError) as err:  # the library says the same as the command
        resolve(path)
    assert str(err.value) == f"{path}: {message}"


def test_missing_campaign_file(tmp_path, fails_with):
    fails_with(
        ["campaign", "run"], tmp_path / "nope.yaml", "cannot read (No such file or directory)"
    )


@pytest.mark.parametrize(
    "snippet",
    [
        "overrides: {validate_every: {glyphs: 2}, search: {seed: 4}}",
        "datasets: [glyphs, {name: glyphs, label: small, params: {size: 32}}]",
        "losses: [contrastive, {name: contrastive, label: contrastive-fixed, params: {pos_margin: 0}}]",
        "losses: [{name: ntxent, enqueue: [{temperature: 0.1}]}, {name: triplet, enqueue: [{margin: 0.2}]}]",
    ],
    ids=["nested-overrides", "dataset-labels", "loss-labels", "enqueue-per-loss"],
)
def test_near_misses_that_are_valid(tmp_path, snippet):
    """Looks odd, is right: the validation must not refuse these."""
    assert resolve(write(tmp_path, patch(snippet)))
