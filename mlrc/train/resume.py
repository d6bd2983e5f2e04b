"""What a fold finds in its folder when it starts (:func:`resume_or_adopt`) and how a run picks up
after the last finished epoch of ``last.pt`` (:func:`restore`); see :mod:`mlrc.train.loop`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from mlrc.train.checkpoint import adopted, load_checkpoint, plain, resume_state, set_aside
from mlrc.train.distributed import barrier, broadcast_object, rank_and_world
from mlrc.train.spec import EpochRecord, FoldResult, FoldSpec

if TYPE_CHECKING:
    from mlrc.train.loop import FoldRun

__all__ = ["restore", "resume_or_adopt"]


def resume_or_adopt(spec: FoldSpec) -> dict[str, Any] | FoldResult | None:
    """What ``spec.workdir`` holds for this fold: the finished result to adopt, the ``last.pt``
    state to resume from, or ``None`` (train from the start). A folder computed under another
    identity is set aside first (:func:`~mlrc.train.checkpoint.set_aside`). Under K ranks,
    rank 0 decides (and repairs ``best.pt``, sets a folder aside) and the others then read the
    ``last.pt`` it left, before anyone writes again."""
    state = None
    if rank_and_world()[0] == 0:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        state = resume_state(spec.workdir / "last.pt", spec.workdir / "best.pt")
        if state is not None and state.get("identity", {}) != plain(spec.identity):
            set_aside(spec.workdir, state.get("identity", {}), plain(spec.identity))
            spec.workdir.mkdir(parents=True, exist_ok=True)
            state = None
    resumed = broadcast_object(state is not None)  # rank 0's answer, on every rank
    if rank_and_world()[0] != 0 and resumed:
        state = load_checkpoint(spec.workdir / "last.pt")
    barrier()  # every rank has read last.pt: rank 0 may write again
    if state is not None and state.get("result") is not None:
        return adopted(state)
    return state


def restore(run: FoldRun, state: dict[str, Any]) -> None:
    """Continue after the last finished epoch of ``state`` (``last.pt``): weights, optimisers,
    sampler, strategy, AMP scaler and torch RNG as they were, with the history and best so far."""
    parts = run.parts
    parts.model.load_state_dict(state["model"])
    parts.loss_fn.load_state_dict(state["loss"])
    parts.opt.load_state_dict(state["opt"])
    if parts.loss_opt is not None:
        parts.loss_opt.load_state_dict(state["loss_opt"])
    parts.sampler.set_state(state["sampler"])
    if state.get("strategy") is not None:
        parts.strategy.load_state_dict(state["strategy"])
    if state.get("scaler"):  # fp16 only; empty when the scaler is disabled
        parts.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["torch_rng"])
    run.history = [EpochRecord(**h) for h in state["history"]]
    run.best_epoch, run.best = state["best_epoch"], state["best"]
    run.start_epoch = state["epoch"] + 1
    run.t0 -= state["wall_time_s"]
