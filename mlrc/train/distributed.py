"""The building blocks of one fold trained as K processes of ``torch.distributed``.

The pieces a K-process fold is made of (the launcher, the trainer loop and the store use them;
this module starts no process and builds no process group: it works in the default group that
``torch.distributed.run`` / Ray Train / Slurm set up, and is a no-op outside one):

- :class:`DistributedBatchSampler`: every rank draws the same global batch from its own copy of
  the study's batch sampler (same seed, same state) and keeps its contiguous slice;
- :func:`gather_embeddings`: the global batch's embeddings and labels on every rank, the local
  slice still carrying autograd;
- :func:`average_gradients`: the loss's own parameters (proxies) reduced like the model's;
- :func:`sync_batchnorm`: BatchNorm that trains sees the statistics of the global batch.

Conventions.

- **Rank order.** K ranks, rank r holds positions ``[r·B/K, (r+1)·B/K)`` of the global batch of
  B items; every gathered tensor is the concatenation of the ranks' slices in rank order, so it
  is the global batch in the order one process would have it. Every rank has the same local
  batch size B/K (the sampler enforces it; :func:`gather_embeddings` relies on it).
- **Embeddings** are rows, ``(B/K, d)`` locally and ``(B, d)`` gathered; whether a loss reads
  them as distances or similarities is the loss's business — gathering changes neither.
- **The gradient convention** (what makes K processes train as one process on the global
  batch). Every rank computes the same loss L over the gathered batch. Rank r's backward reaches
  its model only through its own slice E_r (the other slices are constants there), so it
  yields ∂L/∂E_r · ∂E_r/∂θ; the sum over ranks is the full ∂L/∂θ, and DDP's all-reduce takes
  the *mean*, i.e. that sum divided by K. :func:`gather_embeddings` therefore multiplies the
  gradient flowing back into the local slice by K (``grad_scale`` = world size): after
  DDP's mean, every rank holds exactly one process's ∂L/∂θ. Scaling the gradient at the gather
  rather than the loss (PML's ``DistributedLossWrapper`` returns ``loss · K``) keeps the loss
  value one process's (for the logs, the non-finite checks, the schedulers) and leaves the
  loss's own parameters alone: a proxy gets the full ∂L/∂P directly on every rank, the same on
  all of them, so the mean over ranks (:func:`average_gradients`, or the loss module in DDP) is
  one process's ∂L/∂P too. Multiplying by K is exact in floating point when K is a power of 2.
- **BatchNorm.** Frozen BatchNorm (:func:`mlrc.models.freezing.freeze_batchnorm`: eval mode,
  running statistics) needs nothing. BatchNorm in training mode normalises with the global
  batch's mean and (biased) variance and updates its running statistics with the global
  unbiased variance, as one process's BatchNorm on the whole batch; its backward all-reduces
  the statistics' gradients, so the rank gradients sum to the full gradient as above.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from mlrc.methods.samplers import BatchSampler

__all__ = [
    "DistributedBatchSampler",
    "GatheredModel",
    "SyncedBatchNorm1d",
    "SyncedBatchNorm2d",
    "SyncedBatchNorm3d",
    "all_gather_cat",
    "average_gradients",
    "barrier",
    "broadcast_object",
    "gather_embeddings",
    "gather_rows",
    "global_batch_size",
    "is_distributed",
    "rank_and_world",
    "rank_stream",
    "shard",
    "sync_batchnorm",
    "synced",
]


def is_distributed() -> bool:
    """Whether a default process group of more than one process is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device(t: Tensor) -> torch.device:
    """Where ``t`` must be for the default group's collectives (NCCL: the current GPU)."""
    if dist.get_backend() == "nccl" and t.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient multiplied by ``scale`` on the way back."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks whose backward sums the gradients over ranks too (each rank's upstream
    gradient of the sum is the gradient of its share of the global objective)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out


def all_gather_cat(t: Tensor) -> Tensor:
    """``t`` of every rank (same shape on all), concatenated along dim 0 in rank order, on
    ``t``'s device, without autograd; ``t`` itself outside a multi-process group."""
    if not is_distributed():
        return t
    src = t.detach().to(collective_device(t)).contiguous()
    parts = [torch.empty_like(src) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, src)
    return torch.cat(parts).to(t.device)


