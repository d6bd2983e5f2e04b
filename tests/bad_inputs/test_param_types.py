"""Parameter types and strategy–loss combinations, checked before anything trains.

Generated from the registries, so a new loss, miner or strategy is covered without a new case:
for every parameter of every shipped plug-in, a wrong-typed fixed value (and, where the plug-in
declares a range, a value just outside it) makes ``mlrc study run FILE`` print one line
``error: FILE: <kind>.params.<param>: expected ..., got ...`` and exit 2; the parameter's default
passes validation; a wrong-typed enqueued value of every searched parameter is refused the same
way. Strategies that need positive pairs (ρ, DAS) are refused with every loss trained on 32
classes × 1 image, in study and campaign files. Everything stops at validation (the store is
never opened; see ``fails_with``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mlrc.config import ConfigError, StudyConfig, default_space, load_study, resolve, space_folder
from mlrc.data import available as datasets
from mlrc.methods import losses, miners, strategies
from mlrc.params import ParamType
from mlrc.search.campaign_runner import load_campaign, resolve_campaign

BASE = {
    "name": "param-types",
    "dataset": {"name": "glyphs"},
    "preset": "cpu",
    "search": {"trials": 1},
    "test": {"reproductions": 2},
}
WRONG = {  # wrong-typed values per kind; the first one also runs through the command
    "number": ["abc", True, None, [1.0], float("inf"), float("nan")],
    "integer": ["abc", 2.5, True, None, float("inf")],
    "boolean": ["abc", 1, None],
    "choice": ["abc", 1, None],
}


def _shipped(factory: Any) -> bool:
    """Registered by mlrc itself (test modules register plug-ins of their own)."""
    return getattr(factory, "__module__", "").startswith("mlrc.")


def _strategy(name: str) -> strategies.Strategy:
    return strategies.STRATEGIES.get(name)()


def _host_loss(strategy: str) -> str:
    """A loss the strategy works with (pair batches, tuples): its supported ones, else triplet."""
    supported = _strategy(strategy).losses
    return "triplet" if supported is None else sorted(supported)[0]


def _plugins() -> list[tuple[str, str, dict[str, ParamType], dict[str, Any]]]:
    """(kind, name, types, defaults) of every shipped loss, miner and strategy."""
    out = []
    for name in losses.available():
        info = losses.info(name)
        if _shipped(info.factory):
            out.append(("loss", name, info.types, info.params))
    for name in miners.available():
        if _shipped(miners.MINERS.get(name)):
            out.append(("miner", name, miners.param_types(name), miners.params(name)))
    for name in strategies.available():
        if _shipped(strategies.STRATEGIES.get(name)):
            out.append(("strategy", name, strategies.param_types(name), strategies.params(name)))
    return out


PLUGINS = _plugins()
PARAMS = [
    (kind, name, p, t, defaults[p])
    for kind, name, types, defaults in PLUGINS
    for p, t in types.items()
]


def study(kind: str, name: str, params: dict[str, Any] | None = None, **extra: Any) -> dict:
    """A study using plug-in ``name`` of ``kind`` with ``params`` fixed (a host loss for a miner
    or strategy)."""
    ref = {"name": name, "params": params or {}}
    if kind == "loss":
        doc = {**BASE, "loss": ref}
    elif kind == "miner":
        doc = {**BASE, "loss": {"name": "triplet"}, "miner": ref}
    else:
        doc = {**BASE, "loss": {"name": _host_loss(name)}, "strategy": ref}
    return {**doc, **extra}


def write(tmp_path: Path, doc: dict, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def _id(kind: str, name: str, param: str, value: Any = "") -> str:
    return f"{kind}-{name}-{param}" + (f"-{value!r}" if value != "" else "")


def _outside(t: ParamType) -> list[Any]:
    """Values just outside the declared range (none when the range is open)."""
    r, base = t.range, 0 if t.kind == "integer" else 0.0
    step = 1 if t.kind == "integer" else 1e-3
    out = []
    if r.ge is not None:
        out.append(type(base)(r.ge) - step)
    if r.gt is not None:
        out.append(type(base)(r.gt))
    if r.le is not None:
        out.append(type(base)(r.le) + step)
    if r.lt is not None:
        out.append(type(base)(r.lt))
    return out


# --- the registries declare what the checks need ------------------------------------------------


def test_the_corpus_sees_every_plug_in():
    kinds = {kind for kind, *_ in PLUGINS}
    assert kinds == {"loss", "miner", "strategy"}
    assert {"proxy_nca", "fastap", "mean_field_contrastive"} <= {n for k, n, *_ in PLUGINS}
    assert {"das", "metrix", "rho_distance"} <= {n for k, n, *_ in PLUGINS if k == "strategy"}


@pytest.mark.parametrize(
    ("kind", "name", "types", "defaults"), PLUGINS, ids=[f"{k}-{n}" for k, n, *_ in PLUGINS]
)
def test_every_parameter_declares_a_type_its_default_satisfies(kind, name, types, defaults):
    assert types.keys() == defaults.keys()
    for p, t in types.items():
        assert t.kind != "any", f"{kind} {name!r}: parameter {p!r} declares no type"
        assert t.problem(defaults[p]) is None, (p, t.problem(defaults[p]))


@pytest.mark.parametrize("dataset", datasets())
@pytest.mark.parametrize("loss", [n for k, n, *_ in PLUGINS if k == "loss"])
def test_shipped_default_spaces_fit_the_declared_types(loss, dataset):
    """Every loss's default space (per dataset), and every miner's and strategy's, passes."""
    resolve(
        StudyConfig.model_validate({**BASE, "dataset": {"name": dataset}, "loss": {"name": loss}})
    )


