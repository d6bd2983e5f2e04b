"""Frozen normalisation layers in DML training: BatchNorm statistics, LayerNorm affine weights.

BatchNorm is frozen in DML training: call :func:`freeze_batchnorm` after **every**
``model.train()``. :func:`freeze_layernorm` (the ``freeze_layernorm`` preset field, for timm
trunks) holds across ``model.train()``.
"""

from __future__ import annotations

from torch import nn

__all__ = ["freeze_batchnorm", "freeze_layernorm"]

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_LAYERNORMS = (nn.LayerNorm,)  # timm's LayerNorm / LayerNorm2d subclass nn.LayerNorm


def freeze_batchnorm(module: nn.Module) -> int:
    """Put every BatchNorm in ``module`` in eval mode; returns how many there are.

    In eval mode a BatchNorm normalises with its stored running mean/var and no longer updates
    them; its affine weight and bias are untouched and keep ``requires_grad`` (they still train).
    ``model.train()`` undoes this, so call ``freeze_batchnorm(model)`` after every
    ``model.train()``.
    """
    n = 0
    for m in module.modules():
        if isinstance(m, _BATCHNORMS):
            m.eval()
            n += 1
    return n


def freeze_layernorm(module: nn.Module) -> int:
    """Stop training every LayerNorm's affine weight and bias in ``module`` (``requires_grad``
    false, so optimisers skip them); returns how many LayerNorms there are. LayerNorm keeps no
    running statistics, so unlike :func:`freeze_batchnorm` this holds across ``model.train()``."""
    n = 0
    for m in module.modules():
        if isinstance(m, _LAYERNORMS):
            for p in m.parameters(recurse=False):
                p.requires_grad_(False)
            n += 1
    return n
