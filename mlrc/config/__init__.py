"""Study files and presets: YAML → validated, fully resolved configuration.

A mistake in a study file is one ``ConfigError`` whose message names the file and the key
(``study.yaml: loss.search.margin: low (2.0) > high (1.0)``).

The modules behind this interface:

- :mod:`mlrc.config.schema`: the pydantic models of study and preset files;
- :mod:`mlrc.config.load`: YAML loading, package-data folders, one-line error messages;
- :mod:`mlrc.config.presets`: presets by name (package data) or path, with overrides;
- :mod:`mlrc.config.spaces`: default search spaces, with their per-dataset tables;
- :mod:`mlrc.config.checks`: parameters checked against each plug-in's declared types;
- :mod:`mlrc.config.plugins`: a study's miner and strategy;
- :mod:`mlrc.config.study`: :func:`load_study` and :func:`resolve` → :class:`ResolvedStudy`.
"""

from mlrc.config.checks import LOSS_LR_TYPE
from mlrc.config.identity import (
    BUDGETS,
    RUNTIME_ONLY,
    canonical_json,
    first_difference,
    identity,
    identity_change,
)
from mlrc.config.load import (
    ConfigError,
    did_you_mean,
    format_error,
    load_yaml,
    not_a_mapping,
    resource_dir,
    validate_model,
)
from mlrc.config.presets import PRESETS_DIR, load_preset
from mlrc.config.schema import (
    KEEP_POLICIES,
    LOSS_LR,
    ArtifactsSpec,
    BatchSpec,
    DatasetRef,
    ImageSpec,
    LossOptimizerSpec,
    LossRef,
    MinerRef,
    OptimizerSpec,
    ParamSpace,
    Preset,
    SamplerRef,
    ScheduleSpec,
    SearchSpec,
    StrategyRef,
    Strict,
    StudyConfig,
    TestSpec,
)
from mlrc.config.spaces import (
    LOSS_SPACES_DIR,
    PER_DATASET,
    WITH_MINER,
    default_space,
    space_folder,
)
from mlrc.config.study import (
    SETTINGS,
    ResolvedStudy,
    budgets,
    copy_budgets,
    file_settings,
    load_study,
    resolve,
    with_changes,
    with_settings,
)

__all__ = [
    "BUDGETS",
    "KEEP_POLICIES",
    "LOSS_LR",
    "LOSS_LR_TYPE",
    "LOSS_SPACES_DIR",
    "PER_DATASET",
    "PRESETS_DIR",
    "RUNTIME_ONLY",
    "SETTINGS",
    "WITH_MINER",
    "ArtifactsSpec",
    "BatchSpec",
    "ConfigError",
    "DatasetRef",
    "ImageSpec",
    "LossOptimizerSpec",
    "LossRef",
    "MinerRef",
    "OptimizerSpec",
    "ScheduleSpec",
    "ParamSpace",
    "Preset",
    "ResolvedStudy",
    "SamplerRef",
    "SearchSpec",
    "StrategyRef",
    "Strict",
    "StudyConfig",
    "TestSpec",
    "budgets",
    "copy_budgets",
    "default_space",
    "did_you_mean",
    "file_settings",
    "format_error",
    "canonical_json",
    "first_difference",
    "identity",
    "identity_change",
    "load_preset",
    "load_study",
    "load_yaml",
    "not_a_mapping",
    "resolve",
    "resource_dir",
    "space_folder",
    "validate_model",
    "with_changes",
    "with_settings",
]
