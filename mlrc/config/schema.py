"""The schema of study and preset files: pydantic models, every key checked, none unknown.

A study file (:class:`StudyConfig`) names a dataset, a preset, a loss and optionally a miner,
a strategy and a sampler; a preset (:class:`Preset`) holds every number of the protocol. Search
ranges are :class:`ParamSpace` entries.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

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
    """Image preprocessing: resize, then a random resized crop (``scale``, ``ratio``) and flip.
    ``resize``/``crop`` may be left out for a ``timm:`` trunk: its own input size is used."""

    resize: int | None = Field(None, gt=0)
    crop: int | None = Field(None, gt=0)
    scale: tuple[float, float] = (0.16, 1.0)
    ratio: tuple[float, float] = (0.75, 1.33)
    flip: bool = True


class BatchSpec(Strict):
    """Batch size, and images per class in a batch by the loss's batch kind (pair or class)."""

    size: int = Field(32, ge=2)
    images_per_class: dict[Literal["pair", "class"], int] = {"pair": 4, "class": 1}


OPTIMIZERS = ("rmsprop", "adam", "adamw")


def _no_adam_momentum(name: str, momentum: float) -> None:
    if name != "rmsprop" and momentum:
        label = {"adam": "Adam", "adamw": "AdamW"}[name]
        raise ValueError(f"momentum is an RMSprop setting; {label} takes none (remove it)")


class OptimizerSpec(Strict):
    """The trunk and embedder optimiser (fixed, not searched): RMSprop (the reference's), Adam
    (L2 weight decay added to the gradient, as the DAS code) or AdamW (decoupled weight decay);
    torch's defaults but ``lr`` and ``weight_decay``. Adam and AdamW take no ``momentum``."""

    name: Literal["rmsprop", "adam", "adamw"] = "rmsprop"
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _momentum_is_rmsprop(self) -> OptimizerSpec:
        _no_adam_momentum(self.name, self.momentum)
        return self