def gather_embeddings(
    emb: Tensor, labels: Tensor, *, grad_scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """The global batch's embeddings ``(B, d)`` and labels ``(B,)`` on every rank, in rank order.

    ``emb`` ``(B/K, d)`` and ``labels`` ``(B/K,)`` are this rank's slice (the same size on every
    rank). The other ranks' embeddings arrive without autograd; this rank's slice is ``emb``
    itself, its gradient multiplied by ``grad_scale`` (default: the world size K, the module's
    gradient convention) on the way back. Labels are gathered without gradient, returned on
    ``emb``'s device. Outside a process group of more than one process: ``(emb, labels)``.
    """
    if not is_distributed():
        return emb, labels
    rank, world = rank_and_world()
    parts = list(all_gather_cat(emb).chunk(world))
    parts[rank] = _ScaleGrad.apply(emb, float(world if grad_scale is None else grad_scale))
    return torch.cat(parts), all_gather_cat(labels.to(emb.device))


def average_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """Replace each gradient of ``parameters`` by its mean over ranks (one all-reduce), for
    parameters outside DDP: the loss's own (proxies), after ``backward`` and before the step.

    Under the gradient convention every rank already holds the same full gradient (the same
    loss over the same gathered batch), so the mean is that gradient; it keeps the ranks in
    lock step should a kernel's non-determinism make them differ in the last bits. Parameters
    without a gradient are skipped (the same ones on every rank). No-op outside a group.
    """
    if not is_distributed():
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    device = flat.device
    flat = flat.to(collective_device(flat))
    dist.all_reduce(flat)
    flat = (flat / dist.get_world_size()).to(device)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def barrier() -> None:
    """Wait for every rank (no-op outside a multi-process group)."""
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; for small things: a validation record, a
    decision); ``obj`` itself outside a multi-process group."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shard(n: int) -> range:
    """This rank's contiguous share of ``n`` items (rank order; the first ``n mod K`` ranks
    hold one more): what each rank embeds of a validation or bank set."""
    rank, world = rank_and_world()
    per, extra = divmod(n, world)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (rank < extra))


def gather_rows(t: Tensor) -> Tensor:
    """Every rank's rows of ``t`` (row counts may differ, as :func:`shard` gives them),
    concatenated in rank order on ``t``'s device, without autograd; ``t`` outside a group."""
    if not is_distributed():
        return t
    rows = all_gather_cat(torch.tensor([t.shape[0]], device=t.device)).tolist()
    padded = t.new_zeros((max(rows), *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = all_gather_cat(padded).chunk(len(rows))
    return torch.cat([p[:n] for p, n in zip(parts, rows, strict=True)])


def rank_stream(batches: Iterable, seed: int, epoch: int) -> Iterator:
    """``batches`` loaded with torch's global CPU random stream swapped for one of this rank's,
    seeded from (``seed``, rank, ``epoch``): the random crops and flips of a transform in this
    process, or the base seed of the loader's workers, differ between ranks (with one stream
    shared, rank r's k-th image would get rank 0's k-th crop), while the global stream — which
    the strategies draw from and which must stay the same on every rank — is left as it was
    between batches. Each epoch's stream is derived anew, so a fold resumed at an epoch
    boundary loads what it would have. ``batches`` itself outside a multi-process group."""
    if not is_distributed():
        yield from batches
        return
    words = np.random.SeedSequence([seed, rank_and_world()[0], epoch]).generate_state(2)
    state = torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1])).get_state()
    it = None
    while True:
        outer = torch.get_rng_state()
        torch.set_rng_state(state)
        try:
            it = iter(batches) if it is None else it
            item = next(it)
        except StopIteration:
            return
        finally:
            state = torch.get_rng_state()
            torch.set_rng_state(outer)
        yield item


class GatheredModel(nn.Module):
    """``model`` whose output is the global batch's embeddings (:func:`gather_embeddings`): what a
    strategy is given under K ranks, so that its loss, miner and tuples see the whole batch
    while each rank runs its own images through the trunk. ``trunk`` and ``embedder`` are
    ``model``'s (a strategy may read them)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def trunk(self) -> nn.Module:
        return self.model.trunk

    @property
    def embedder(self) -> nn.Module:
        return self.model.embedder

    def forward(self, x: Tensor) -> Tensor:
        emb = self.model(x)
        return gather_embeddings(emb, torch.empty(emb.shape[0], device=emb.device))[0]


class DistributedBatchSampler(BatchSampler):
    """This rank's contiguous slice ``[rank·B/K, (rank+1)·B/K)`` of ``sampler``'s global batches.

    Every rank wraps its own copy of the same sampler (same name, labels, batch size, seed), so
    all ranks draw the same global batch t and together hold exactly it, in rank order.
    ``state()``/``set_state()`` are the wrapped sampler's (the same on every rank; a checkpoint
    of rank 0 resumes every rank). A global batch not divisible by K is a ``ValueError``.
    Memory-bank samplers: ``set_bank`` takes the whole training set's embeddings (the same on
    every rank); ``update`` takes this rank's rows and gathers the global batch's before passing
    them on, so every rank's bank stays the same.
    """

    def __init__(self, sampler: BatchSampler, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of the {world_size} ranks")
        self.sampler, self.rank, self.world_size = sampler, rank, world_size
        self.labels, self.iterations = sampler.labels, sampler.iterations
        size = global_batch_size(sampler)
        if size is not None:
            self.check(size)

    @property
    def needs_bank(self) -> bool:  # type: ignore[override]
        return self.sampler.needs_bank

    @property
    def rng(self) -> np.random.Generator:  # type: ignore[override]
        return self.sampler.rng

    def check(self, size: int) -> None:
        """One line (``ValueError``) when a global batch of ``size`` does not split into K."""
        if size % self.world_size:
            raise ValueError(
                f"global batch size {size} is not divisible by the {self.world_size} processes"
            )

    def next_batch(self) -> list[int]:
        batch = self.sampler.next_batch()
        self.check(len(batch))
        per_rank = len(batch) // self.world_size
        return batch[self.rank * per_rank : (self.rank + 1) * per_rank]

    def state(self) -> dict:
        return self.sampler.state()

    def set_state(self, state: dict) -> None:
        self.sampler.set_state(state)

    def set_bank(self, embeddings: Tensor | np.ndarray) -> None:
        self.sampler.set_bank(embeddings)

    def update(self, indices: Tensor | np.ndarray, embeddings: Tensor | np.ndarray) -> None:
        idx = torch.as_tensor(indices)
        self.sampler.update(all_gather_cat(idx), all_gather_cat(torch.as_tensor(embeddings)))


def global_batch_size(sampler: BatchSampler) -> int | None:
    """The size of ``sampler``'s batches where it is fixed and known before drawing."""
    if hasattr(sampler, "classes_per_batch") and hasattr(sampler, "m"):
        return sampler.classes_per_batch * sampler.m
    size = getattr(sampler, "batch_size", None)
    return size if isinstance(size, int) else None


