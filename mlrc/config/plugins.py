"""A study's miner and strategy: checked against its loss, their spaces and fixed parameters.

Their parameters are named ``miner.<param>`` and ``strategy.<param>`` in the study's search
space and fixed parameters.
"""

from __future__ import annotations

import inspect
from typing import Any

from mlrc.config.checks import check_names, check_space, check_values
from mlrc.config.load import ConfigError
from mlrc.config.schema import ParamSpace, Preset, StudyConfig
from mlrc.config.spaces import default_space, space_folder
from mlrc.params import ParamType

# Samplers that ignore ``m`` and put at least one positive pair in every batch (SPC-R).
_SAMPLERS_WITH_A_POSITIVE_PAIR = frozenset({"spc_random"})


def resolve_miner(study: StudyConfig, spec: Any, source: str) -> tuple[dict, dict]:
    """The miner's space and fixed params (``miner.<param>``); checks the loss takes pairs."""
    from mlrc.methods import miners
    from mlrc.registry import RegistryError

    ref = study.miner
    try:
        accepted = miners.params(ref.name)
    except RegistryError as e:
        raise ConfigError(f"{source}: miner.name: {e}") from None
    if not _takes_tuples(spec.name):
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
    name = study.strategy.name
    if strategy.losses is not None and spec.name not in strategy.losses:
        raise ConfigError(
            f"{source}: strategy: {name!r} works with the losses "
            f"{', '.join(sorted(strategy.losses))}; not {spec.name!r}"
        )
    if not strategy.uses_miner:
        if study.miner is not None:
            raise ConfigError(f"{source}: strategy {name!r} mines its own tuples: remove miner")
        if not _takes_tuples(spec.name):
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


def _takes_tuples(loss: str) -> bool:
    """Whether the loss's forward accepts mined pairs/triplets (PML's ``indices_tuple``)."""
    from mlrc.methods import losses

    probe = losses.build(loss, num_classes=2, embedding_size=2)
    return "indices_tuple" in inspect.signature(probe.forward).parameters


def _plugin_space(
    kind: str,
    ref: Any,
    accepted: dict[str, Any],
    source: str,
    types: dict[str, ParamType] | None = None,
) -> tuple[dict, dict]:
    """Space and fixed params of a miner/strategy, keys prefixed ``<kind>.``, each name checked
    (and each value against the plug-in's declared ``types``).

    Without ``search`` the plug-in's default space (``spaces/{miners,strategies}/`` of the
    package data) is used, minus what ``params`` fixes."""
    space: dict[str, ParamSpace] | None = ref.search
    if space is None:
        defaults = default_space(ref.name, space_folder(kind), kind=kind)
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
