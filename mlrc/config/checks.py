"""Checks of a study's parameters against what each plug-in declares (:mod:`mlrc.params`).

Each check raises one :class:`~mlrc.config.load.ConfigError` naming the file and the key: a
parameter the plug-in does not take, a fixed value of the wrong type, a search range outside
the declared range, an enqueued trial that cannot be drawn from the space.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Iterable
from typing import Any

from mlrc.config.load import ConfigError, did_you_mean
from mlrc.config.schema import DatasetRef, ParamSpace, SamplerRef, StudyConfig
from mlrc.params import ANY, ParamType, Range

LOSS_LR_TYPE = ParamType("number", range=Range(gt=0))  # the loss optimiser's learning rate


def check_names(
    kind: str,
    name: str,
    given: Iterable[tuple[str, Iterable[str]]],
    accepted: Collection[str],
    source: str,
) -> None:
    """Each parameter in ``given`` (``(where, names)`` pairs, e.g. ``("loss.params", {...})``)
    is one the ``kind`` plug-in ``name`` takes (``accepted``, listed in the message)."""
    for where, names in given:
        for k in names:
            if k not in accepted:
                raise ConfigError(
                    f"{source}: {where}.{k}: {kind} {name!r} takes no parameter {k!r}"
                    f"{did_you_mean(k, accepted)} "
                    f"(it takes: {', '.join(accepted) or 'none'})"
                )


def check_dataset_params(ref: DatasetRef, source: str) -> None:
    """Each ``dataset.params`` key against the dataset's keyword arguments (a dataset whose
    factory takes ``**kwargs`` is checked when it is built)."""
    from mlrc import data

    params = inspect.signature(data.DATASETS.get(ref.name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [k for k in params if k != "root"]
    check_names("dataset", ref.name, [("dataset.params", ref.params)], accepted, source)


def check_root(name: str, root: str | None, where: str) -> None:
    """A root given where dataset ``name`` needs one, and none for the built-in ``glyphs``
    (``where``: ``FILE: dataset.root``). Checked where roots are looked up (a study file that
    is run, a campaign's datasets), not when a template without its root is resolved."""
    from mlrc import data

    if root is None and name in data.NEEDS_ROOT:
        raise ConfigError(
            f"{where}: dataset {name!r} needs a root directory, and none is given (root: PATH)"
        )
    if root is not None and name == "glyphs":
        raise ConfigError(f"{where}: dataset 'glyphs' is built in and takes no root")


def check_sampler(ref: SamplerRef, source: str) -> None:
    """The sampler is registered and takes the parameters given."""
    from mlrc.methods import samplers
    from mlrc.registry import RegistryError

    try:
        accepted = samplers.params(ref.name)
    except RegistryError as e:
        raise ConfigError(f"{source}: sampler.name: {e}") from None
    check_names("sampler", ref.name, [("sampler.params", ref.params)], list(accepted), source)


def check_values(
    where: str, values: dict[str, Any], types: dict[str, ParamType], source: str
) -> None:
    """Each fixed value against its parameter's declared type and range."""
    for k, v in values.items():
        problem = types.get(k, ANY).problem(v)
        if problem:
            raise ConfigError(f"{source}: {where}.{k}: {problem}")


def check_space(
    where: str, space: dict[str, ParamSpace], types: dict[str, ParamType], source: str
) -> None:
    """Each search space against its parameter's declared type: choices of that type, numeric
    ranges only for numbers (``int: true`` for an integer) with both ends in the declared range."""
    for k, s in space.items():
        t = types.get(k, ANY)
        if t.kind == "any":
            continue
        if s.choices is not None:
            for c in s.choices:
                problem = t.problem(c)
                if problem:
                    raise ConfigError(f"{source}: {where}.{k}.choices: {problem}")
            continue
        if t.kind not in ("number", "integer"):
            raise ConfigError(
                f"{source}: {where}.{k}: takes {t.describe()}: search it with choices, not low/high"
            )
        if t.kind == "integer" and not s.int_:
            raise ConfigError(
                f"{source}: {where}.{k}: an integer parameter needs int: true "
                "(a float range would be truncated)"
            )
        for end in ("low", "high"):
            problem = t.problem(getattr(s, end))
            if problem:
                raise ConfigError(f"{source}: {where}.{k}.{end}: {problem}")


def check_enqueue(
    enqueue: list[dict[str, Any]],
    space: dict[str, ParamSpace],
    source: str,
    types: dict[str, ParamType] | None = None,
) -> None:
    """Each enqueued trial names searched parameters only, with values of the parameter's
    declared type (``types``, keys as in ``space``) inside their search ranges."""
    for i, params in enumerate(enqueue):
        for k, v in params.items():
            where = f"{source}: search.enqueue.{i}.{k}"
            if k not in space:
                raise ConfigError(
                    f"{where}: {k!r} is not searched (searched: {', '.join(space) or 'nothing'})"
                )
            t = (types or {}).get(k, ANY)
            problem = t.problem(v, check_range=False) or _outside(space[k], v) or t.problem(v)
            if problem:
                raise ConfigError(f"{where}: {problem}")


def _outside(s: ParamSpace, v: Any) -> str | None:
    """Why ``v`` cannot be a value of ``s`` (None: it can)."""
    if s.choices is not None:
        return None if v in s.choices else f"{v!r} is not one of the choices {s.choices}"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"{v!r} is not a number"
    if not s.low <= v <= s.high:
        return f"{v} is outside the range [{s.low}, {s.high}]"
    return None


def param_types(study: StudyConfig, loss_types: dict[str, ParamType]) -> dict[str, ParamType]:
    """Declared types of every parameter of the study, named as in its search space."""
    from mlrc.methods import miners, strategies

    out = dict(loss_types)
    for ref, module in ((study.miner, miners), (study.strategy, strategies)):
        if ref is not None:
            out.update({module.PREFIX + k: t for k, t in module.param_types(ref.name).items()})
    return out
