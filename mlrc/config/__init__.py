"""Study files and presets: YAML → validated, fully resolved configuration.

A mistake in a study file is one ``ConfigError`` whose message names the file and the key
(``study.yaml: loss.search.margin: low (2.0) > high (1.0)``).
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mlrc.errors import first_line
from mlrc.params import ANY, ParamType, Range

REPO = Path(__file__).resolve().parents[2]
PRESETS_DIR = REPO / "studies" / "presets"
SPACES_DIR = REPO / "studies" / "spaces"
LOSS_LR = "loss_lr"  # search/param name of the loss optimiser's learning rate


class ConfigError(ValueError):
    """A study, preset or search-space file is wrong; the message says where and what."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- search spaces -----------------------------------------------------------------------------


class ParamSpace(Strict):
    """``{low, high}`` (uniform float), ``+ log: true``, ``+ int: true`` (+ ``step``), or ``{choices}``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    int_: bool = Field(False, alias="int")
    step: float | None = None
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> ParamSpace:
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low/high, not both")
            if not self.choices:
                raise ValueError("choices is empty")
            bad = [
                c for c in self.choices if not isinstance(c, (bool, int, float, str, type(None)))
            ]
            if bad:  # Optuna's categorical distribution takes these only
                raise ValueError(
                    f"choices must be numbers, strings, booleans or null, not {type(bad[0]).__name__}"
                )
            return self
        if self.low is None or self.high is None:
            raise ValueError("needs low and high (or choices)")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite numbers")
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range must be > 0, got low = {self.low}")
        if self.log and self.step is not None:
            raise ValueError("step cannot be used with log")
        if self.step is not None and not self.step > 0:
            raise ValueError(f"step must be > 0, got {self.step}")
        if self.int_ and not all(
            float(x).is_integer() for x in (self.low, self.high, self.step or 1)
        ):
            raise ValueError("an int range needs whole numbers for low, high and step")
        return self


# --- preset ------------------------------------------------------------------------------------


class ImageSpec(Strict):
    resize: int = Field(gt=0)
    crop: int = Field(gt=0)
    scale: tuple[float, float] = (0.16, 1.0)
    ratio: tuple[float, float] = (0.75, 1.33)
    flip: bool = True


class BatchSpec(Strict):
    size: int = Field(32, ge=2)
    images_per_class: dict[Literal["pair", "class"], int] = {"pair": 4, "class": 1}


class OptimizerSpec(Strict):
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)


class LossOptimizerSpec(Strict):
    lr: ParamSpace
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)


class SearchSpec(Strict):
    trials: int | None = Field(None, ge=1)
    sampler: Literal["gp", "tpe"] | None = None
    seed: int = Field(0, ge=0, le=2**31 - 1)  # Optuna/NumPy and faiss take 31-bit seeds
    enqueue: list[dict[str, Any]] = []
    # Opt-in pruning (off in the reference preset): after fold k, stop a trial whose running
    # mean of fold MAP@R is below the median of earlier trials' running means after fold k.
    pruner: Literal["none", "median"] | None = None
    prune_startup: int | None = Field(None, ge=0)  # complete trials before any pruning


class TestSpec(Strict):
    reproductions: int | None = None

    @field_validator("reproductions")
    @classmethod
    def _enough_for_a_ci(cls, n: int | None) -> int | None:
        if n is not None and n < 2:
            raise ValueError(
                "Input should be greater than or equal to 2 "
                f"(a confidence interval needs at least 2 reproductions; got {n})"
            )
        return n


class Preset(Strict):
    """Every number of the protocol (DESIGN.md §1). Per-dataset keys fall back to ``default``."""

    trunk: str
    pretrained: bool | str = False
    freeze_batchnorm: bool = True
    embedding_size: int = Field(128, gt=0)
    image: ImageSpec
    batch: BatchSpec = BatchSpec()
    optimizer: OptimizerSpec
    loss_optimizer: LossOptimizerSpec
    iterations_per_epoch: int = Field(gt=0)
    max_epochs: int = Field(gt=0)
    validate_every: dict[str, int]
    patience: dict[str, int]
    folds: int = Field(4, ge=2)
    split_scheme: Literal["kfold", "mlrc"] = "mlrc"
    num_workers: int = Field(0, ge=0)
    eval_batch_size: int = Field(32, gt=0)
    # Fast paths (DESIGN: "Performance" in the README). Off unless said otherwise; each falls
    # back to a no-op where the device lacks it (cudnn, pinned memory on CPU).
    amp: Literal["off", "bf16", "fp16"] = "off"  # autocast dtype of forward passes
    channels_last: bool = False  # NHWC memory format for the trunk and its inputs
    cudnn_benchmark: bool = False  # torch.backends.cudnn.benchmark (CUDA only)
    pin_memory: bool = False  # page-locked batches + non_blocking copies (CUDA only)
    persistent_workers: bool = False  # keep DataLoader workers between epochs (num_workers > 0)
    decoded_cache: bool = False  # decoded, resized uint8 images in a memory-mapped file
    search: SearchSpec = SearchSpec(trials=50, sampler="gp")
    test: TestSpec = TestSpec(reproductions=10)

    @model_validator(mode="after")
    def _defaults(self) -> Preset:
        for key in ("validate_every", "patience"):
            if "default" not in getattr(self, key):
                raise ValueError(f"{key} needs a 'default' entry")
        return self

    def per_dataset(self, key: Literal["validate_every", "patience"], dataset: str) -> int:
        table = getattr(self, key)
        return int(table.get(dataset, table["default"]))


# --- study -------------------------------------------------------------------------------------


class DatasetRef(Strict):
    name: str
    root: str | None = None
    params: dict[str, Any] = {}

    @field_validator("root")
    @classmethod
    def _usable_path(cls, root: str | None) -> str | None:
        if root is not None and "\0" in root:
            raise ValueError("a path cannot contain a NUL character")
        try:
            Path(root or ".").expanduser()
        except RuntimeError:  # ~name of an unknown user
            raise ValueError(f"{root}: unknown user in '~'") from None
        return root


class LossRef(Strict):
    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/<name>.yaml


class MinerRef(Strict):
    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/miners/<name>.yaml


class StrategyRef(Strict):
    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/strategies/<name>.yaml


class SamplerRef(Strict):
    name: str = "m_per_class"
    params: dict[str, Any] = {}


class StudyConfig(Strict):
    """A study file, validated. ``resolved()`` merges it with its preset."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    dataset: DatasetRef
    preset: str = "cpu"
    loss: LossRef
    miner: MinerRef | None = None
    strategy: StrategyRef | None = None
    sampler: SamplerRef = SamplerRef()
    search: SearchSpec = SearchSpec()
    test: TestSpec = TestSpec()
    overrides: dict[str, Any] = {}


