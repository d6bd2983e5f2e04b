"""Untrained baselines: raw-pixel features and random linear embedders (no training involved)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image
from tqdm import tqdm

from mlrc.data.base import ImageDataset


def pixel_features(ds: ImageDataset, indices: Sequence[int], side: int = 32) -> np.ndarray:
    """Grey-level pixels of each image resized to ``side`` × ``side``, centred per image.

    Returns float32 (len(indices), side²) with values in [−1, 1] (0–255 scaled by 1/255, minus
    the image's own mean).
    """
    out = np.empty((len(indices), side * side), dtype=np.float32)
    for row, i in enumerate(tqdm(indices, desc="pixels", unit="img", leave=False, disable=None)):
        im = ds.load_image(int(i)).convert("L").resize((side, side), Image.Resampling.BILINEAR)
        v = np.asarray(im, dtype=np.float32).reshape(-1) / 255.0
        out[row] = v - v.mean()
    return out


def random_embedder(features: np.ndarray, dim: int = 128, seed: int = 0) -> np.ndarray:
    """An untrained linear embedder: features @ W with W ~ N(0, 1/d_in), seeded. Shape (n, dim)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((features.shape[1], dim)).astype(np.float32) / np.sqrt(
        features.shape[1]
    )
    return features @ W