@pytest.mark.parametrize("kind", ["miner", "strategy"])
def test_shipped_plug_in_spaces_fit_the_declared_types(kind):
    for k, name, *_ in PLUGINS:
        if k == kind:
            resolve(StudyConfig.model_validate(study(kind, name)))


# --- fixed values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "name", "param", "ptype", "value"),
    [pytest.param(k, n, p, t, WRONG[t.kind][0], id=_id(k, n, p)) for k, n, p, t, _ in PARAMS],
)
def test_a_wrong_typed_value_is_one_line_through_the_command(
    tmp_path, fails_with, kind, name, param, ptype, value
):
    path = write(tmp_path, study(kind, name, {param: value}))
    message = fails_with(["study", "run"], path, f"{kind}.params.{param}: expected ...")
    assert message.endswith(f", got {value!r}"), message
    assert ptype.describe() in message


@pytest.mark.parametrize(
    ("kind", "name", "param", "value"),
    [
        pytest.param(k, n, p, v, id=_id(k, n, p, v))
        for k, n, p, t, _ in PARAMS
        for v in WRONG[t.kind][1:] + _outside(t)
    ],
)
def test_wrong_types_and_values_outside_a_declared_range_are_refused(
    tmp_path, kind, name, param, value
):
    path = write(tmp_path, study(kind, name, {param: value}))
    with pytest.raises(ConfigError) as err:
        load_study(path)
    assert str(err.value).startswith(f"{path}: {kind}.params.{param}: expected ")
    assert str(err.value).endswith(f", got {value!r}") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kind", "name", "param", "default"),
    [pytest.param(k, n, p, d, id=_id(k, n, p)) for k, n, p, _, d in PARAMS],
)
def test_the_default_value_passes_validation(tmp_path, kind, name, param, default):
    resolved = load_study(write(tmp_path, study(kind, name, {param: default})))
    prefix = "" if kind == "loss" else f"{kind}."
    assert resolved.fixed[prefix + param] == default