class ResolvedStudy(Strict):
    """What a run needs: the study, its full preset (with overrides), its search space."""

    study: StudyConfig
    preset: Preset
    space: dict[str, ParamSpace]
    fixed: dict[str, Any]
    trials: int
    sampler: Literal["gp", "tpe"]
    reproductions: int
    pruner: Literal["none", "median"] = "none"
    prune_startup: int = 5
    source: str = ""

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able content that defines the study (used to detect a changed study file).

        Fields added after a store was written are left out while at their default, so a study
        started by an earlier mlrc version still matches its unchanged file."""
        out = self.model_dump(mode="json", exclude={"source"}, by_alias=True)
        for key in RUNTIME_ONLY:  # how fast, not what is computed: may change on resume
            out["preset"].pop(key, None)
        for path, default in _LATER_FIELDS.items():
            *parents, key = path
            node = out
            for p in parents:
                node = node.get(p) or {}
            if key in node and node[key] == default:
                del node[key]
        return out


# Preset fields that change speed, not the numbers (beyond float noise): not part of a study's
# identity, so a study can be resumed with them switched.
RUNTIME_ONLY = ("cudnn_benchmark", "pin_memory", "persistent_workers", "decoded_cache")

# Fields added in mlrc 0.2 (performance and pruning), with the value that means "as before".
_LATER_FIELDS: dict[tuple[str, ...], Any] = {
    **{
        ("preset", k): v
        for k, v in {
            "amp": "off",
            "channels_last": False,
            "cudnn_benchmark": False,
            "pin_memory": False,
            "persistent_workers": False,
            "decoded_cache": False,
        }.items()
    },
    **{
        (part, "search", k): None
        for part in ("study", "preset")
        for k in ("pruner", "prune_startup")
    },
    ("pruner",): "none",
    ("prune_startup",): 5,
}


# --- loading -----------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping (PyYAML keeps the
    last one silently). Keys brought in by a ``<<`` merge may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: SafeLoader says so below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def load_yaml(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        before = raw[: e.start].decode("utf-8")
        line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
        raise ConfigError(
            f"{path}: line {line}, column {column}: not UTF-8 text (byte 0x{raw[e.start]:02x})"
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or first_line(e)
        raise ConfigError(f"{path}: {where}malformed YAML ({problem})") from None


def format_error(source: str, err: ValidationError, model: type[BaseModel]) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        key = str(e["loc"][-1])
        parent = _fields_at(model, e["loc"][:-1])
        close = difflib.get_close_matches(key, parent, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{source}: unknown key {loc!r}{hint}"
    msg = e["msg"].removeprefix("Value error, ")
    msg = re.sub(r" or instance of \w+$", "", msg)  # our class names mean nothing to a user
    if e["loc"][-1:] == ("[key]",):  # a mapping key that is not a string
        *parent, key = e["loc"][:-1]
        loc = ": ".join([".".join(str(p) for p in parent), f"key {key!r}"]).removeprefix(": ")
    return f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names (and aliases) of the model at ``loc`` ([] where there is none)."""
    found = _model_at(model, loc)
    if found is None:
        return []
    return list(found.model_fields) + [f.alias for f in found.model_fields.values() if f.alias]


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model at ``loc``: through fields, list items, dict values and ``X | None``."""
    node: Any = model
    for part in loc:
        node = _unwrap_optional(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            fields = {f.alias or name: f for name, f in node.model_fields.items()}
            field = node.model_fields.get(str(part)) or fields.get(str(part))
            node = field.annotation if field is not None else None
        elif typing.get_origin(node) in (list, dict):
            node = typing.get_args(node)[-1]  # the item or value type
        else:
            return None
    node = _unwrap_optional(node)
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def not_a_mapping(data: Any, source: str) -> str:
    """The message for a file (or value) that should be a mapping of keys but is not."""
    if data is None:
        return f"{source}: empty (expected a mapping of keys)"
    return f"{source}: expected a mapping of keys, got {type(data).__name__}"


def validate_model(model: type[BaseModel], data: Any, source: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(not_a_mapping(data, source))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_error(source, e, model)) from None


def load_preset(
    name_or_path: str, overrides: dict[str, Any] | None = None, source: str = ""
) -> Preset:
    """A preset by name (``studies/presets/<name>.yaml``) or path, with ``overrides`` merged in."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESETS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            names = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
            close = difflib.get_close_matches(name_or_path, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{source or 'study'}: preset: unknown preset {name_or_path!r}{hint} "
                f"(available: {', '.join(names)}, or a path to a preset YAML)"
            )
    elif not path.is_file():
        raise ConfigError(
            f"{source or 'study'}: preset: {name_or_path} is not a file "
            f"(looked for {path.absolute()})"
        )
    data = load_yaml(path)
    if overrides and isinstance(data, dict):
        data = _deep_merge(data, overrides, f"{source}: overrides" if source else "overrides")
    return validate_model(
        Preset, data, str(path) if not overrides else f"{source}: preset {path.name} + overrides"
    )


