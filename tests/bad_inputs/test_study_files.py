"""Bad study files: every mistake is one line ``error: FILE: KEY: reason`` and exit code 2.

Each case is a small YAML snippet whose top-level keys replace those of ``VALID`` (``patch``) or
a whole file (``raw``); the expected message is all of it, or its beginning when it ends in
``...`` (the rest lists the names available, which grows with the registries). The cases run
``mlrc study run FILE`` in-process; one runs the installed command in a subprocess. A
property test mutates valid study files and checks that nothing but ``ConfigError`` escapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mlrc.config import ConfigError, load_study

from .conftest import invoke, message_of, run_mlrc

VALID = """\
name: bad-inputs
dataset: {name: glyphs}
preset: cpu
loss:
  name: contrastive
  search:
    pos_margin: {low: -0.2, high: 2.0}
    neg_margin: {low: -0.2, high: 2.0}
search: {trials: 2, sampler: tpe, seed: 0}
test: {reproductions: 2}
"""
CI_NEEDS_TWO = (
    "test.reproductions: Input should be greater than or equal to 2 "
    "(a confidence interval needs at least 2 reproductions; got {})"
)


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
        "top-overrides", patch("overides: {}"), "unknown key 'overides'; did you mean 'overrides'?"
    ),
    case("top-no-close-match", patch("colour: blue"), "unknown key 'colour'"),
    case(
        "top-unicode",
        patch("dätaset: {name: glyphs}"),
        "unknown key 'dätaset'; did you mean 'dataset'?",
    ),
    case(
        "loss",
        patch("loss: {name: contrastive, parmas: {}}"),
        "unknown key 'loss.parmas'; did you mean 'params'?",
    ),
    case(
        "loss-search-range",
        patch("loss: {name: contrastive, search: {pos_margin: {lwo: 0, high: 1}}}"),
        "unknown key 'loss.search.pos_margin.lwo'; did you mean 'low'?",
    ),
    case(
        "search",
        patch("search: {trials: 2, sed: 0}"),
        "unknown key 'search.sed'; did you mean 'seed'?",
    ),
    case(
        "dataset",
        patch("dataset: {name: glyphs, rooot: data}"),
        "unknown key 'dataset.rooot'; did you mean 'root'?",
    ),
    case(
        "test",
        patch("test: {reproductons: 3}"),
        "unknown key 'test.reproductons'; did you mean 'reproductions'?",
    ),
    case(
        "strategy",
        patch("strategy: {name: rho_distance, parmas: {}}"),
        "unknown key 'strategy.parmas'; did you mean 'params'?",
    ),
    case(
        "miner",
        patch("loss: {name: triplet}\nminer: {name: batch_hard, parms: {}}"),
        "unknown key 'miner.parms'; did you mean 'params'?",
    ),
    case(
        "sampler",
        patch("sampler: {nmae: m_per_class}"),
        "unknown key 'sampler.nmae'; did you mean 'name'?",
    ),
    case(
        "overrides",
        patch("overrides: {itrations_per_epoch: 3}"),
        "overrides: unknown preset field 'itrations_per_epoch'; did you mean 'iterations_per_epoch'?",
    ),
    case(
        "overrides-nested",
        patch("overrides: {image: {resise: 40}}"),
        "overrides.image: unknown preset field 'resise'; did you mean 'resize'?",
    ),
    case(
        "overrides-deep",
        patch("overrides: {loss_optimizer: {lr: {low: 1.0e-5, high: 0.1, hihg: 3}}}"),
        "overrides.loss_optimizer.lr: unknown preset field 'hihg'; did you mean 'high'?",
    ),
    case(
        "overrides-table-key",
        patch("overrides: {batch: {images_per_class: {pair: 4, triple: 2}}}"),
        "preset cpu.yaml + overrides: batch.images_per_class: key 'triple': "
        "Input should be 'pair' or 'class' (got 'triple')",
    ),
]

WRONG_TYPES = [
    case("name-int", patch("name: 12"), "name: Input should be a valid string"),
    case("name-date", patch("name: 2024-01-01"), "name: Input should be a valid string"),
    case("loss-string", patch("loss: contrastive"), "loss: Input should be a valid dictionary"),
    case("loss-null", patch("loss: null"), "loss: Input should be a valid dictionary"),
    case("dataset-list", patch("dataset: [glyphs]"), "dataset: Input should be a valid dictionary"),
    case(
        "trials-string",
        patch("search: {trials: many}"),
        "search.trials: Input should be a valid integer, unable to parse string as an integer",
    ),
    case(
        "trials-fraction",
        patch("search: {trials: 2.5}"),
        "search.trials: Input should be a valid integer, got a number with a fractional part",
    ),
    case(
        "trials-zero",
        patch("search: {trials: 0}"),
        "search.trials: Input should be greater than or equal to 1",
    ),
    case(
        "seed-negative",
        patch("search: {seed: -1}"),
        "search.seed: Input should be greater than or equal to 0",
    ),
    case(
        "seed-huge",
        patch("search: {seed: 99999999999}"),
        "search.seed: Input should be less than or equal to 2147483647",
    ),
    case(
        "sampler-name",
        patch("search: {sampler: random}"),
        "search.sampler: Input should be 'gp', 'tpe' or 'ax' (got 'random')",
    ),
    case(
        "pruner-typo",
        patch("search: {pruner: wilcoxn}"),
        "search.pruner: Input should be 'none', 'median', 'wilcoxon', 'sequential' or "
        "'forgiving' (got 'wilcoxn'); did you mean 'wilcoxon'?",
    ),
    case(
        "prune-alpha-half",
        patch("search: {pruner: sequential, prune_alpha: 0.5}"),
        "search.prune_alpha: Input should be less than 0.5",
    ),
    case(
        "prune-delta-negative",
        patch("search: {pruner: sequential, prune_delta: -0.01}"),
        "search.prune_delta: Input should be greater than 0",
    ),
    case(
        "prune-p-zero",
        patch("search: {pruner: wilcoxon, prune_p: 0}"),
        "search.prune_p: Input should be greater than 0",
    ),
    case(
        "stop-key-typo",
        patch("search: {stop: {rule: gain, quantlie: 0.9}}"),
        "unknown key 'search.stop.quantlie'; did you mean 'quantile'?",
    ),
    case(
        "stop-future",
        patch("search: {stop: {future: optimistic}}"),
        "search.stop.future: Input should be 'incumbent' or 'best' (got 'optimistic')",
    ),
    case(
        "reproductions-list",
        patch("test: {reproductions: [2]}"),
        "test.reproductions: Input should be a valid integer",
    ),
    case(
        "dataset-params",
        patch("dataset: {name: glyphs, params: [1]}"),
        "dataset.params: Input should be a valid dictionary",
    ),
    case(
        "dataset-root-int",
        patch("dataset: {name: glyphs, root: 3}"),
        "dataset.root: Input should be a valid string",
    ),
    case(
        "dataset-root-nul",
        patch('dataset: {name: glyphs, root: "a\\0b"}'),
        "dataset.root: a path cannot contain a NUL character",
    ),
    case(
        "dataset-root-unknown-user",
        patch("dataset: {name: omniglot, root: '~no_such_user_mlrc/omniglot.zip'}"),
        "dataset.root: ~no_such_user_mlrc/omniglot.zip: unknown user in '~'",
    ),
    case(
        "overrides-list",
        patch("overrides: [max_epochs]"),
        "overrides: Input should be a valid dictionary",
    ),
    case(
        "overrides-int-key",
        patch("overrides: {1: 2}"),
        "overrides: key 1: Input should be a valid string",
    ),
    case(
        "overrides-section",
        patch("overrides: {image: 32}"),
        "preset cpu.yaml + overrides: image: Input should be a valid dictionary",
    ),
    case(
        "range-number",
        patch("loss: {name: contrastive, search: {pos_margin: 0.5}}"),
        "loss.search.pos_margin: Input should be a valid dictionary",
    ),
    case(
        "range-nan",
        patch("loss: {name: contrastive, search: {pos_margin: {low: .nan, high: 1}}}"),
        "loss.search.pos_margin: low and high must be finite numbers",
    ),
    case(
        "range-inf",
        patch("loss: {name: contrastive, search: {pos_margin: {low: 0, high: .inf}}}"),
        "loss.search.pos_margin: low and high must be finite numbers",
    ),
    case(
        "range-step-zero",
        patch("loss: {name: contrastive, search: {pos_margin: {low: 0, high: 1, step: 0}}}"),
        "loss.search.pos_margin: step must be > 0, got 0.0",
    ),
    case(
        "range-int-fraction",
        patch("loss: {name: contrastive, search: {pos_margin: {low: 0.5, high: 3, int: true}}}"),
        "loss.search.pos_margin: an int range needs whole numbers for low, high and step",
    ),
    case(
        "range-choices-list",
        patch("loss: {name: contrastive, search: {pos_margin: {choices: [[0.1, 0.2]]}}}"),
        "loss.search.pos_margin: choices must be numbers, strings, booleans or null, not list",
    ),
    case(
        "range-choices-and-range",
        patch("loss: {name: contrastive, search: {pos_margin: {choices: [0.1], low: 0, high: 1}}}"),
        "loss.search.pos_margin: give either choices or low/high, not both",
    ),
]

UNKNOWN_NAMES = [
    case(
        "loss",
        patch("loss: {name: tripplet}"),
        "loss.name: unknown loss 'tripplet'; did you mean 'triplet'? (available: ...",
    ),
    case(
        "loss-no-close-match",
        patch("loss: {name: zzzz}"),
        "loss.name: unknown loss 'zzzz' (available: angular, ...",
    ),
    case(
        "miner",
        patch("loss: {name: triplet}\nminer: {name: batch_hardd}"),
        "miner.name: unknown miner 'batch_hardd'; did you mean 'batch_hard'? (available: ...",
    ),
    case(
        "strategy",
        patch("strategy: {name: rho_distanse}"),
        "strategy.name: unknown strategy 'rho_distanse'; did you mean 'rho_distance'? (available: ...",
    ),
    case(
        "preset",
        patch("preset: refrence"),
        "preset: unknown preset 'refrence'; did you mean 'reference'? "
        "(available: cpu, modern, reference, traditional, or a path to a preset YAML)",
    ),
    case(
        "preset-file",
        patch("preset: no/such/preset.yaml"),
        "preset: no/such/preset.yaml is not a file (looked for ...",
    ),
    case(
        "dataset",
        patch("dataset: {name: glyph}"),
        "dataset.name: unknown dataset 'glyph'; did you mean 'glyphs'? (available: ...",
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
        patch("loss: {name: triplet, params: {marginn: 0.1}}"),
        "loss.params.marginn: loss 'triplet' takes no parameter 'marginn'; did you mean 'margin'? (it takes: ...",
    ),
    case(
        "loss-search",
        patch("loss: {name: normalized_softmax, search: {temprature: {low: 0.01, high: 1.0}}}"),
        "loss.search.temprature: loss 'normalized_softmax' takes no parameter 'temprature'; "
        "did you mean 'temperature'? (it takes: loss_lr, temperature)",
    ),
    case(
        "loss-without-parameters",
        patch("loss: {name: npairs, params: {margin: 0.1}}"),
        "loss.params.margin: loss 'npairs' takes no parameter 'margin' (it takes: none)",
    ),
    case(
        "miner-params",
        patch(
            "loss: {name: triplet}\nminer: {name: triplet_margin, params: {type_of_triplet: hard}}"
        ),
        "miner.params.type_of_triplet: miner 'triplet_margin' takes no parameter 'type_of_triplet'; "
        "did you mean 'type_of_triplets'? (it takes: margin, type_of_triplets)",
    ),
    case(
        "strategy-params",
        patch("loss: {name: triplet}\nstrategy: {name: das, params: {zz: 1}}"),
        "strategy.params.zz: strategy 'das' takes no parameter 'zz' (it takes: T, K, Z, r_s, r_b, normalize)",
    ),
    case(
        "sampler-params",
        patch("sampler: {name: m_per_class, params: {m: 4}}"),
        "sampler.params.m: sampler 'm_per_class' takes no parameter 'm' (it takes: none)",
    ),
    case(
        "dataset-params",
        patch("dataset: {name: image_folder, root: ., params: {size: 32}}"),
        "dataset.params.size: dataset 'image_folder' takes no parameter 'size' (it takes: none)",
    ),
    case(
        "enqueue-not-searched",
        patch("search: {trials: 2, enqueue: [{pos_margin: 0.1, margin: 0.5}]}"),
        "search.enqueue.0.margin: 'margin' is not searched (searched: pos_margin, neg_margin)",
    ),
    case(
        "enqueue-outside-range",
        patch("search: {trials: 2, enqueue: [{pos_margin: 5.0}]}"),
        "search.enqueue.0.pos_margin: 5.0 is outside the range [-0.2, 2.0]",
    ),
    case(
        "enqueue-not-a-number",
        patch("search: {trials: 2, enqueue: [{neg_margin: wide}]}"),
        "search.enqueue.0.neg_margin: expected a number, got 'wide'",
    ),
    case(
        "warm-start-two-sources",
        patch("search: {trials: 2, warm_start: {study: a, file: b.yaml}}"),
        "search.warm_start: give either study or file",
    ),
    case(
        "warm-start-no-source",
        patch("search: {trials: 2, warm_start: {top: 3}}"),
        "search.warm_start: give either study or file",
    ),
    case(
        "warm-start-top-0",
        patch("search: {trials: 2, warm_start: {study: a, top: 0}}"),
        "search.warm_start.top: Input should be greater than or equal to 1",
    ),
    case(
        "warm-start-a-name",
        patch("search: {trials: 2, warm_start: cub-contrastive}"),
        "search.warm_start: Input should be a valid dictionary",
    ),
]

RANGES_AND_BUDGETS = [
    case(
        "low-above-high",
        patch("loss: {name: contrastive, search: {neg_margin: {low: 1.5, high: 0.5}}}"),
        "loss.search.neg_margin: low (1.5) > high (0.5)",
    ),
    case(
        "low-above-high-int",
        patch(
            "loss: {name: triplet}\nstrategy: {name: das, search: {T: {low: 10, high: 1, int: true}}}"
        ),
        "strategy.search.T: low (10.0) > high (1.0)",
    ),
    case(
        "log-low-zero",
        patch(
            "loss: {name: normalized_softmax, search: {temperature: {low: 0, high: 1.0, log: true}}}"
        ),
        "loss.search.temperature: a log range must be > 0, got low = 0.0",
    ),
    case(
        "log-low-negative",
        patch(
            "loss: {name: normalized_softmax, search: {temperature: {low: -1, high: 1.0, log: true}}}"
        ),
        "loss.search.temperature: a log range must be > 0, got low = -1.0",
    ),
    case(
        "log-with-step",
        patch(
            "loss: {name: normalized_softmax, search: {temperature: {low: 0.01, high: 1, log: true, step: 0.01}}}"
        ),
        "loss.search.temperature: step cannot be used with log",
    ),
    case(
        "empty-space-many-trials",
        patch("loss: {name: npairs}"),
        "search.trials = 2 but the search space is empty (nothing to search: use trials: 1)",
    ),
    case("reproductions-one", patch("test: {reproductions: 1}"), CI_NEEDS_TWO.format(1)),
    case("reproductions-zero", patch("test: {reproductions: 0}"), CI_NEEDS_TWO.format(0)),
    case("reproductions-negative", patch("test: {reproductions: -3}"), CI_NEEDS_TWO.format(-3)),
]

COMBINATIONS = [
    case(
        "strategy-with-a-loss-it-does-not-support",
        patch("loss: {name: npairs}\nstrategy: {name: metrix}\nsearch: {trials: 1}"),
        "strategy: 'metrix' works with the losses contrastive, multi_similarity, proxy_anchor; not 'npairs'",
    ),
    case(
        "strategy-needs-a-tuple-loss",
        patch("loss: {name: mean_field_contrastive}\nstrategy: {name: rho_distance}"),
        "strategy: 'rho_distance' needs a tuple loss; loss 'mean_field_contrastive' takes no tuples",
    ),
    case(
        "strategy-mines-its-own-tuples",
        patch("loss: {name: triplet}\nstrategy: {name: rho_distance}\nminer: {name: batch_hard}"),
        "strategy 'rho_distance' mines its own tuples: remove miner",
    ),
    case(
        "miner-with-a-loss-without-pairs",
        patch("loss: {name: mean_field_class_wise_multi_similarity}\nminer: {name: batch_hard}"),
        "miner: loss 'mean_field_class_wise_multi_similarity' does not use a miner's pairs",
    ),
]

FILE_SHAPES = [
    case("empty-file", raw(""), "empty (expected a mapping of keys)"),
    case(
        "only-comments", raw("# a study\n# to be written\n"), "empty (expected a mapping of keys)"
    ),
    case("a-list", raw("- name: x\n- loss: contrastive\n"), "expected a mapping of keys, got list"),
    case("a-scalar", raw("contrastive\n"), "expected a mapping of keys, got str"),
    case("missing-loss", raw("name: x\ndataset: {name: glyphs}\n"), "loss: Field required"),
    case(
        "missing-name",
        raw("dataset: {name: glyphs}\nloss: {name: contrastive}\n"),
        "name: Field required",
    ),
    case(
        "unclosed-bracket",
        raw("name: x\ndataset: {name: glyphs\nloss: {name: contrastive}\n"),
        "line 3, column 5: malformed YAML (expected ',' or '}', but got ':')",
    ),
    case(
        "tab-indent",
        raw("name: x\nloss:\n\tname: contrastive\n"),
        "line 3, column 1: malformed YAML (found character '\\t' that cannot start any token)",
    ),
    case(
        "mapping-in-a-value",
        raw("name: x\nloss: name: contrastive\n"),
        "line 2, column 11: malformed YAML (mapping values are not allowed here)",
    ),
    case(
        "bad-indent",
        raw("name: x\nloss:\n  name: contrastive\n params: {}\n"),
        "line 4, column 2: malformed YAML (expected <block end>, but found '<block mapping start>')",
    ),
    case(
        "duplicate-key",
        raw(VALID + "preset: reference\n"),
        "line 11, column 1: malformed YAML (duplicate key 'preset')",
    ),
    case(
        "duplicate-nested-key",
        raw(VALID.replace("  name: contrastive\n", "  name: contrastive\n  name: triplet\n")),
        "line 6, column 3: malformed YAML (duplicate key 'name')",
    ),
    case(
        "python-tag",
        raw("name: !!python/object/apply:os.system [ls]\n"),
        "line 1, column 7: malformed YAML (could not ...",
    ),
    case("not-utf8", raw(b"name: caf\xe9\n"), "line 1, column 10: not UTF-8 text (byte 0xe9)"),
    case(
        "cut-inside-a-character",
        raw("name: x\nloss: {name: contrastive}\n# é".encode()[:-1]),
        "line 3, column 3: not UTF-8 text (byte 0xc3)",
    ),
]

GROUPS = {
    "unknown-key": UNKNOWN_KEYS,
    "wrong-type": WRONG_TYPES,
    "unknown-name": UNKNOWN_NAMES,
    "parameter-not-taken": PARAMETERS_NOT_TAKEN,
    "range-or-budget": RANGES_AND_BUDGETS,
    "combination": COMBINATIONS,
    "file": FILE_SHAPES,
}
CASES = [pytest.param(*c.values, id=f"{g}:{c.id}") for g, cases in GROUPS.items() for c in cases]


def write(tmp_path: Path, text: str | bytes, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_bad_study_file(tmp_path, fails_with, text, expected):
    path = write(tmp_path, text)
    message = fails_with(["study", "run"], path, expected)
    with pytest.raises(ConfigError) as err:  # the library says the same as the command
        load_study(path)
    assert str(err.value) == f"{path}: {message}"


def test_missing_and_unreadable_study_files(tmp_path, fails_with):
    fails_with(["study", "run"], tmp_path / "nope.yaml", "cannot read (No such file or directory)")
    fails_with(["study", "run"], tmp_path, "cannot read (Is a directory)")


ANCHORED = """\
name: bad-inputs
dataset: {name: glyphs}
loss:
  name: contrastive
  search:
    pos_margin: &range {low: 0.0, high: 1.0}
    neg_margin: {<<: *range, low: 0.5}
