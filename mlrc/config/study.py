"""A study file resolved: merged with its preset, every name and value checked, its search space
complete. :func:`load_study` reads a file; :func:`resolve` does the rest, in named steps."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from mlrc.config.checks import (
    LOSS_LR_TYPE,
    check_dataset_params,
    check_enqueue,
    check_names,
    check_root,
    check_sampler,
    check_space,
    check_values,
    param_types,
)
from mlrc.config.identity import BUDGETS, drop_speed_and_later_defaults
from mlrc.config.load import ConfigError, did_you_mean, load_yaml, validate_model
from mlrc.config.plugins import resolve_miner, resolve_strategy
from mlrc.config.presets import load_preset
from mlrc.config.ranks import check_ranks
from mlrc.config.schema import (
    KEEP_POLICIES,
    LOSS_LR,
    DatasetRef,
    ParamSpace,
    Preset,
    StopSpec,
    Strict,
    StudyConfig,
)
from mlrc.config.spaces import default_space
from mlrc.config.splits import ResolvedSplit, resolve_split
from mlrc.params import ParamType


class ResolvedStudy(Strict):
    """What a run needs: the study, its full preset (with overrides), its search space."""

    study: StudyConfig
    preset: Preset
    space: dict[str, ParamSpace]
    fixed: dict[str, Any]
    trials: int
    sampler: Literal["gp", "tpe", "ax"]
    reproductions: int
    pruner: Literal["none", "median", "wilcoxon", "sequential", "forgiving"] = "none"
    prune_startup: int = 5
    prune_p: float = 0.3  # wilcoxon: with 4 folds no test reaches p < 0.125 (3 worse of 3)
    prune_delta: float = 0.04  # sequential: the indifference zone δ (MAP@R, a fraction)
    prune_alpha: float = 0.05  # sequential: the error α of one trial's test
    stop: StopSpec | None = None  # in-fold stopping (search.stop), None: off
    keep: Literal["resume", "best", "all"] = "resume"  # checkpoint retention (artifacts.keep)
    split: ResolvedSplit | None = None  # the study's ``split:`` read and checked; None: MLRC's
    source: str = ""
    # what the command line gave (``--trials``, ``--reproductions``, ``--keep``), by the field
    # it sets (:data:`SETTINGS`): the study's from then on (see :func:`with_changes`)
    given: dict[str, Any] = {}

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able content that defines the study (used to detect a changed study file), with
        its budgets (compare two with :func:`identity`, which leaves those out).

        Fields added after a store was written are left out while at their default, so a study
        started by an earlier mlrc version still matches its unchanged file; checkpoint
        retention is left out always (it does not change a number)."""
        out = self.model_dump(mode="json", exclude={"source", "keep", "given"}, by_alias=True)
        out["study"].pop("artifacts", None)
        out["study"].pop("tracking", None)  # where runs are logged, not what they compute
        out["study"].pop("split", None)  # where the split file is; its content is out["split"]
        drop_speed_and_later_defaults(out)
        return out


def copy_budgets(
    target: dict[str, Any], source: dict[str, Any], fields: Iterable[str]
) -> dict[str, Any]:
    """``target`` (a fingerprint) with the budgets ``fields`` as in ``source``."""
    out = copy.deepcopy(target)
    for field in fields:
        for *parents, key in BUDGETS[field]:
            src, dst = source, out
            for p in parents:
                src, dst = src.get(p) or {}, dst.setdefault(p, {})
            if key in src:
                dst[key] = src[key]
            else:
                dst.pop(key, None)
    return out


def budgets(fingerprint: dict[str, Any]) -> dict[str, int | None]:
    """``{"search.trials": N, "test.reproductions": M}``: the resolved budgets of a fingerprint."""
    return {field: fingerprint.get(paths[0][0]) for field, paths in BUDGETS.items()}


# What a study's file or command line may change without changing its numbers: the budgets
# (:data:`BUDGETS`) and the checkpoint retention.
SETTINGS = (*BUDGETS, "artifacts.keep")