EXACT = [
    (
        study("loss", "contrastive", {"pos_margin": "abc"}),
        "loss.params.pos_margin: expected a number, got 'abc'",
    ),
    (study("loss", "triplet", {"margin": True}), "loss.params.margin: expected a number, got True"),
    (
        study("loss", "fastap", {"num_bins": 0}),
        "loss.params.num_bins: expected an integer ≥ 1, got 0",
    ),
    (
        study("loss", "fastap", {"num_bins": 2.5}),
        "loss.params.num_bins: expected an integer ≥ 1, got 2.5",
    ),
    (
        study("loss", "ntxent", {"temperature": "1e-3"}),
        "loss.params.temperature: expected a number > 0, got '1e-3' "
        "(YAML reads 1e-3 as text; write 1.0e-3)",
    ),
    (
        study("loss", "arcface", {"margin": "28.6°"}),
        "loss.params.margin: expected a number (degrees), got '28.6°'",
    ),
    (
        study("loss", "normalized_softmax", {"loss_lr": 0}),
        "loss.params.loss_lr: expected a number > 0, got 0",
    ),
    (
        study("miner", "triplet_margin", {"type_of_triplets": "hardest"}),
        "miner.params.type_of_triplets: expected one of 'all', 'hard', 'semihard', 'easy', "
        "got 'hardest'",
    ),
    (
        study("strategy", "das", {"normalize": "yes please"}),
        "strategy.params.normalize: expected a boolean (true or false), got 'yes please'",
    ),
    (
        study("strategy", "das", {"r_s": 1.0}),
        "strategy.params.r_s: expected a number in [0, 1), got 1.0",
    ),
    (
        study("strategy", "rho_distance", {"p_switch": 1.5}),
        "strategy.params.p_switch: expected a number in [0, 1], got 1.5",
    ),
    (
        study("strategy", "metrix", {"mixup": "manifold"}),
        "strategy.params.mixup: expected one of 'input', 'feature', 'embedding', got 'manifold'",
    ),
    # search spaces: choices of the parameter's type; low/high for numbers, int: true for integers
    (
        {**BASE, "loss": {"name": "triplet", "search": {"margin": {"choices": [0.1, "wide"]}}}},
        "loss.search.margin.choices: expected a number, got 'wide'",
    ),
    (
        {**BASE, "loss": {"name": "ntxent", "search": {"temperature": {"low": 0, "high": 1}}}},
        "loss.search.temperature.low: expected a number > 0, got 0.0",
    ),
    (
        {
            **study("strategy", "das"),
            "strategy": {"name": "das", "search": {"T": {"low": 1, "high": 5}}},
        },
        "strategy.search.T: an integer parameter needs int: true "
        "(a float range would be truncated)",
    ),
    (
        {
            **study("strategy", "metrix"),
            "strategy": {"name": "metrix", "search": {"mixup": {"low": 0, "high": 1}}},
        },
        "strategy.search.mixup: takes one of 'input', 'feature', 'embedding': "
        "search it with choices, not low/high",
    ),
    (
        {
            **study("strategy", "metrix"),
            "strategy": {
                "name": "metrix",
                "search": {"pairs": {"choices": ["pos_neg", "pos_pos"]}},
            },
        },
        "strategy.search.pairs.choices: "
        "expected one of 'random', 'pos_neg', 'anc_neg', got 'pos_pos'",
    ),
]


@pytest.mark.parametrize(
    ("doc", "expected"), EXACT, ids=[e.split(":")[0] + f"-{i}" for i, (_, e) in enumerate(EXACT)]
)
def test_exact_messages(tmp_path, fails_with, doc, expected):
    fails_with(["study", "run"], write(tmp_path, doc), expected)


@pytest.mark.parametrize(
    ("doc", "key", "value"),
    [
        (study("loss", "contrastive", {"pos_margin": 1}), "pos_margin", 1),  # an int for a float
        (study("loss", "fastap", {"num_bins": 10.0}), "num_bins", 10.0),  # an integral float
        (study("strategy", "das", {"T": 0}), "strategy.T", 0),  # T = 0 is the plain step
        (study("loss", "triplet", {"margin": -0.2}), "margin", -0.2),  # MLRC searched margins < 0
        (study("loss", "margin", {"beta": -0.2}), "beta", -0.2),
    ],
    ids=["int-for-float", "integral-float-for-int", "das-T-0", "negative-margin", "negative-beta"],
)
def test_near_misses_that_are_valid(tmp_path, doc, key, value):
    assert load_study(write(tmp_path, doc)).fixed[key] == value


# --- enqueued trials ----------------------------------------------------------------------------


def _searched() -> list[Any]:
    """(kind, name, key in the space, type) of every parameter searched by default."""
    out = []
    for kind, name, types, _ in PLUGINS:
        folder = space_folder(kind)
        prefix = "" if kind == "loss" else f"{kind}."
        for p in default_space(name, folder):
            if p in types:
                out.append(pytest.param(kind, name, prefix + p, types[p], id=_id(kind, name, p)))
    return out


@pytest.mark.parametrize(("kind", "name", "key", "ptype"), _searched())
def test_a_wrong_typed_enqueued_value_is_refused(tmp_path, kind, name, key, ptype):
    value = WRONG[ptype.kind][0]
    doc = study(kind, name, search={"trials": 2, "enqueue": [{key: value}]})
    with pytest.raises(ConfigError) as err:
        load_study(write(tmp_path, doc))
    assert str(err.value).endswith(
        f"search.enqueue.0.{key}: expected {ptype.describe()}, got {value!r}"
    )


def test_an_enqueued_float_for_an_integer_parameter_is_refused(tmp_path, fails_with):
    doc = study("strategy", "das", search={"trials": 2, "enqueue": [{"strategy.T": 2.5}]})
    fails_with(
        ["study", "run"],
        write(tmp_path, doc),
        "search.enqueue.0.strategy.T: expected an integer ≥ 0, got 2.5",
    )