"""


@pytest.mark.parametrize(
    "text",
    [
        patch("overrides: {validate_every: {glyphs: 2}, patience: {glyphs: 4}}"),
        patch("overrides: {search: {seed: 4}, loss_optimizer: {lr: {low: 1.0e-4, high: 0.01}}}"),
        patch(
            "loss: {name: contrastive, search: "
            "{pos_margin: {low: 0, high: 1, step: 0.25}, neg_margin: {choices: [0.5, 1]}}}"
        ),
        patch("search: {trials: 2, enqueue: [{pos_margin: 0.0, neg_margin: 1.0}]}"),
        patch("loss: {name: npairs}\nsearch: {trials: 1}"),
        ANCHORED,
    ],
    ids=[
        "per-dataset-tables",
        "nested-overrides",
        "step-and-choices",
        "enqueue",
        "one-trial",
        "merge-key",
    ],
)
def test_near_misses_that_are_valid(tmp_path, text):
    """Looks odd, is right: the validation must not refuse these."""
    load_study(write(tmp_path, text))


@pytest.mark.parametrize("key", ["[/x]", "[red]"])
def test_rich_markup_in_a_key_is_printed_as_written(tmp_path, key):
    """Needs mlrc/cli.py to print the message with ``rich.markup.escape``: without it ``[/x]``
    raises MarkupError (a traceback, exit 1) and ``[red]`` vanishes from the line."""
    path = write(tmp_path, patch(f"'{key}': 1"))
    result = invoke(["study", "run", path])
    assert result.exit_code == 2 and message_of(result.output, path) == f"unknown key {key!r}"


def test_the_installed_command_prints_one_line_and_no_traceback(tmp_path):
    path = write(tmp_path, patch("loss: {name: contrastve}"))
    db = tmp_path / "store.sqlite"
    proc = run_mlrc("study", "run", str(path), "--storage", f"sqlite:///{db}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        f"error: {path}: loss.name: unknown loss 'contrastve'; did you mean 'contrastive'?"
    )
    assert not db.exists()


# --- property: mutated valid files give a study or one ConfigError line ------------------------

BASES = [
    VALID,
    """\