class _SyncedBatchNorm:
    """Training-mode forward of a BatchNorm over the global batch (mixed into ``BatchNormNd``).

    The per-channel sum (with the element count) and then the sum of squared deviations from
    the global mean are all-reduced (two passes: the variance is as accurate as one process's);
    the backward all-reduces their gradients. Eval mode, or outside a multi-process group: the
    plain BatchNorm. Works with any backend (gloo on CPU, where ``nn.SyncBatchNorm`` does not).
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and is_distributed()):
            return super().forward(x)  # type: ignore[misc]
        self._check_input_dim(x)
        dims = [0, *range(2, x.dim())]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        count = x.new_full((1,), x.numel() // x.size(1))
        sums = _AllReduceSum.apply(torch.cat([x.sum(dims), count]))
        n = sums[-1].detach()
        mean = sums[:-1] / n
        xc = x - mean.view(shape)
        var = _AllReduceSum.apply((xc * xc).sum(dims)) / n
        y = xc * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self.update_running(mean.detach(), var.detach(), n)
        return y

    @torch.no_grad()
    def update_running(self, mean: Tensor, var: Tensor, n: Tensor) -> None:
        """Running statistics as ``F.batch_norm`` updates them (unbiased variance)."""
        self.num_batches_tracked.add_(1)
        factor = self.momentum
        if factor is None:  # cumulative moving average
            factor = 1.0 / float(self.num_batches_tracked)
        unbiased = var * n / (n - 1).clamp(min=1)
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


class SyncedBatchNorm1d(_SyncedBatchNorm, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` whose training statistics are the global batch's."""


class SyncedBatchNorm2d(_SyncedBatchNorm, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose training statistics are the global batch's."""


class SyncedBatchNorm3d(_SyncedBatchNorm, nn.BatchNorm3d):
    """``nn.BatchNorm3d`` whose training statistics are the global batch's."""


_SYNCED = {
    nn.BatchNorm1d: SyncedBatchNorm1d,
    nn.BatchNorm2d: SyncedBatchNorm2d,
    nn.BatchNorm3d: SyncedBatchNorm3d,
}


def synced(bn: nn.Module) -> nn.Module:
    """``bn`` as a BatchNorm over the global batch, sharing its parameters and buffers: on CPU
    an mlrc ``SyncedBatchNormNd`` (``nn.SyncBatchNorm`` refuses CPU tensors, and DDP refuses
    it in a CPU model); elsewhere ``nn.SyncBatchNorm.convert_sync_batchnorm``."""
    on_cpu = all(t.device.type == "cpu" for t in [*bn.parameters(), *bn.buffers()])
    cls = next((c for base, c in _SYNCED.items() if isinstance(bn, base)), None)
    if not on_cpu or cls is None:
        return nn.SyncBatchNorm.convert_sync_batchnorm(bn)
    out = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
    for name, p in bn.named_parameters(recurse=False):
        setattr(out, name, p)
    for name, b in bn.named_buffers(recurse=False):
        setattr(out, name, b)
    out.train(bn.training)
    return out


def sync_batchnorm(model: nn.Module) -> nn.Module:
    """``model`` with every BatchNorm in training mode made to use the global batch's
    statistics (see :func:`synced`), in place; returns ``model`` (or the replacement when
    ``model`` is itself one). BatchNorm in eval mode — frozen by
    :func:`mlrc.models.freezing.freeze_batchnorm` — is left as it is, so call this after
    ``model.train()`` and the freezing, and after moving the model to its device. Parameters
    and buffers are shared with the originals (optimisers and checkpoints are unaffected:
    the state-dict keys do not change)."""
    if isinstance(model, _SyncedBatchNorm | nn.SyncBatchNorm):
        return model
    if isinstance(model, nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d):
        return synced(model) if model.training else model
    for name, child in model.named_children():
        setattr(model, name, sync_batchnorm(child))
    return model