def file_settings(resolved: ResolvedStudy) -> dict[str, Any]:
    """The budgets and retention the study's file (with its preset) gives, whatever the command
    line gave (:func:`with_changes` leaves ``resolved.study`` as the file has it)."""
    study, preset = resolved.study, resolved.preset
    return {
        "search.trials": study.search.trials or preset.search.trials or 1,
        "test.reproductions": study.test.reproductions or preset.test.reproductions or 2,
        "artifacts.keep": study.artifacts.keep or "resume",
    }


def with_changes(
    resolved: ResolvedStudy,
    *,
    trials: int | None = None,
    reproductions: int | None = None,
    keep: str | None = None,
) -> ResolvedStudy:
    """``resolved`` with the budgets or the retention given on the command line (``--trials``,
    ``--reproductions``, ``--keep``; None: as in the file), checked as the file's would be. They
    are noted in ``given`` (a stored study records them as its settings from then on); the
    study part keeps the file's values (:func:`file_settings`)."""
    src = f"{resolved.source or 'study'}"
    if trials is not None and trials < 1:
        raise ConfigError(f"--trials: must be ≥ 1 (got {trials})")
    if trials is not None and trials > 1 and not resolved.space:
        raise ConfigError(
            f"{src}: --trials {trials} but the search space is empty (nothing to search)"
        )
    if reproductions is not None and reproductions < 2:
        raise ConfigError(
            f"--reproductions: must be ≥ 2 (a confidence interval needs 2; got {reproductions})"
        )
    if keep is not None and keep not in KEEP_POLICIES:
        raise ConfigError(f"--keep: expected one of {', '.join(KEEP_POLICIES)} (got {keep!r})")
    given = dict(resolved.given)
    update: dict[str, Any] = {}
    if trials is not None:
        given["search.trials"] = update["trials"] = trials
    if reproductions is not None:
        given["test.reproductions"] = update["reproductions"] = reproductions
    if keep is not None:
        given["artifacts.keep"] = update["keep"] = keep
    return resolved.model_copy(update={**update, "given": given})


def with_settings(resolved: ResolvedStudy, settings: dict[str, Any]) -> ResolvedStudy:
    """``resolved`` working to a stored study's settings (``{"search.trials": N,
    "test.reproductions": M, "artifacts.keep": P}``; a field left out: as it is)."""
    names = {"search.trials": "trials", "test.reproductions": "reproductions"}
    names["artifacts.keep"] = "keep"
    update = {names[f]: v for f, v in settings.items() if f in names and v is not None}
    return resolved.model_copy(update=update)


def load_study(path: str | Path) -> ResolvedStudy:
    """Read, validate and resolve a study file. Relative dataset roots: cwd, then the file's dir."""
    path = Path(path)
    study = validate_model(StudyConfig, load_yaml(path), str(path))
    if study.dataset.name in data_names():  # an unknown name: resolve() says so
        check_root(study.dataset.name, study.dataset.root, f"{path}: dataset.root")
    root = study.dataset.root
    if root is not None:
        candidates = [Path(root).expanduser(), path.parent / root]
        found = next((c for c in candidates if c.exists()), None)
        if found is None:
            looked = " and ".join(dict.fromkeys(str(c.resolve()) for c in candidates))
            raise ConfigError(f"{path}: dataset.root: {root} does not exist (looked in {looked})")
        study.dataset.root = str(found.resolve())
    return resolve(study, str(path), base=path.parent)


def data_names() -> list[str]:
    """The registered datasets."""
    from mlrc import data

    return data.available()


