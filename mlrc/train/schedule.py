"""Per-epoch training schedule of a fold: the learning-rate schedule (``lr_schedule``) and the
frozen-trunk warm-up (``warmup_epochs``) of the traditional papers.

Both are functions of the epoch alone, set at the start of every epoch, so a resumed fold
continues with exactly the rates and frozen parameters it had: nothing to checkpoint."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mlrc.config import Preset, ScheduleSpec


def lr_factor(schedule: ScheduleSpec | None, epoch: int) -> float:
    """The factor on the initial learning rate during ``epoch`` (1-based), as torch's StepLR /
    MultiStepLR stepped once after every epoch: epoch e has seen e − 1 steps, so the rate is
    γ^⌊(e−1)/step_size⌋, or γ^|{milestones m : m ≤ e − 1}|."""
    if schedule is None:
        return 1.0
    steps = epoch - 1
    if schedule.step_size is not None:
        return schedule.gamma ** (steps // schedule.step_size)
    return schedule.gamma ** sum(1 for m in schedule.milestones or () if m <= steps)


def set_learning_rates(optimizers: Iterable[torch.optim.Optimizer | None], factor: float) -> None:
    """Every parameter group's rate = its initial rate × ``factor`` (``initial_lr``, the key
    torch's schedulers use, is recorded on first use and travels with the optimiser's state)."""
    for opt in optimizers:
        if opt is None:
            continue
        for group in opt.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * factor


def warm_up(trunk_params: list[torch.nn.Parameter], preset: Preset, epoch: int) -> None:
    """Freeze the trunk (its trainable parameters ``trunk_params``) during epochs
    1..``warmup_epochs`` — only the embedder and the loss's parameters train, as Proxy Anchor's
    ``--warm`` — and train it again after."""
    if preset.warmup_epochs == 0:
        return
    trainable = epoch > preset.warmup_epochs
    for p in trunk_params:
        p.requires_grad_(trainable)
