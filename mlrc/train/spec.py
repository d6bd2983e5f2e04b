"""What a fold is: its job (:class:`FoldSpec`) and what training it gives back
(:class:`EpochRecord` per validation, :class:`FoldResult` at the end)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrc.config import Preset
from mlrc.data.base import ImageDataset
from mlrc.protocol.stopping import FoldStop


@dataclass
class FoldSpec:
    """One fold's training job. Classes are dataset label ids; metrics are fractions."""

    dataset: ImageDataset
    dataset_name: str
    train_classes: Sequence[int]
    val_classes: Sequence[int]
    loss: str
    loss_params: dict[str, Any]
    loss_lr: float | None
    preset: Preset
    seed: int
    workdir: Path
    device: str = "cpu"
    miner: str | None = None
    miner_params: dict[str, Any] = field(default_factory=dict)
    strategy: str | None = None
    strategy_params: dict[str, Any] = field(default_factory=dict)
    sampler: str = "m_per_class"
    sampler_params: dict[str, Any] = field(default_factory=dict)
    desc: str = "fold"
    progress: bool = True
    identity: dict[str, Any] = field(default_factory=dict)  # what defines its numbers
    code_version: str | None = None
    # in-fold stopping (search.stop): asked after each validation that does not end the fold
    stop: FoldStop | None = None


@dataclass
class EpochRecord:
    """One validation: the mean training loss of the epoch (``None`` at epoch 0) and the
    validation metrics (fractions)."""

    epoch: int  # 0 = before training (a candidate for best, not for the objective)
    train_loss: float | None
    map_at_r: float
    precision_at_1: float
    r_precision: float


NONFINITE = "non-finite"  # failure reasons of a loss or embeddings gone NaN/inf start with it


@dataclass
class FoldResult:
    """``best``: validation metrics (fractions) of ``best_epoch``, the epoch ``best.pt`` holds
    (may be 0); ``objective``: the best validation value of the preset's ``selection_metric``
    (MAP@R unless said otherwise) over trained epochs (≥ 1), the value the search sees.
    ``device``/``code_version``/``provenance``: of the run that computed the result
    (``provenance``: :func:`mlrc.train.numerics.provenance`, the device's name, CUDA/cuDNN/driver
    versions and TF32/deterministic settings; None for results recorded before it existed)."""

    status: str  # complete | failed | stopped (by spec.stop: its best so far, for pruning only)
    reason: str | None
    best_epoch: int | None
    best: dict[str, float] | None
    history: list[EpochRecord] = field(default_factory=list)
    checkpoint: str | None = None
    wall_time_s: float = 0.0
    objective: float | None = None
    device: str | None = None
    code_version: str | None = None
    provenance: dict[str, Any] | None = None

    @property
    def nonfinite(self) -> bool:
        """Failed because the loss or the embeddings went NaN/inf (the reference scores 0)."""
        return self.status == "failed" and (self.reason or "").startswith(NONFINITE)


def trained_best(history: Sequence[EpochRecord], metric: str = "map_at_r") -> float | None:
    """Best validation ``metric`` (the preset's ``selection_metric``; MAP@R in the reality
    check) over trained epochs (≥ 1): the reference aggregator's value."""
    trained = [getattr(h, metric) for h in history if h.epoch >= 1]
    return max(trained) if trained else None
