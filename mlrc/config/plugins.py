"""A study's miner and strategy: checked against its loss, their spaces and fixed parameters;
and the catalogue of every registered plug-in (:func:`plugin_records`, ``mlrc plugins list``).

Their parameters are named ``miner.<param>`` and ``strategy.<param>`` in the study's search
space and fixed parameters.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from mlrc.config.checks import check_names, check_space, check_values
from mlrc.config.load import ConfigError, did_you_mean
from mlrc.config.schema import ParamSpace, Preset, StudyConfig
from mlrc.config.spaces import default_space
from mlrc.params import ParamType

# Samplers that ignore ``m`` and put at least one positive pair in every batch (SPC-R).
_SAMPLERS_WITH_A_POSITIVE_PAIR = frozenset({"spc_random"})


def resolve_miner(study: StudyConfig, spec: Any, source: str) -> tuple[dict, dict]:
    """The miner's space and fixed params (``miner.<param>``); checks the loss takes pairs."""
    from mlrc.methods import losses, miners
    from mlrc.registry import RegistryError

    ref = study.miner
    try:
        accepted = miners.params(ref.name)
    except RegistryError as e:
        raise ConfigError(f"{source}: miner.name: {e}") from None
    if not losses.takes_tuples(spec.name):  # declared; probed for a plug-in that declares none
        raise ConfigError(f"{source}: miner: loss {spec.name!r} does not use a miner's pairs")
    return _plugin_space("miner", ref, accepted, source, miners.param_types(ref.name))


def resolve_strategy(
    study: StudyConfig, spec: Any, source: str, preset: Preset | None = None
) -> tuple[dict, dict]:
    """The strategy's space and fixed params (``strategy.<param>``); checks loss, miner and, for a
    strategy that needs them, that the loss's batches have positive pairs."""
    from mlrc.methods import strategies
    from mlrc.registry import RegistryError

    ref = study.strategy
    try:
        accepted = strategies.params(ref.name)
    except RegistryError as e:
        raise ConfigError(f"{source}: strategy.name: {e}") from None
    strategy = strategies.STRATEGIES.get(ref.name)()
    _check_strategy_losses(study, spec, strategy, source)
    if strategy.positive_pairs and preset is not None:
        _check_positive_pairs(study, spec, strategy, preset, source)
    return _plugin_space("strategy", ref, accepted, source, strategies.param_types(ref.name))


def _check_strategy_losses(study: StudyConfig, spec: Any, strategy: Any, source: str) -> None:
    """The strategy works with this loss, and (mining its own tuples) with no miner."""
    from mlrc.methods import losses

    name = study.strategy.name
    if strategy.losses is not None and spec.name not in strategy.losses:
        raise ConfigError(
            f"{source}: strategy: {name!r} works with the losses "
            f"{', '.join(sorted(strategy.losses))}; not {spec.name!r}"
        )
    if not strategy.uses_miner:
        if study.miner is not None:
            raise ConfigError(f"{source}: strategy {name!r} mines its own tuples: remove miner")
        if not losses.takes_tuples(spec.name):
            raise ConfigError(
                f"{source}: strategy: {name!r} needs a tuple loss; "
                f"loss {spec.name!r} takes no tuples"
            )


def _check_positive_pairs(
    study: StudyConfig, spec: Any, strategy: Any, preset: Preset, source: str
) -> None:
    """The loss's batches have positive pairs (≥ 2 images per class, or a sampler that
    guarantees one), as the strategy needs."""
    m = preset.batch.images_per_class.get(spec.batch)
    if m is not None and m < 2 and study.sampler.name not in _SAMPLERS_WITH_A_POSITIVE_PAIR:
        raise ConfigError(
            f"{source}: strategy.name: {study.strategy.name!r} needs batches with positive pairs "
            f"({strategy.positive_pairs}); loss {spec.name!r} is trained on "
            f"{preset.batch.size // max(m, 1)} classes × {m} image per batch "
            f"(batch.images_per_class.{spec.batch} = {m})"
        )


def _plugin_space(
    kind: str,
    ref: Any,
    accepted: dict[str, Any],
    source: str,
    types: dict[str, ParamType] | None = None,
) -> tuple[dict, dict]:
    """Space and fixed params of a miner/strategy, keys prefixed ``<kind>.``, each name checked
    (and each value against the plug-in's declared ``types``).

    Without ``search`` the plug-in's default space (its registry's, see
    :func:`~mlrc.config.spaces.default_space`) is used, minus what ``params`` fixes."""
    space: dict[str, ParamSpace] | None = ref.search
    if space is None:
        defaults = default_space(ref.name, kind=kind)
        space = {k: v for k, v in defaults.items() if k not in ref.params}
    given = ((f"{kind}.params", ref.params), (f"{kind}.search", space))
    check_names(kind, ref.name, given, list(accepted), source)
    check_values(f"{kind}.params", ref.params, types or {}, source)
    check_space(f"{kind}.search", space, types or {}, source)
    prefix = f"{kind}."
    return (
        {prefix + k: v for k, v in space.items()},
        {prefix + k: v for k, v in ref.params.items()},
    )


# --- the catalogue of registered plug-ins -------------------------------------------------------

#: The kinds of plug-in, as their registries name them (``mlrc plugins list KIND``).
PLUGIN_KINDS = ("loss", "miner", "strategy", "sampler", "trunk", "dataset", "metric")


