"""Everything a fold trains with, built from its :class:`~mlrc.train.spec.FoldSpec`: model,
loss, miner, strategy, optimisers, AMP scaler, sampler and data loaders.

The build order is part of the numbers: after ``torch.manual_seed(spec.seed)`` the model, then
the loss, then the strategy draw their initial weights from the torch RNG, in that order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset
from torchvision import transforms as T

from mlrc.config import Preset
from mlrc.data.base import ImageDataset
from mlrc.data.cache import (
    CachedImageDataset,
    decoded_cache,
    default_cache_dir,
    eval_crops,
)
from mlrc.data.estimate import resized_long_edges
from mlrc.data.transforms import (
    ArrayToUint8Input,
    DeviceCropTransform,
    cached_train_transform,
    eval_transform,
    train_transform,
)
from mlrc.methods import losses, miners, samplers, strategies
from mlrc.models.freezing import freeze_batchnorm
from mlrc.train.distributed import (
    DistributedBatchSampler,
    is_distributed,
    rank_and_world,
    shard,
    sync_batchnorm,
)
from mlrc.train.embed import IndexedView, View
from mlrc.train.loaders import CheckedLoader, FoldLoader, ignore_stop_signals
from mlrc.train.model import Model, build_model
from mlrc.train.numerics import apply_numerics, bind_device
from mlrc.train.spec import FoldSpec


def loader_options(preset: Preset, device: str) -> dict[str, Any]:
    """DataLoader fast paths of the preset: pinned memory only when copying to a CUDA device,
    persistent workers only with worker processes (both are no-ops otherwise)."""
    cuda = torch.device(device).type == "cuda"
    return {
        "num_workers": preset.num_workers,
        "pin_memory": preset.pin_memory and cuda,
        "persistent_workers": preset.persistent_workers and preset.num_workers > 0,
    }


@dataclass
class FoldParts:
    """What one fold trains with. ``loss_opt`` exists only for a loss with parameters;
    ``dataset`` is what the validation view reads (the spec's dataset, or its evaluation crops
    with the preset's ``decoded_cache``: see :func:`fold_inputs`)."""

    model: Model
    loss_fn: torch.nn.Module
    opt: torch.optim.Optimizer
    loss_opt: torch.optim.Optimizer | None
    miner: Any
    strategy: Any
    scaler: torch.amp.GradScaler
    sampler: Any
    dataset: ImageDataset
    val_set: View
    train_loader: FoldLoader | DataLoader
    val_loader: FoldLoader | DataLoader


def build_fold(spec: FoldSpec) -> FoldParts:
    """Seed the torch RNG with ``spec.seed`` and build the fold's parts (see the module
    docstring for the order). Raises ``ValueError`` for a loss with parameters but no
    ``loss_lr``."""
    p = spec.preset
    bind_device(spec.device)  # before any CUDA work: no stray context on GPU 0
    apply_numerics(p, spec.device)  # tf32, deterministic, cudnn.benchmark
    torch.manual_seed(spec.seed)
    model = build_model(p).to(spec.device).fast_paths(p.amp, p.channels_last)
    scaler = torch.amp.GradScaler(torch.device(spec.device).type, enabled=p.amp == "fp16")
    info = losses.info(spec.loss)
    loss_fn = losses.build(
        spec.loss,
        num_classes=len(spec.train_classes),
        embedding_size=p.embedding_size,
        **spec.loss_params,
    ).to(spec.device)
    o = p.optimizer
    opt = make_optimizer(o.name, model.parameters(), o.lr, o.weight_decay, o.momentum)
    miner = miners.build(spec.miner, **spec.miner_params) if spec.miner else None
    strategy = strategies.build(spec.strategy, **spec.strategy_params).to(spec.device)
    loss_opt = _loss_optimizer(spec, loss_fn, info.loss_weight_decay)
    dataset, train_set, val_set = fold_inputs(
        p, spec.dataset, spec.train_classes, spec.val_classes, model.trunk.input_spec, spec.progress
    )
    sampler = samplers.build(
        spec.sampler,
        labels=train_set.labels,
        batch_size=p.batch.size,
        m=p.batch.images_per_class[info.batch],
        iterations=p.iterations_per_epoch,
        seed=spec.seed,
        **spec.sampler_params,
    )
    if is_distributed():  # K ranks: each its slice of the global batch, BatchNorm over it all
        values = {k: [v] for k, v in spec.strategy_params.items()}
        if (why := strategy.ranks_refusal(values)) is not None:
            raise ValueError(why)  # refused at validation already; a direct caller hears it too
        sampler = DistributedBatchSampler(sampler, *rank_and_world())
        model.train()
        if p.freeze_batchnorm:
            freeze_batchnorm(model.trunk)
        sync_batchnorm(model)
    train_loader, val_loader = make_loaders(p, train_set, val_set, sampler, spec.device)
    return FoldParts(
        model=model,
        loss_fn=loss_fn,
        opt=opt,
        loss_opt=loss_opt,
        miner=miner,
        strategy=strategy,
        scaler=scaler,
        sampler=sampler,
        dataset=dataset,
        val_set=val_set,
        train_loader=train_loader,
        val_loader=val_loader,
    )


def make_loaders(
    p: Preset, train_set: View, val_set: View, sampler: Any, device: str
) -> tuple[FoldLoader | DataLoader, FoldLoader | DataLoader]:
    """The fold's training loader (``sampler``'s batches of ``train_set``, with each sample's
    position for memory-bank samplers) and validation loader (``val_set`` in order, batches of
    ``eval_batch_size``), with the preset's :func:`loader_options`. With
    ``persistent_workers``, each is a :class:`~mlrc.train.loaders.FoldLoader`: its workers
    live for the whole fold and give the very batches of workers started at every epoch;
    otherwise a plain ``DataLoader``, started at every ``iter()``. Under K ranks the
    validation loader reads this rank's share of ``val_set``
    (:func:`~mlrc.train.distributed.shard`)."""
    opts = loader_options(p, device)
    if is_distributed():
        val_set = Subset(val_set, shard(len(val_set)))
    if opts.pop("persistent_workers"):
        return (
            FoldLoader(IndexedView(train_set), batch_sampler=sampler, **opts),
            FoldLoader(val_set, batch_size=p.eval_batch_size, **opts),
        )
    opts["worker_init_fn"] = ignore_stop_signals
    return (
        CheckedLoader(IndexedView(train_set), batch_sampler=sampler, **opts),
        CheckedLoader(val_set, batch_size=p.eval_batch_size, **opts),
    )


def make_optimizer(
    name: str, params: Any, lr: float, weight_decay: float, momentum: float = 0.0
) -> torch.optim.Optimizer:
    """The preset's optimiser ``name``: ``rmsprop`` (the reference's), ``adam`` (L2 weight
    decay in the gradient) or ``adamw`` (decoupled weight decay); torch's other defaults."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.RMSprop(params, lr=lr, weight_decay=weight_decay, momentum=momentum)


def _loss_optimizer(
    spec: FoldSpec, loss_fn: torch.nn.Module, loss_weight_decay: float | None
) -> torch.optim.Optimizer | None:
    """The preset's ``loss_optimizer`` (RMSprop unless it names another) for the loss's own
    parameters (``None`` when it has none) at ``spec.loss_lr``; the loss's registered weight
    decay, if any, replaces the preset's (margin's beta: 0)."""
    params = list(loss_fn.parameters())
    if not params:
        return None
    if spec.loss_lr is None:
        raise ValueError(f"loss {spec.loss!r} has parameters but no loss_lr was given")
    lo = spec.preset.loss_optimizer
    wd = lo.weight_decay if loss_weight_decay is None else loss_weight_decay
    return make_optimizer(lo.name, params, spec.loss_lr, wd, lo.momentum)


def fold_inputs(
    p: Preset,
    dataset: ImageDataset,
    train_classes: Sequence[int],
    val_classes: Sequence[int],
    input_spec: dict,
    progress: bool = False,
) -> tuple[ImageDataset, View, View]:
    """A fold's input pipeline as it trains: (the dataset the validation transform reads, the
    training view, the validation view). Both views give uint8 CHW images in the trunk's channel
    order (4× smaller copies), normalised on the device by
    :func:`~mlrc.data.transforms.batch_to_trunk_input`.

    With the preset's ``decoded_cache`` (the same tensors, bit for bit): training reads the
    images decoded once and resized to ``image.resize`` through
    :class:`~mlrc.data.transforms.CachedTrainTransform` (with ``augment_on_device``: through
    :class:`~mlrc.data.transforms.DeviceCropTransform`, the same crops and flips resized on the
    device, numbers changed by interpolation noise), and validation the evaluation crops
    computed once (:func:`eval_inputs`), so it never decodes nor resizes; the dataset returned
    is then those crops (the memory-bank sampler embeds its training classes with the
    validation transform). Without it: the dataset and torchvision's transforms (with
    ``augment_on_device``: ``Resize``, then the device crops)."""
    im = p.image
    args = (im.resize, im.crop, im.scale, im.ratio, im.flip, input_spec)
    if not p.decoded_cache:
        train = train_transform(*args, uint8=True)
        if p.augment_on_device:  # the crop resized and flipped where batch_to_trunk_input runs
            edge = max(resized_long_edges(dataset, im.resize))
            train = T.Compose([T.Resize(im.resize), DeviceCropTransform(*args, canvas=edge)])
        val_set = View(dataset, val_classes, eval_transform(im.resize, im.crop, input_spec, True))
        return dataset, View(dataset, train_classes, train), val_set
    cached = decoded_cache(dataset, im.resize, default_cache_dir(), progress=progress)
    if p.augment_on_device:
        train = DeviceCropTransform(*args, canvas=max(resized_long_edges(cached, im.resize)))
    else:
        train = cached_train_transform(*args)
    val_set = eval_inputs(p, cached, val_classes, input_spec, progress)
    return val_set.ds, View(cached.as_arrays(), train_classes, train), val_set


def eval_inputs(
    p: Preset,
    dataset: ImageDataset,
    classes: Sequence[int],
    input_spec: dict,
    progress: bool = False,
) -> View:
    """The evaluation view of ``classes`` (validation, the test stage, the untrained baseline):
    uint8 CHW images of ``Resize(resize) → CenterCrop(crop)`` in the trunk's channel order.
    With the preset's ``decoded_cache``, read from the evaluation crops computed once
    (:func:`~mlrc.data.cache.eval_crops`; built from the decoded cache, itself built if
    missing), else the preset's eval transform on ``dataset``: the same tensors either way."""
    im = p.image
    if not p.decoded_cache:
        return View(dataset, classes, eval_transform(im.resize, im.crop, input_spec, uint8=True))
    if not isinstance(dataset, CachedImageDataset):
        dataset = decoded_cache(dataset, im.resize, default_cache_dir(), progress=progress)
    crops = eval_crops(dataset, im.resize, im.crop, default_cache_dir(), progress=progress)
    return View(crops.as_arrays(), classes, ArrayToUint8Input(input_spec))
