"""The schema of study and preset files: pydantic models, every key checked, none unknown.

A study file (:class:`StudyConfig`) names a dataset, a preset, a loss and optionally a miner,
a strategy and a sampler; a preset (:class:`Preset`) holds every number of the protocol. Search
ranges are :class:`ParamSpace` entries.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LOSS_LR = "loss_lr"  # search/param name of the loss optimiser's learning rate


class Strict(BaseModel):
    """A model that refuses unknown keys (a typo is an error, not a silent default)."""

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
    """Image preprocessing: resize, then a random resized crop (``scale``, ``ratio``) and flip."""

    resize: int = Field(gt=0)
    crop: int = Field(gt=0)
    scale: tuple[float, float] = (0.16, 1.0)
    ratio: tuple[float, float] = (0.75, 1.33)
    flip: bool = True


class BatchSpec(Strict):
    """Batch size, and images per class in a batch by the loss's batch kind (pair or class)."""

    size: int = Field(32, ge=2)
    images_per_class: dict[Literal["pair", "class"], int] = {"pair": 4, "class": 1}


class OptimizerSpec(Strict):
    """The trunk and embedder optimiser (fixed, not searched)."""

    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)


class LossOptimizerSpec(Strict):
    """The optimiser of a loss with parameters; its learning rate is searched (``loss_lr``)."""

    lr: ParamSpace
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)


class SearchSpec(Strict):
    """The hyperparameter search: trials, sampler, seed, enqueued trials and opt-in pruning."""

    trials: int | None = Field(None, ge=1)
    sampler: Literal["gp", "tpe"] | None = None
    seed: int = Field(0, ge=0, le=2**31 - 1)  # Optuna/NumPy and faiss take 31-bit seeds
    enqueue: list[dict[str, Any]] = []
    # Opt-in pruning (off in the reference preset): after fold k, stop a trial whose running
    # mean of fold MAP@R is below the median of earlier trials' running means after fold k.
    pruner: Literal["none", "median"] | None = None
    prune_startup: int | None = Field(None, ge=0)  # complete trials before any pruning


class TestSpec(Strict):
    """The test stage: how many reproductions of the best trial."""

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
    """``dataset:`` of a study: a registered dataset, its root folder and its parameters."""

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
    """``loss:`` of a study: a registered loss, fixed parameters and (optionally) its space."""

    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/<name>.yaml


class MinerRef(Strict):
    """``miner:`` of a study: a registered miner, fixed parameters and (optionally) its space."""

    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/miners/<name>.yaml


class StrategyRef(Strict):
    """``strategy:`` of a study: a registered training strategy, its parameters and space."""

    name: str
    params: dict[str, Any] = {}
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/strategies/<name>.yaml


class SamplerRef(Strict):
    """``sampler:`` of a study: how batches are drawn (m images per class by default)."""

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
