"""Study files and presets: YAML → validated, fully resolved configuration.

A mistake in a study file is one ``ConfigError`` whose message names the file and the key
(``study.yaml: loss.search.margin: low (2.0) > high (1.0)``).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

REPO = Path(__file__).resolve().parents[2]
PRESETS_DIR = REPO / "studies" / "presets"
SPACES_DIR = REPO / "studies" / "spaces"
LOSS_LR = "loss_lr"  # search/param name of the loss optimiser's learning rate


class ConfigError(ValueError):
    """A study, preset or search-space file is wrong; the message says where and what."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- search spaces -----------------------------------------------------------------------------


class ParamSpace(_Strict):
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
        return self


# --- preset ------------------------------------------------------------------------------------


class ImageSpec(_Strict):
    resize: int = Field(gt=0)
    crop: int = Field(gt=0)
    scale: tuple[float, float] = (0.16, 1.0)
    ratio: tuple[float, float] = (0.75, 1.33)
    flip: bool = True


class BatchSpec(_Strict):
    size: int = Field(32, ge=2)
    images_per_class: dict[Literal["pair", "class"], int] = {"pair": 4, "class": 1}


class OptimizerSpec(_Strict):
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)


class LossOptimizerSpec(_Strict):
    lr: ParamSpace
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)


class SearchSpec(_Strict):
    trials: int | None = Field(None, ge=1)
    sampler: Literal["gp", "tpe"] | None = None
    seed: int = 0
    enqueue: list[dict[str, Any]] = []
    # Opt-in pruning (off in the reference preset): after fold k, stop a trial whose running
    # mean of fold MAP@R is below the median of earlier trials' running means after fold k.
    pruner: Literal["none", "median"] | None = None
    prune_startup: int | None = Field(None, ge=0)  # complete trials before any pruning


class TestSpec(_Strict):
    reproductions: int | None = Field(None, ge=2)


class Preset(_Strict):
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


class DatasetRef(_Strict):
    name: str
    root: str | None = None
    params: dict[str, Any] = {}


class LossRef(_Strict):
    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/<name>.yaml


class MinerRef(_Strict):
    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/miners/<name>.yaml


class StrategyRef(_Strict):
    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/strategies/<name>.yaml


class SamplerRef(_Strict):
    name: str = "m_per_class"
    params: dict[str, Any] = {}