class ScheduleSpec(Strict):
    """A learning-rate schedule of both optimisers, in epochs, stepped after every epoch:
    ``{step_size: N, gamma: g}`` (lr × g every N epochs, torch's StepLR) or
    ``{milestones: [e1, e2, ...], gamma: g}`` (lr × g after epochs e1, e2, …, MultiStepLR)."""

    step_size: int | None = Field(None, ge=1)
    milestones: list[int] | None = None
    gamma: float = Field(gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> ScheduleSpec:
        if (self.step_size is None) == (self.milestones is None):
            raise ValueError("give either step_size or milestones")
        if self.milestones is not None:
            if not self.milestones:
                raise ValueError("milestones is empty (give the epochs after which lr × gamma)")
            if any(e < 1 for e in self.milestones):
                raise ValueError("milestones must be epochs >= 1")
            if sorted(set(self.milestones)) != self.milestones:
                raise ValueError("milestones must be increasing")
        return self


class PretrainedSpec(Strict):
    """``pretrained: {file: path, sha256: hex}`` or ``{url: ..., sha256: hex}`` (timm trunks):
    a weights file checked by its SHA-256 (or a prefix of at least 8 hex digits)."""

    file: str | None = None
    url: str | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{8,64}$")

    @model_validator(mode="after")
    def _one_source(self) -> PretrainedSpec:
        if (self.file is None) == (self.url is None):
            raise ValueError("give either file or url")
        if self.url is not None and self.sha256 is None:
            raise ValueError("a url needs its sha256")
        return self


class NormalizeSpec(Strict):
    """Per-channel ``mean``/``std`` replacing the trunk's own, in its pixel range and order."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @field_validator("std")
    @classmethod
    def _positive(cls, std: tuple[float, float, float]) -> tuple[float, float, float]:
        if min(std) <= 0:
            raise ValueError("std must be > 0")
        return std


class LossOptimizerSpec(Strict):
    """The optimiser of a loss with parameters; its learning rate is searched (``loss_lr``)."""

    name: Literal["rmsprop", "adam", "adamw"] = "rmsprop"
    lr: ParamSpace
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _momentum_is_rmsprop(self) -> LossOptimizerSpec:
        _no_adam_momentum(self.name, self.momentum)
        return self


class StopSpec(Strict):
    """``search.stop``: end a fold whose trial cannot plausibly beat the incumbent
    (:mod:`mlrc.protocol.stopping`); the trial is then pruned. ``quantile`` of the later gains
    seen in the study's complete folds (1: the largest), ``slack``: how far (MAP@R, a fraction)
    a fold not yet started may beat the incumbent's (``future: incumbent``) or the best value
    any trial reached on it (``future: best``), ``fold_slack``: how far the fold that trains
    may end above its best so far plus the later gain, ``startup``: complete trials before any
    stop."""

    # the defaults: the cheapest rule that kept the full protocol's choice in every study of the
    # committed corpus at the protocol's 50 trials (bench/pruning.py tune; performance.md)
    rule: Literal["gain"] = "gain"
    quantile: float = Field(1.0, gt=0, le=1)
    slack: float = Field(0.01, ge=0, le=1)
    fold_slack: float = Field(0.04, ge=0, le=1)
    startup: int = Field(1, ge=1)
    # a fold not started may reach the incumbent's value on it, or the best any trial reached
    future: Literal["incumbent", "best"] = "best"


class WarmStartSpec(Strict):
    """``search.warm_start``: the ``top`` best configurations of a finished study are tried
    first — ``study: NAME`` (a study of the same store) or ``file: EXPORT.yaml`` (what ``mlrc
    study export`` writes: its best trial only). Same loss and search space; mapped and checked
    when the study opens (:mod:`mlrc.search.warm_start`). Not the reference's search."""

    study: str | None = Field(None, min_length=1)
    file: str | None = Field(None, min_length=1)
    top: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _one_source(self) -> WarmStartSpec:
        if (self.study is None) == (self.file is None):
            raise ValueError("give either study or file")
        return self


class SearchSpec(Strict):
    """The hyperparameter search: trials, sampler, seed, enqueued trials, warm start and opt-in
    pruning."""

    trials: int | None = Field(None, ge=1)
    sampler: Literal["gp", "tpe", "ax"] | None = None  # ax: the ax extra (mlrc.search.ax_sampler)
    seed: int = Field(0, ge=0, le=2**31 - 1)  # Optuna/NumPy and faiss take 31-bit seeds
    enqueue: list[dict[str, Any]] = []
    # the best configurations of a finished study, tried after ``enqueue`` (a study file's only)
    warm_start: WarmStartSpec | None = None
    # Opt-in pruning (off in the reference preset), between folds: ``median`` stops a trial
    # whose running mean of fold MAP@R after fold k is below the median of the complete trials'
    # (after ``prune_startup`` of them); ``wilcoxon`` stops one whose fold values are worse than
    # the best trial's by a one-sided Wilcoxon signed-rank test at p < ``prune_p``;
    # ``sequential`` stops one whose paired fold differences from the best trial's fall below
    # Kim & Nelson's region for an indifference zone ``prune_delta`` and error ``prune_alpha``;
    # ``forgiving`` stops one whose mean fold value is below the best trial's worst fold.
    pruner: Literal["none", "median", "wilcoxon", "sequential", "forgiving"] | None = None
    prune_startup: int | None = Field(None, ge=0)  # complete trials before any pruning
    prune_p: float | None = Field(None, gt=0, le=1)  # wilcoxon's p-threshold
    prune_delta: float | None = Field(None, gt=0, le=1)  # sequential's δ (MAP@R, a fraction)
    prune_alpha: float | None = Field(None, gt=0, lt=0.5)  # sequential's α per trial
    # Opt-in, inside a fold: stop it when the trial cannot plausibly beat the incumbent
    stop: StopSpec | None = None


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
    pretrained: bool | str | PretrainedSpec = False
    freeze_batchnorm: bool = True
    freeze_layernorm: bool = False  # LayerNorm weights not trained (ViT, ConvNeXt trunks)
    embedding_size: int = Field(128, gt=0)
    image: ImageSpec
    normalize: NormalizeSpec | None = None  # None: the trunk's own mean/std
    batch: BatchSpec = BatchSpec()
    optimizer: OptimizerSpec
    loss_optimizer: LossOptimizerSpec
    iterations_per_epoch: int = Field(gt=0)
    max_epochs: int = Field(gt=0)
    validate_every: dict[str, int]
    patience: dict[str, int]
    folds: int = Field(4, ge=1)
    # "traditional": the seed papers' own tables — no folds (folds: 1): train on every
    # train+val class, validate on the TEST classes, i.e. the epoch is chosen on the test set
    split_scheme: Literal["kfold", "mlrc", "traditional"] = "mlrc"
    # the validation metric that picks the best epoch and that a search maximises;
    # precision_at_1 is Recall@1 (the traditional papers' choice)
    selection_metric: Literal["map_at_r", "precision_at_1"] = "map_at_r"
    lr_schedule: ScheduleSpec | None = None
    warmup_epochs: int = Field(0, ge=0)  # epochs 1..k train the embedder and loss, trunk frozen
    num_workers: int = Field(0, ge=0)
    eval_batch_size: int = Field(32, gt=0)
    # Fast paths (DESIGN: "Performance" in the README). Off unless said otherwise; each falls
    # back to a no-op where the device lacks it (cudnn, pinned memory on CPU).
    amp: Literal["off", "bf16", "fp16"] = "off"  # autocast dtype of forward passes
    channels_last: bool = False  # NHWC memory format for the trunk and its inputs
    cudnn_benchmark: bool = False  # torch.backends.cudnn.benchmark (CUDA only)
    pin_memory: bool = False  # page-locked batches + non_blocking copies (CUDA only)
    persistent_workers: bool = False  # keep DataLoader workers between epochs (num_workers > 0)
    decoded_cache: bool = False  # decoded, resized uint8 images (and evaluation crops) on disk
    # minutes between two ``last.pt`` writes at most (also written at every validation epoch)
    checkpoint_minutes: float = Field(10.0, gt=0)
    # one fold as K processes of torch.distributed (one GPU each; gloo on the CPU): the global
    # batch ``batch.size`` is split between them, so K changes where the batch is computed,
    # not the study (mlrc.train.launch; ``--procs-per-trial`` overrides it)
    processes_per_trial: int = Field(1, ge=1)
    # Numerics (part of a study's protocol). tf32: TF32 tensor-core maths in cuDNN convolutions
    # and CUDA matmuls (None: torch's defaults, i.e. convolutions TF32, matmuls full fp32);
    # deterministic: cuDNN deterministic algorithms, benchmark off, CUBLAS_WORKSPACE_CONFIG.
    tf32: bool | None = None
    deterministic: bool = False
    # random crop, resize and flip of training images on the training device (numbers change by
    # interpolation noise; for hosts with few CPU cores per GPU)
    augment_on_device: bool = False
    search: SearchSpec = SearchSpec(trials=50, sampler="gp")
    test: TestSpec = TestSpec(reproductions=10)

    @field_validator("selection_metric", mode="before")
    @classmethod
    def _recall_at_1_is_p_at_1(cls, value: Any) -> Any:
        if value == "recall_at_1":
            raise ValueError("use precision_at_1 (P@1 is Recall@1)")
        return value

    @field_validator("pretrained", mode="before")
    @classmethod
    def _pretrained_mapping(cls, value: Any) -> Any:
        """A mapping is a :class:`PretrainedSpec`; its first problem as one plain message."""
        if not isinstance(value, dict):
            return value
        try:
            return PretrainedSpec.model_validate(value)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            raise ValueError(f"{where}: {msg}" if where else msg) from None

    @model_validator(mode="after")
    def _defaults(self) -> Preset:
        for key in ("validate_every", "patience"):
            if "default" not in getattr(self, key):
                raise ValueError(f"{key} needs a 'default' entry")
        if self.search.warm_start is not None:
            raise ValueError("search.warm_start: a preset takes none (give it in the study file)")
        if self.split_scheme == "traditional" and self.folds != 1:
            raise ValueError(
                f"folds: the traditional split_scheme has exactly one fold (folds: 1), got "
                f"{self.folds}"
            )
        if self.split_scheme != "traditional" and self.folds < 2:
            raise ValueError(
                f"folds: split_scheme {self.split_scheme!r} needs at least 2 folds, got "
                f"{self.folds} (one fold is split_scheme: traditional)"
            )
        timm_name = self.trunk.removeprefix("timm:") if self.trunk.startswith("timm:") else None
        if timm_name is None:
            if self.image.resize is None or self.image.crop is None:
                raise ValueError(
                    f"image: resize and crop are required for trunk {self.trunk!r} "
                    "(only timm: trunks bring an input size of their own)"
                )
            if isinstance(self.pretrained, PretrainedSpec):
                raise ValueError(
                    f"pretrained: {{file|url, sha256}} is for timm: trunks; trunk {self.trunk!r} "
                    "takes true, false or a path"
                )
        else:
            from mlrc.models.timm_trunks import timm_defaults  # noqa: PLC0415 - imports timm

            try:  # checks the name too, with suggestions
                own = timm_defaults(timm_name)
            except KeyError as e:  # RegistryError: an unknown model or pretrained tag
                raise ValueError(f"trunk: {e}") from None
            self.image = self.image.model_copy(
                update={
                    "crop": self.image.crop or own["crop"],
                    "resize": self.image.resize or own["resize"],
                }
            )
            if own["fixed"] and self.image.crop != own["crop"]:
                raise ValueError(
                    f"image: crop: timm model {timm_name!r} takes {own['crop']} px inputs only "
                    f"(got {self.image.crop}; leave crop out to use the model's)"
                )
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
    search: dict[str, ParamSpace] | None = None  # None → studies/spaces/losses/<name>.yaml


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


KEEP_POLICIES = ("resume", "best", "all")


class ArtifactsSpec(Strict):
    """``artifacts:`` of a study: which fold checkpoints stay on disk once their results are
    stored. ``resume`` (default): the ``best.pt`` of one reproduction's folds (the one ``mlrc
    study export-model`` exports) — a fold holds ``last.pt`` while it runs; ``best``: the
    ``best.pt`` of every test reproduction and of the best trial's folds; ``all``: every
    ``best.pt`` and ``last.pt``. Not part of the study's identity (the numbers do not depend
    on it). ``embeddings``: the dtype of each test reproduction's stored test embeddings
    (``<study>/p-<key>/embeddings/test-rep<N>.npz``, read by ``mlrc study rescore``): ``float16``
    (default, half the disk) or ``float32`` (bit for bit what was scored)."""

    keep: Literal["resume", "best", "all"] | None = None
    embeddings: Literal["float16", "float32"] = "float16"


class TrackingSpec(Strict):
    """``tracking:`` of a study or campaign: where its trials and test reproductions are also
    logged (``mlflow``: a tracking URI, ``wandb``: a project; see mlrc.search.tracking). Not
    part of the study's identity."""

    mlflow: str | None = Field(None, min_length=1)
    wandb: str | None = Field(None, min_length=1)


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
    artifacts: ArtifactsSpec = ArtifactsSpec()
    tracking: TrackingSpec | None = None  # experiment tracking; not in the fingerprint
    overrides: dict[str, Any] = {}
    # "predefined" (the dataset's own train/test lists), a split file, relative to the study
    # file's folder, or the file's content inline (mlrc.config.splits); None: MLRC's split. Its
    # content, resolved, is part of the study's identity (ResolvedStudy.split), not this path.
    split: str | dict[str, Any] | None = None