# --- strategies that need positive pairs ----------------------------------------------------------

NEED_PAIRS = [n for k, n, *_ in PLUGINS if k == "strategy" and _strategy(n).positive_pairs]
CLASS_LOSSES = [n for k, n, *_ in PLUGINS if k == "loss" and losses.info(n).batch == "class"]


def test_rho_and_das_declare_that_they_need_positive_pairs():
    assert set(NEED_PAIRS) == {"rho_distance", "das"}
    assert {"proxy_nca", "proxy_anchor", "normalized_softmax", "soft_triple"} <= set(CLASS_LOSSES)


def _refusal(strategy: str, loss: str) -> str:
    return (
        f"strategy.name: {strategy!r} needs batches with positive pairs "
        f"({_strategy(strategy).positive_pairs}); loss {loss!r} is trained on 32 classes × 1 "
        "image per batch (batch.images_per_class.class = 1)"
    )


def _combinations() -> list[Any]:
    """Each strategy needing positive pairs × each 32 × 1 loss it is not refused for otherwise."""
    out = []
    for s in NEED_PAIRS:
        for loss in CLASS_LOSSES:
            try:  # with m = 2, what is left is the positive-pair check
                resolve(
                    StudyConfig.model_validate(
                        {
                            **BASE,
                            "loss": {"name": loss},
                            "strategy": {"name": s},
                            "overrides": {"batch": {"images_per_class": {"class": 2}}},
                        }
                    )
                )
            except ConfigError:
                continue  # refused for another reason (e.g. ρ needs a tuple loss)
            out.append(pytest.param(s, loss, id=f"{s}-{loss}"))
    return out


COMBINATIONS = _combinations()


def test_the_combinations_cover_proxy_nca_for_rho_and_das():
    ids = {p.id for p in COMBINATIONS}
    assert {"rho_distance-proxy_nca", "das-proxy_nca", "das-proxy_anchor"} <= ids


@pytest.mark.parametrize(("strategy", "loss"), COMBINATIONS)
def test_a_strategy_needing_positive_pairs_is_refused_with_a_32_by_1_loss(
    tmp_path, fails_with, strategy, loss
):
    doc = {**BASE, "loss": {"name": loss}, "strategy": {"name": strategy}}
    fails_with(["study", "run"], write(tmp_path, doc), _refusal(strategy, loss))


@pytest.mark.parametrize(
    "change",
    [
        {"overrides": {"batch": {"images_per_class": {"class": 4}}}},  # 8 classes × 4
        {"sampler": {"name": "spc_random"}},  # SPC-R: at least one positive pair per batch
    ],
    ids=["m-4", "spc-random"],
)
@pytest.mark.parametrize("strategy", ["rho_distance", "das"])
def test_with_positive_pairs_in_the_batch_the_combination_is_accepted(tmp_path, strategy, change):
    doc = {**BASE, "loss": {"name": "proxy_nca"}, "strategy": {"name": strategy}, **change}
    assert load_study(write(tmp_path, doc)).study.strategy.name == strategy


def test_a_campaign_crossing_a_32_by_1_loss_with_das_is_refused_with_the_campaign_key(
    tmp_path, fails_with
):
    doc = {
        "name": "camp",
        "datasets": [{"name": "glyphs"}],
        "losses": ["contrastive", "proxy_nca"],
        "strategies": [None, "das"],
        "preset": "cpu",
        "search": {"trials": 1, "seed": 5},
        "test": {"reproductions": 2},
    }
    path = write(tmp_path, doc, "campaign.yaml")
    expected = _refusal("das", "proxy_nca").replace("strategy.name:", "strategies.1.name:")
    fails_with(["campaign", "run"], path, expected)
    with pytest.raises(ConfigError, match="strategies.1.name: 'das' needs batches"):
        resolve_campaign(load_campaign(path), str(path))


def test_the_shipped_studies_and_campaigns_are_valid():
    """No shipped file uses a combination refused above (or a wrong-typed value)."""
    root = Path(__file__).resolve().parents[2] / "studies"
    for path in sorted(root.rglob("*.yaml")):
        if "presets" in path.parts or "spaces" in path.parts:
            continue
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            continue
        if "losses" in data:  # a campaign
            resolve_campaign(load_campaign(path, check_roots=False), str(path))
        elif "loss" in data:
            doc = {**data, "dataset": {k: v for k, v in data["dataset"].items() if k != "root"}}
            resolve(StudyConfig.model_validate(doc), str(path))