def _deep_merge(base: dict, over: dict, where: str, loc: tuple = ()) -> dict:
    """``over`` merged into ``base``; a key checked against the preset's fields at ``loc``
    (free-form tables such as ``validate_every`` take any key)."""
    out = dict(base)
    fields = _fields_at(Preset, loc) if _model_at(Preset, loc) is not None else None
    for k, v in over.items():
        if fields is not None and k not in base and k not in fields:
            close = difflib.get_close_matches(str(k), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown preset field {k!r}{hint}")
        out[k] = (
            _deep_merge(base[k], v, f"{where}.{k}", (*loc, k))
            if isinstance(v, dict) and isinstance(base.get(k), dict)
            else v
        )
    return out


# Keys of a loss's space file that are not parameters: the ranges that differ per dataset.
PER_DATASET = "per_dataset"
WITH_MINER = "with_miner"


def _plugin_space_file(kind: str, name: str) -> Any:
    """The search-space file a plug-in ships beside its module (None: it has none)."""
    if kind == "loss":
        from mlrc.methods.losses import LOSSES as registry
    elif kind == "miner":
        from mlrc.methods.miners import MINERS as registry
    elif kind == "strategy":
        from mlrc.methods.strategies import STRATEGIES as registry
    else:
        return None
    return registry.space(name)


def default_space(
    loss: str,
    folder: Path = SPACES_DIR,
    dataset: str | None = None,
    miner: str | None = None,
    kind: str = "loss",
) -> dict[str, ParamSpace]:
    """The space file ``<folder>/<loss>.yaml``; when there is none, the one the plug-in ``loss``
    (of ``kind``: loss, miner or strategy) ships itself (see :mod:`mlrc.registry`); {} when
    neither exists.

    A loss's space file may also give ranges that differ per dataset (the reality check searched
    some parameters over other ranges on some datasets):

    - ``per_dataset: {<dataset>: {<param>: <range> | null}}`` — on that dataset the parameter's
      range is replaced by this one (a whole range, not merged), or with ``null`` not searched;
    - ``with_miner: {<miner>: {per_dataset: ...}}`` — the table used *instead of* the one above
      when the study mines with ``<miner>`` (MLRC searched "MS + miner" with its own ranges).

    Without ``dataset`` the base ranges are returned; the tables are checked either way (an
    unknown dataset, miner or parameter is a ConfigError naming the file and the key)."""
    path = folder / f"{loss}.yaml"
    loss_space = folder.resolve() == SPACES_DIR.resolve()  # a loss's file takes per-dataset tables
    if not path.is_file():
        path = _plugin_space_file(kind, loss)
        if path is None:
            return {}
        loss_space = kind == "loss"
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(not_a_mapping(data, str(path)))
    tables = {k: data.pop(k) for k in (PER_DATASET, WITH_MINER) if k in data}
    space = {k: validate_model(ParamSpace, v, f"{path}: {k}") for k, v in data.items()}
    if tables and not loss_space:
        raise ConfigError(
            f"{path}: {next(iter(tables))}: only a loss's space file "
            "(studies/spaces/<loss>.yaml) takes per-dataset ranges"
        )
    table = _per_dataset(tables.get(PER_DATASET), space, f"{path}: {PER_DATASET}")
    by_miner = _with_miner(tables.get(WITH_MINER), space, f"{path}: {WITH_MINER}")
    if miner is not None and miner in by_miner:
        table = by_miner[miner]
    out = {**space, **table.get(dataset, {})} if dataset is not None else space
    return {k: v for k, v in out.items() if v is not None}


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
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ConfigError(
                f"{where}.{ds}: expected a mapping of parameter ranges, got {type(params).__name__}"
            )
        out[ds] = {}
        for k, v in params.items():
            if k not in space:
                raise ConfigError(
                    f"{where}.{ds}.{k}: not a parameter of this space{did_you_mean(k, space)} "
                    f"(parameters: {', '.join(space) or 'none'})"
                )
            out[ds][k] = None if v is None else validate_model(ParamSpace, v, f"{where}.{ds}.{k}")
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


def resolve(study: StudyConfig, source: str = "study") -> ResolvedStudy:
    """Merge study and preset; check the loss, its parameters and the dataset root."""
    from mlrc import data
    from mlrc.methods import losses
    from mlrc.registry import RegistryError

    try:
        spec = losses.info(study.loss.name)
    except RegistryError as e:
        raise ConfigError(f"{source}: loss.name: {e}") from None
    if study.dataset.name not in data.available():
        close = difflib.get_close_matches(study.dataset.name, data.available(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{source}: dataset.name: unknown dataset {study.dataset.name!r}{hint} "
            f"(available: {', '.join(data.available())})"
        )
    _check_dataset_params(study.dataset, source)
    preset = load_preset(study.preset, study.overrides, source)
    if study.loss.search is not None:
        space = study.loss.search
    else:  # the loss's default space (for this dataset and miner), minus loss.params
        defaults = default_space(
            spec.name,
            dataset=study.dataset.name,
            miner=study.miner.name if study.miner is not None else None,
        )
        space = {k: v for k, v in defaults.items() if k not in study.loss.params}
    accepted = set(spec.params) | ({LOSS_LR} if spec.has_parameters else set())
    for where, names in (("loss.params", study.loss.params), ("loss.search", space)):
        for k in names:
            if k not in accepted:
                raise ConfigError(
                    f"{source}: {where}.{k}: loss {spec.name!r} takes no parameter {k!r}"
                    f"{did_you_mean(k, accepted)} "
                    f"(it takes: {', '.join(sorted(accepted)) or 'none'})"
                )
    both = set(study.loss.params) & set(space)
    if both:
        raise ConfigError(f"{source}: loss.params and loss.search both set {sorted(both)}")
    loss_types = {**spec.types, LOSS_LR: LOSS_LR_TYPE}
    _check_values("loss.params", study.loss.params, loss_types, source)
    _check_space("loss.search", space, loss_types, source)
    if spec.has_parameters and LOSS_LR not in space and LOSS_LR not in study.loss.params:
        space = {**space, LOSS_LR: preset.loss_optimizer.lr}
    fixed = dict(study.loss.params)
    if study.miner is not None:
        m_space, m_fixed = _resolve_miner(study, spec, source)
        space, fixed = {**space, **m_space}, {**fixed, **m_fixed}
    if study.strategy is not None:
        s_space, s_fixed = _resolve_strategy(study, spec, source, preset)
        space, fixed = {**space, **s_space}, {**fixed, **s_fixed}
    _check_sampler(study.sampler, source)
    trials = study.search.trials or preset.search.trials or 1
    if not space and trials > 1:
        raise ConfigError(
            f"{source}: search.trials = {trials} but the search space is empty "
            "(nothing to search: use trials: 1)"
        )
    _check_enqueue(study.search.enqueue, space, source, _param_types(study, loss_types))
    return ResolvedStudy(
        study=study,
        preset=preset,
        space=space,
        fixed=fixed,
        trials=trials,
        sampler=study.search.sampler or preset.search.sampler or "gp",
        reproductions=study.test.reproductions or preset.test.reproductions or 2,
        pruner=study.search.pruner or preset.search.pruner or "none",
        prune_startup=_first_set(study.search.prune_startup, preset.search.prune_startup, 5),
        source=source,
    )


def _check_dataset_params(ref: DatasetRef, source: str) -> None:
    """Each ``dataset.params`` key against the dataset's keyword arguments (a dataset whose
    factory takes ``**kwargs`` is checked when it is built)."""
    import inspect

    from mlrc import data

    params = inspect.signature(data.DATASETS.get(ref.name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [k for k in params if k != "root"]
    for k in ref.params:
        if k not in accepted:
            raise ConfigError(
                f"{source}: dataset.params.{k}: dataset {ref.name!r} takes no parameter {k!r}"
                f"{did_you_mean(k, accepted)} "
                f"(it takes: {', '.join(accepted) or 'none'})"
            )


def _check_enqueue(
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


def did_you_mean(name: str, options: Any) -> str:
    """``"; did you mean 'x'?"`` for the option closest to ``name``, or ""."""
    close = difflib.get_close_matches(str(name), [str(o) for o in options], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _first_set(*values: int | None) -> int:
    return next(v for v in values if v is not None)


def _check_sampler(ref: SamplerRef, source: str) -> None:
    from mlrc.methods import samplers
    from mlrc.registry import RegistryError

    try:
        accepted = samplers.params(ref.name)
    except RegistryError as e:
        raise ConfigError(f"{source}: sampler.name: {e}") from None
    for k in ref.params:
        if k not in accepted:
            raise ConfigError(
                f"{source}: sampler.params.{k}: sampler {ref.name!r} takes no "
                f"parameter {k!r}{did_you_mean(k, accepted)} "
                f"(it takes: {', '.join(accepted) or 'none'})"
            )


def _takes_tuples(loss: str) -> bool:
    """Whether the loss's forward accepts mined pairs/triplets (PML's ``indices_tuple``)."""
    import inspect

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

    Without ``search`` the plug-in's default space (``studies/spaces/{miners,strategies}/``) is
    used, minus what ``params`` fixes."""
    space = ref.search
    if space is None:
        folder = SPACES_DIR / {"miner": "miners"}.get(kind, "strategies")
        defaults = default_space(ref.name, folder, kind=kind)
        space = {k: v for k, v in defaults.items() if k not in ref.params}
    for where, names in ((f"{kind}.params", ref.params), (f"{kind}.search", space)):
        for k in names:
            if k not in accepted:
                raise ConfigError(
                    f"{source}: {where}.{k}: {kind} {ref.name!r} takes no parameter {k!r}"
                    f"{did_you_mean(k, accepted)} "
                    f"(it takes: {', '.join(accepted) or 'none'})"
                )
    _check_values(f"{kind}.params", ref.params, types or {}, source)
    _check_space(f"{kind}.search", space, types or {}, source)
    prefix = f"{kind}."
    return (
        {prefix + k: v for k, v in space.items()},
        {prefix + k: v for k, v in ref.params.items()},
    )


def _resolve_strategy(
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
    if strategy.losses is not None and spec.name not in strategy.losses:
        raise ConfigError(
            f"{source}: strategy: {ref.name!r} works with the losses "
            f"{', '.join(sorted(strategy.losses))}; not {spec.name!r}"
        )
    if not strategy.uses_miner:
        if study.miner is not None:
            raise ConfigError(f"{source}: strategy {ref.name!r} mines its own tuples: remove miner")
        if not _takes_tuples(spec.name):
            raise ConfigError(
                f"{source}: strategy: {ref.name!r} needs a tuple loss; "
                f"loss {spec.name!r} takes no tuples"
            )
    if strategy.positive_pairs and preset is not None:
        m = preset.batch.images_per_class.get(spec.batch)
        if m is not None and m < 2 and study.sampler.name not in _SAMPLERS_WITH_A_POSITIVE_PAIR:
            raise ConfigError(
                f"{source}: strategy.name: {ref.name!r} needs batches with positive pairs "
                f"({strategy.positive_pairs}); loss {spec.name!r} is trained on "
                f"{preset.batch.size // max(m, 1)} classes × {m} image per batch "
                f"(batch.images_per_class.{spec.batch} = {m})"
            )
    return _plugin_space("strategy", ref, accepted, source, strategies.param_types(ref.name))


# Samplers that ignore ``m`` and put at least one positive pair in every batch (SPC-R).
_SAMPLERS_WITH_A_POSITIVE_PAIR = frozenset({"spc_random"})


def _resolve_miner(study: StudyConfig, spec: Any, source: str) -> tuple[dict, dict]:
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


# --- parameter types (declared by each plug-in, mlrc.params) ----------------------------

LOSS_LR_TYPE = ParamType("number", range=Range(gt=0))  # the loss optimiser's learning rate


def _param_types(study: StudyConfig, loss_types: dict[str, ParamType]) -> dict[str, ParamType]:
    """Declared types of every parameter of the study, named as in its search space."""
    from mlrc.methods import miners, strategies

    out = dict(loss_types)
    for ref, module in ((study.miner, miners), (study.strategy, strategies)):
        if ref is not None:
            out.update({module.PREFIX + k: t for k, t in module.param_types(ref.name).items()})
    return out


def _check_values(
    where: str, values: dict[str, Any], types: dict[str, ParamType], source: str
) -> None:
    """Each fixed value against its parameter's declared type and range."""
    for k, v in values.items():
        problem = types.get(k, ANY).problem(v)
        if problem:
            raise ConfigError(f"{source}: {where}.{k}: {problem}")


def _check_space(
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


def load_study(path: str | Path) -> ResolvedStudy:
    """Read, validate and resolve a study file. Relative dataset roots: cwd, then the file's dir."""
    path = Path(path)
    study = validate_model(StudyConfig, load_yaml(path), str(path))
    root = study.dataset.root
    if root is not None:
        candidates = [Path(root).expanduser(), path.parent / root]
        found = next((c for c in candidates if c.exists()), None)
        if found is None:
            raise ConfigError(
                f"{path}: dataset.root: {root} does not exist "
                f"(looked in {candidates[0].resolve()} and {candidates[1].resolve()})"
            )
        study.dataset.root = str(found.resolve())
    return resolve(study, str(path))