@dataclass(frozen=True)
class PluginRecord:
    """One registered plug-in as ``mlrc plugins list`` shows it.

    ``source``: ``"mlrc"`` for a built-in, else the distribution that registered it;
    ``params``: each parameter a study may set → ``{"default": value, "type": description}``
    (``"required": true`` and a None default where there is none: a metric's ``@`` value);
    ``space``: each parameter searched by default → its range (``[1e-05, 0.1] log``);
    ``capabilities``: what the kind declares (a loss's ``batch``, ``takes_tuples`` — with
    ``takes_tuples_probed: true`` when not declared — and ``has_parameters``; a strategy's
    ``uses_miner``, ``positive_pairs``, ``losses``; a metric's ``kind``, ``param`` (written
    after ``@``), ``depth``, ``needs`` and ``higher_is_better``); ``doc``: the docstring's first line."""

    kind: str
    name: str
    source: str
    doc: str = ""
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    space: dict[str, str] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (defaults JSON cannot hold are written as their ``str``)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "doc": self.doc,
            "params": {
                k: {**v, "default": _jsonable(v["default"])} for k, v in self.params.items()
            },
            "space": dict(self.space),
            "capabilities": dict(self.capabilities),
        }


def plugin_records(kind: str | None = None) -> list[PluginRecord]:
    """Every registered plug-in of ``kind`` (None: of every kind, in :data:`PLUGIN_KINDS` order),
    by name, entry-point plug-ins included; an unknown kind is a ConfigError naming the close one.
    A trunk name prefix (``timm:<model>``) is one record named ``<prefix>:<model>``."""
    if kind is not None and kind not in PLUGIN_KINDS:
        raise ConfigError(
            f"unknown plug-in kind {kind!r}{did_you_mean(kind, PLUGIN_KINDS)} "
            f"(kinds: {', '.join(PLUGIN_KINDS)})"
        )
    out: list[PluginRecord] = []
    for k in PLUGIN_KINDS if kind is None else (kind,):
        registry = _registry(k)
        out += [_record(k, registry, name) for name in registry.available()]
        for prefix in getattr(registry, "prefixes", {}):
            out.append(PluginRecord(k, f"{prefix}:<model>", "mlrc", f"any {prefix} model"))
    return out


def _registry(kind: str) -> Any:
    """The registry of ``kind`` (imported here: reading one loads its built-ins)."""
    if kind == "trunk":
        from mlrc.models import TRUNKS

        return TRUNKS
    if kind == "dataset":
        from mlrc.data import DATASETS

        return DATASETS
    if kind == "metric":
        from mlrc.protocol.scoring import METRICS

        return METRICS
    from mlrc.methods import losses, miners, samplers, strategies

    return {
        "loss": losses.LOSSES,
        "miner": miners.MINERS,
        "strategy": strategies.STRATEGIES,
        "sampler": samplers.SAMPLERS,
    }[kind]


def _record(kind: str, registry: Any, name: str) -> PluginRecord:
    entry = registry.info(name)
    types = entry.types
    params = {
        p: {"default": d, "type": types[p].describe() if p in types else "any value"}
        for p, d in entry.params.items()
    }
    for p, d in entry.params.items():
        if d is inspect.Parameter.empty:  # required (a metric's @ value): no default to show
            params[p] = {"default": None, "required": True, "type": params[p]["type"]}
    space = {}
    if kind in ("loss", "miner", "strategy"):
        found = default_space(name, kind=kind)
        space = {p: _range_text(s) for p, s in found.items()}
    return PluginRecord(
        kind, name, registry.source(name), entry.doc, params, space, _capabilities(kind, name)
    )


def _capabilities(kind: str, name: str) -> dict[str, Any]:
    """What the kind declares about ``name`` (see :class:`PluginRecord`)."""
    if kind == "loss":
        from mlrc.methods import losses

        info = losses.info(name)
        out: dict[str, Any] = {"batch": info.batch, "takes_tuples": losses.takes_tuples(name)}
        if info.takes_tuples is None:
            out["takes_tuples_probed"] = True
        return {**out, "has_parameters": info.has_parameters}
    if kind == "strategy":
        from mlrc.methods import strategies

        built = strategies.build(name)  # the class attributes config checks a study against
        losses_ = None if built.losses is None else sorted(built.losses)
        return {
            "uses_miner": built.uses_miner,
            "positive_pairs": built.positive_pairs is not None,
            "losses": losses_,
        }
    if kind == "metric":
        from mlrc.protocol.scoring import METRICS

        m = METRICS.info(name)
        return {
            "kind": m.kind,
            "param": m.param,
            "depth": m.depth,
            "needs": sorted(m.needs),
            "higher_is_better": m.higher_is_better,
        }
    return {}


def _range_text(space: ParamSpace) -> str:
    """``[0, 0.5]``, then ``log``, ``int``, ``step 0.1`` where set; or the choices, ``a | b``."""
    if space.choices is not None:
        return " | ".join(map(str, space.choices))
    text = f"[{space.low:g}, {space.high:g}]"
    extras = [w for w, on in (("log", space.log), ("int", space.int_)) if on]
    if space.step is not None:
        extras.append(f"step {space.step:g}")
    return " ".join([text, *extras])


def _jsonable(value: Any) -> Any:
    """``value`` when JSON holds it as is, else its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
