"""Search spaces: the ranges a study searches when it gives none of its own.

Every loss, miner and strategy finds its default space through its registry
(:meth:`mlrc.registry.Registry.space`): the built-ins keep theirs beside their kind's modules
(``mlrc/methods/losses/spaces/<loss>.yaml``, ``mlrc/methods/miners/spaces/``,
``mlrc/methods/strategies/spaces/``; in a checkout ``studies/spaces/{losses,miners,strategies}``
link there), a plug-in ``<name>.yaml`` beside its module or the file its registration names. A
loss's file may also hold ``per_dataset`` and ``with_miner`` tables (see :func:`default_space`).
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from mlrc.config.load import (
    ConfigError,
    did_you_mean,
    load_yaml,
    not_a_mapping,
    validate_model,
)
from mlrc.config.schema import ParamSpace

# The package of each kind whose registry holds default search spaces.
SPACE_KINDS = {"loss": "losses", "miner": "miners", "strategy": "strategies"}

# Keys of a loss's space file that are not parameters: the ranges that differ per dataset.
PER_DATASET = "per_dataset"
WITH_MINER = "with_miner"


def space_folder(kind: str) -> Path:
    """The folder of the built-in default spaces of ``kind`` (loss, miner or strategy):
    ``mlrc/methods/<kind>s/spaces``, found through ``importlib.resources`` (a file-system path:
    mlrc is installed as files)."""
    return Path(str(files("mlrc.methods").joinpath(SPACE_KINDS[kind]).joinpath("spaces")))


# The built-in losses' spaces: the one folder whose files may hold per-dataset tables.
LOSS_SPACES_DIR = space_folder("loss")


def registered_space_file(kind: str, name: str) -> Path | Traversable | None:
    """The search-space file the registry of ``kind`` finds for ``name`` (a built-in's
    ``spaces/<name>.yaml``, a plug-in's own); None: none, or not a kind with spaces."""
    # Imported here, as everywhere in mlrc.config: the registries load pytorch-metric-learning
    # and every built-in (seconds), which ``import mlrc.config`` alone does not need.
    from mlrc.methods import losses, miners, strategies

    registries = {"loss": losses.LOSSES, "miner": miners.MINERS, "strategy": strategies.STRATEGIES}
    registry = registries.get(kind)
    return None if registry is None else registry.space(name)


def default_space(
    loss: str,
    folder: Path | None = None,
    dataset: str | None = None,
    miner: str | None = None,
    kind: str = "loss",
) -> dict[str, ParamSpace]:
    """The space file ``<folder>/<loss>.yaml`` when ``folder`` is given and has one; else the one
    the registry of ``kind`` (loss, miner or strategy) finds for ``loss`` — a built-in's or a
    plug-in's (see :mod:`mlrc.registry`); {} when there is none.

    A loss's space file may also give ranges that differ per dataset (the reality check searched
    some parameters over other ranges on some datasets):

    - ``per_dataset: {<dataset>: {<param>: <range> | null}}`` — on that dataset the parameter's
      range is replaced by this one (a whole range, not merged), or with ``null`` not searched;
    - ``with_miner: {<miner>: {per_dataset: ...}}`` — the table used *instead of* the one above
      when the study mines with ``<miner>`` (MLRC searched "MS + miner" with its own ranges).

    Without ``dataset`` the base ranges are returned; the tables are checked either way (an
    unknown dataset, miner or parameter is a ConfigError naming the file and the key)."""
    path, loss_space = _space_file(loss, folder, kind)
    if path is None:
        return {}
    space, tables = _read_space(path, loss_space)
    table = _per_dataset(tables.get(PER_DATASET), space, f"{path}: {PER_DATASET}")
    by_miner = _with_miner(tables.get(WITH_MINER), space, f"{path}: {WITH_MINER}")
    if miner is not None and miner in by_miner:
        table = by_miner[miner]
    out = {**space, **table.get(dataset, {})} if dataset is not None else space
    return {k: v for k, v in out.items() if v is not None}


def _space_file(
    name: str, folder: Path | None, kind: str
) -> tuple[Path | Traversable | None, bool]:
    """The space file of ``name`` (``<folder>/<name>.yaml``, else the registry's; None: there
    is none) and whether it is a loss's file (which may hold per-dataset tables)."""
    if folder is not None and (folder / f"{name}.yaml").is_file():
        return folder / f"{name}.yaml", folder.resolve() == LOSS_SPACES_DIR.resolve()
    return registered_space_file(kind, name), kind == "loss"


def _read_space(
    path: Path | Traversable, loss_space: bool
) -> tuple[dict[str, ParamSpace], dict[str, Any]]:
    """The ranges of a space file and its (unchecked) ``per_dataset``/``with_miner`` tables."""
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(not_a_mapping(data, str(path)))
    tables = {k: data.pop(k) for k in (PER_DATASET, WITH_MINER) if k in data}
    space = {k: validate_model(ParamSpace, v, f"{path}: {k}") for k, v in data.items()}
    if tables and not loss_space:
        raise ConfigError(
            f"{path}: {next(iter(tables))}: only a loss's space file "
            "(studies/spaces/losses/<loss>.yaml) takes per-dataset ranges"
        )
    return space, tables


def _per_dataset(
    table: Any, space: dict[str, ParamSpace], where: str
) -> dict[str, dict[str, ParamSpace | None]]:
    """A ``per_dataset`` table checked: known datasets, parameters of ``space``, valid ranges."""
    from mlrc import data

    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(
            f"{where}: expected a mapping of dataset → parameter ranges, got {type(table).__name__}"
        )
    out: dict[str, dict[str, ParamSpace | None]] = {}
    for ds, params in table.items():
        if ds not in data.available():
            raise ConfigError(
                f"{where}.{ds}: unknown dataset {ds!r}{did_you_mean(ds, data.available())} "
                f"(available: {', '.join(data.available())})"
            )
        out[ds] = _dataset_ranges(params, space, f"{where}.{ds}")
    return out


def _dataset_ranges(
    params: Any, space: dict[str, ParamSpace], where: str
) -> dict[str, ParamSpace | None]:
    """One dataset's entry of a ``per_dataset`` table: parameters of ``space`` → range or None."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(
            f"{where}: expected a mapping of parameter ranges, got {type(params).__name__}"
        )
    out: dict[str, ParamSpace | None] = {}
    for k, v in params.items():
        if k not in space:
            raise ConfigError(
                f"{where}.{k}: not a parameter of this space{did_you_mean(k, space)} "
                f"(parameters: {', '.join(space) or 'none'})"
            )
        out[k] = None if v is None else validate_model(ParamSpace, v, f"{where}.{k}")
    return out


def _with_miner(
    table: Any, space: dict[str, ParamSpace], where: str
) -> dict[str, dict[str, dict[str, ParamSpace | None]]]:
    """A ``with_miner`` table checked: registered miners, each with a ``per_dataset`` table."""
    from mlrc.methods import miners

    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(
            f"{where}: expected a mapping of miner → {{per_dataset: ...}}, "
            f"got {type(table).__name__}"
        )
    out = {}
    for name, entry in table.items():
        if name not in miners.available():
            raise ConfigError(
                f"{where}.{name}: unknown miner {name!r}{did_you_mean(name, miners.available())} "
                f"(available: {', '.join(miners.available())})"
            )
        entry = {} if entry is None else entry
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where}.{name}: expected {{per_dataset: ...}}, got {type(entry).__name__}"
            )
        for k in entry:
            if k != PER_DATASET:
                raise ConfigError(
                    f"{where}.{name}.{k}: unknown key{did_you_mean(k, [PER_DATASET])} "
                    f"(a miner's entry takes {PER_DATASET} only)"
                )
        out[name] = _per_dataset(entry.get(PER_DATASET), space, f"{where}.{name}.{PER_DATASET}")
    return out