# Triplet loss with a miner — the étude of the corpus (non-ASCII: cuts inside a character)
name: bad-inputs-miner
dataset: {name: glyphs, params: {size: 32}}
loss: {name: triplet, params: {margin: 0.1}}
miner:
  name: triplet_margin
  params: {type_of_triplets: semihard}
sampler: {name: m_per_class}
search:
  trials: 3
  seed: 1
  enqueue:
  - {miner.margin: 0.2}
overrides:
  max_epochs: 2
  image: {resize: 20, crop: 16}
  validate_every: {glyphs: 1}
""",
    """\
name: bad-inputs-strategy  # ρ-distance: another non-ASCII comment
dataset: {name: glyphs}
preset: cpu
loss:
  name: ntxent
  search:
    temperature: {low: 0.01, high: 1.0, log: true}
strategy: {name: rho_distance}
search: {trials: 4, sampler: gp, pruner: median}
test: {reproductions: 3}
""",
]
ODD_VALUES = [0, 1, -1, 10**30, 2.5, float("nan"), float("inf"), float("-inf"), True, None]
ODD_VALUES += ["", "x", "contrastive", [], [1], {}, {"low": 1}]
TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="[]"), min_size=1, max_size=4
)  # brackets: see test_rich_markup_in_a_key_is_printed_as_written


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a parsed YAML tree (mapping keys and list indices)."""
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    else:
        return []
    return [p for k, v in items for p in [(*prefix, k), *_paths(v, (*prefix, k))]]