def resolve(study: StudyConfig, source: str = "study", base: Path | None = None) -> ResolvedStudy:
    """Merge study and preset; check the loss, its parameters, the dataset root and the split
    (a split file's path is relative to ``base``, the study file's folder; default: cwd)."""
    spec = _loss_info(study.loss.name, source)
    _check_dataset(study.dataset, source)
    preset = load_preset(study.preset, study.overrides, source)
    split = resolve_split(
        study.split, study.dataset.name, preset.folds, preset.split_scheme, f"{source}: split", base
    )
    space, fixed = _loss_space(study, spec, preset, source)
    if study.miner is not None:
        space, fixed = _merge(space, fixed, *resolve_miner(study, spec, source))
    if study.strategy is not None:
        space, fixed = _merge(space, fixed, *resolve_strategy(study, spec, source, preset))
    check_sampler(study.sampler, source)
    trials = _trials(study, preset, space, source)
    check_enqueue(study.search.enqueue, space, source, param_types(study, _loss_types(spec)))
    resolved = ResolvedStudy(
        study=study,
        preset=preset,
        space=space,
        fixed=fixed,
        trials=trials,
        sampler=study.search.sampler or preset.search.sampler or "gp",
        reproductions=study.test.reproductions or preset.test.reproductions or 2,
        pruner=study.search.pruner or preset.search.pruner or "none",
        prune_startup=_first_set(study.search.prune_startup, preset.search.prune_startup, 5),
        prune_p=_first_set(study.search.prune_p, preset.search.prune_p, 0.3),
        prune_delta=_first_set(study.search.prune_delta, preset.search.prune_delta, 0.04),
        prune_alpha=_first_set(study.search.prune_alpha, preset.search.prune_alpha, 0.05),
        stop=study.search.stop or preset.search.stop,
        keep=study.artifacts.keep or "resume",
        split=split,
        source=source,
    )
    check_ranks(resolved, preset.processes_per_trial, f"{source}: processes_per_trial")
    return resolved


def _loss_info(name: str, source: str) -> Any:
    """The registered loss ``name`` (its :class:`~mlrc.methods.losses.LossInfo`)."""
    from mlrc.methods import losses
    from mlrc.registry import RegistryError

    try:
        return losses.info(name)
    except RegistryError as e:
        raise ConfigError(f"{source}: loss.name: {e}") from None


def _check_dataset(ref: DatasetRef, source: str) -> None:
    """The dataset is registered and takes the parameters given."""
    from mlrc import data

    if ref.name not in data.available():
        raise ConfigError(
            f"{source}: dataset.name: unknown dataset {ref.name!r}"
            f"{did_you_mean(ref.name, data.available())} "
            f"(available: {', '.join(data.available())})"
        )
    check_dataset_params(ref, source)


def _loss_types(spec: Any) -> dict[str, ParamType]:
    """Declared types of the loss's parameters and of its optimiser's learning rate."""
    return {**spec.types, LOSS_LR: LOSS_LR_TYPE}


def _loss_space(
    study: StudyConfig, spec: Any, preset: Preset, source: str
) -> tuple[dict[str, ParamSpace], dict[str, Any]]:
    """The loss's search space and fixed parameters, each name and value checked; the loss
    optimiser's learning rate is searched over the preset's range unless the study sets it."""
    space = study.loss.search
    if space is None:  # the loss's default space (for this dataset and miner), minus loss.params
        defaults = default_space(
            spec.name,
            dataset=study.dataset.name,
            miner=study.miner.name if study.miner is not None else None,
        )
        space = {k: v for k, v in defaults.items() if k not in study.loss.params}
    accepted = sorted(set(spec.params) | ({LOSS_LR} if spec.has_parameters else set()))
    given = (("loss.params", study.loss.params), ("loss.search", space))
    check_names("loss", spec.name, given, accepted, source)
    both = set(study.loss.params) & set(space)
    if both:
        raise ConfigError(f"{source}: loss.params and loss.search both set {sorted(both)}")
    check_values("loss.params", study.loss.params, _loss_types(spec), source)
    check_space("loss.search", space, _loss_types(spec), source)
    if spec.has_parameters and LOSS_LR not in space and LOSS_LR not in study.loss.params:
        space = {**space, LOSS_LR: preset.loss_optimizer.lr}
    return space, dict(study.loss.params)


def _merge(space: dict, fixed: dict, more_space: dict, more_fixed: dict) -> tuple[dict, dict]:
    """The study's space and fixed parameters with a miner's or strategy's added."""
    return {**space, **more_space}, {**fixed, **more_fixed}


def _trials(study: StudyConfig, preset: Preset, space: dict[str, ParamSpace], source: str) -> int:
    """The number of trials (study, else preset, else 1); more than one needs a space."""
    trials = study.search.trials or preset.search.trials or 1
    if not space and trials > 1:
        raise ConfigError(
            f"{source}: search.trials = {trials} but the search space is empty "
            "(nothing to search: use trials: 1)"
        )
    return trials


def _first_set(*values: int | None) -> int:
    return next(v for v in values if v is not None)