class StudyConfig(_Strict):
    """A study file, validated. ``resolved()`` merges it with its preset."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    dataset: DatasetRef
    preset: str = "cpu"
    loss: LossRef
    miner: MinerRef | None = None
    strategy: StrategyRef | None = None
    sampler: SamplerRef = SamplerRef()
    search: SearchSpec = SearchSpec()
    test: TestSpec = TestSpec()
    overrides: dict[str, Any] = {}


class ResolvedStudy(_Strict):
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
        for path, default in _LATER_FIELDS.items():
            *parents, key = path
            node = out
            for p in parents:
                node = node.get(p) or {}
            if key in node and node[key] == default:
                del node[key]
        return out


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


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: {where}malformed YAML ({problem})") from None


def _format_error(source: str, err: ValidationError, model: type[BaseModel]) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        key = str(e["loc"][-1])
        parent = _fields_at(model, e["loc"][:-1])
        close = difflib.get_close_matches(key, parent, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{source}: unknown key {loc!r}{hint}"
    msg = e["msg"].removeprefix("Value error, ")
    return f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    fields = list(model.model_fields)
    return fields + [f.alias for f in model.model_fields.values() if f.alias]


def _validate(model: type[BaseModel], data: Any, source: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_error(source, e, model)) from None


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
                f"{source or 'study'}: unknown preset {name_or_path!r}{hint} "
                f"(available: {', '.join(names)}, or a path to a preset YAML)"
            )
    data = load_yaml(path)
    if overrides:
        data = _deep_merge(data, overrides, f"{source}: overrides" if source else "overrides")
    return _validate(
        Preset, data, str(path) if not overrides else f"{source}: preset {path.name} + overrides"
    )


def _deep_merge(base: dict, over: dict, where: str) -> dict:
    out = dict(base)
    for k, v in over.items():
        if k not in base and k not in Preset.model_fields:
            close = difflib.get_close_matches(k, list(Preset.model_fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown preset field {k!r}{hint}")
        out[k] = (
            _deep_merge(base[k], v, f"{where}.{k}")
            if isinstance(v, dict) and isinstance(base.get(k), dict)
            else v
        )
    return out


def default_space(loss: str, folder: Path = SPACES_DIR) -> dict[str, ParamSpace]:
    path = folder / f"{loss}.yaml"
    if not path.is_file():
        return {}
    data = load_yaml(path) or {}
    return {k: _validate(ParamSpace, v, f"{path}: {k}") for k, v in data.items()}


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
    preset = load_preset(study.preset, study.overrides, source)
    if study.loss.search is not None:
        space = study.loss.search
    else:  # the loss's default space, minus what the study fixes in loss.params
        space = {k: v for k, v in default_space(spec.name).items() if k not in study.loss.params}
    accepted = set(spec.params) | ({LOSS_LR} if spec.has_parameters else set())
    for where, names in (("loss.params", study.loss.params), ("loss.search", space)):
        for k in names:
            if k not in accepted:
                raise ConfigError(
                    f"{source}: {where}.{k}: loss {spec.name!r} takes no parameter {k!r} "
                    f"(it takes: {', '.join(sorted(accepted)) or 'none'})"
                )
    both = set(study.loss.params) & set(space)
    if both:
        raise ConfigError(f"{source}: loss.params and loss.search both set {sorted(both)}")
    if spec.has_parameters and LOSS_LR not in space and LOSS_LR not in study.loss.params:
        space = {**space, LOSS_LR: preset.loss_optimizer.lr}
    fixed = dict(study.loss.params)
    if study.miner is not None:
        m_space, m_fixed = _resolve_miner(study, spec, source)
        space, fixed = {**space, **m_space}, {**fixed, **m_fixed}
    if study.strategy is not None:
        s_space, s_fixed = _resolve_strategy(study, spec, source)
        space, fixed = {**space, **s_space}, {**fixed, **s_fixed}
    _check_sampler(study.sampler, source)
    trials = study.search.trials or preset.search.trials or 1
    if not space and trials > 1:
        raise ConfigError(
            f"{source}: search.trials = {trials} but the search space is empty "
            "(nothing to search: use trials: 1)"
        )
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
                f"parameter {k!r} (it takes: {', '.join(accepted) or 'none'})"
            )


def _takes_tuples(loss: str) -> bool:
    """Whether the loss's forward accepts mined pairs/triplets (PML's ``indices_tuple``)."""
    import inspect

    from mlrc.methods import losses

    probe = losses.build(loss, num_classes=2, embedding_size=2)
    return "indices_tuple" in inspect.signature(probe.forward).parameters


def _plugin_space(kind: str, ref: Any, accepted: dict[str, Any], source: str) -> tuple[dict, dict]:
    """Space and fixed params of a miner/strategy, keys prefixed ``<kind>.``, each name checked.

    Without ``search`` the plug-in's default space (``studies/spaces/{miners,strategies}/``) is
    used, minus what ``params`` fixes."""
    space = ref.search
    if space is None:
        defaults = default_space(ref.name, SPACES_DIR / {"miner": "miners"}.get(kind, "strategies"))
        space = {k: v for k, v in defaults.items() if k not in ref.params}
    for where, names in ((f"{kind}.params", ref.params), (f"{kind}.search", space)):
        for k in names:
            if k not in accepted:
                raise ConfigError(
                    f"{source}: {where}.{k}: {kind} {ref.name!r} takes no parameter {k!r} "
                    f"(it takes: {', '.join(accepted) or 'none'})"
                )
    prefix = f"{kind}."
    return (
        {prefix + k: v for k, v in space.items()},
        {prefix + k: v for k, v in ref.params.items()},
    )


def _resolve_strategy(study: StudyConfig, spec: Any, source: str) -> tuple[dict, dict]:
    """The strategy's space and fixed params (``strategy.<param>``); checks loss and miner."""
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
    return _plugin_space("strategy", ref, accepted, source)


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
    return _plugin_space("miner", ref, accepted, source)


def load_study(path: str | Path) -> ResolvedStudy:
    """Read, validate and resolve a study file. Relative dataset roots: cwd, then the file's dir."""
    path = Path(path)
    study = _validate(StudyConfig, load_yaml(path), str(path))
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