def _at(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _is_range(node: Any) -> bool:
    return isinstance(node, dict) and {"low", "high"} <= set(node)


def _typo(data: st.DataObject, key: str) -> str:
    i = data.draw(st.integers(0, max(len(key) - 1, 0)))
    how = data.draw(st.sampled_from(["drop", "double", "swap", "upper"]))
    if how == "drop" or len(key) < 2:
        return key[:i] + key[i + 1 :] or "k"
    if how == "double":
        return key[:i] + key[i] + key[i:]
    if how == "swap":
        j = min(i + 1, len(key) - 1)
        return key[:i] + key[j] + key[i] + key[j + 1 :] if j > i else key + "s"
    return key.upper()


def _mutate_tree(data: st.DataObject, doc: dict) -> str:
    """One structured mutation of a parsed study, dumped back to YAML."""
    how = data.draw(st.sampled_from(["delete", "rename", "retype", "swap"]))
    paths = {
        "rename": [p for p in _paths(doc) if isinstance(_at(doc, p[:-1]), dict)],
        "swap": [p for p in _paths(doc) if _is_range(_at(doc, p))],
    }.get(how) or _paths(doc)
    path = data.draw(st.sampled_from(paths))
    parent, key = _at(doc, path[:-1]), path[-1]
    if how == "swap" and _is_range(parent[key]):
        parent[key]["low"], parent[key]["high"] = parent[key]["high"], parent[key]["low"]
    elif how == "rename":
        parent[_typo(data, str(key))] = parent.pop(key)
    elif how == "delete":
        del parent[key]
    else:
        how = "retype"
        parent[key] = data.draw(st.sampled_from(ODD_VALUES))
    event(f"tree: {how}")
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _mutate_text(data: st.DataObject, text: str) -> str | bytes:
    """One textual mutation: truncate at a byte, insert characters, or repeat a line."""
    how = data.draw(st.sampled_from(["truncate", "insert", "repeat-line"]))
    event(f"text: {how}")
    if how == "truncate":  # at any byte, or half of the time inside a multi-byte character
        raw_ = text.encode() if isinstance(text, str) else text
        inside = [i for i, b in enumerate(raw_) if b & 0xC0 == 0x80]
        if inside and data.draw(st.booleans()):
            return raw_[: data.draw(st.sampled_from(inside))]
        return raw_[: data.draw(st.integers(0, len(raw_)))]
    if how == "insert":
        at = data.draw(st.integers(0, len(text)))
        return text[:at] + data.draw(TEXT) + text[at:]
    lines = text.splitlines(keepends=True)
    i = data.draw(st.integers(0, len(lines) - 1))
    return "".join(lines[: i + 1] + [lines[i]] + lines[i + 1 :])


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_study_files_give_a_study_or_one_error_line(tmp_path, data):
    text: str | bytes = data.draw(st.sampled_from(BASES))
    mode = data.draw(st.sampled_from(["tree", "text", "tree+text"]))
    if "tree" in mode:
        text = _mutate_tree(data, yaml.safe_load(text))
    if "text" in mode:
        text = _mutate_text(data, text)
    path = write(tmp_path, text, "mutated.yaml")
    try:
        load_study(path)
        event("outcome: a valid study")
    except ConfigError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e), str(e)
        event("outcome: ConfigError" + (" (UTF-8)" if "UTF-8" in str(e) else ""))
    result = invoke(["study", "status", path, "--storage", "sqlite://"])
    assert result.exit_code in (0, 1, 2) and isinstance(result.exception, SystemExit | None)
    assert len(result.output.splitlines()) == 1 and "Traceback" not in result.output
    assert result.output.startswith((f"error: {path}: ", "error: no study "))
