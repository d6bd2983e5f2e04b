"""A study's pre-flight: what would stop its training or its test stage, found before the study
is registered in the store and before anything trains (``mlrc study run|test``, ``mlrc
worker``, ``mlrc campaign run`` for each of its studies, ``mlrc demo``; ``--skip-checks`` skips
it). Each problem is one line naming the file or the class, and which half or fold.

1. **Class sizes**, against what the code that would fail needs:

   * the test half and every fold's validation classes need a class with at least 2 images:
     the metrics (:func:`mlrc.protocol.retrieval_metrics`) leave out every query without
     another item of its class (R = 0) and raise when none is left — a test half of single
     images would otherwise stop ``study test`` after the whole search;
   * every fold's training classes must suit the study's batch sampler: the sampler is built
     on them exactly as a fold builds it (:func:`mlrc.methods.samplers.build`, the preset's
     batch size and images per class), so its own checks apply — the class-balanced samplers
     (``m_per_class``, the memory-bank ones, ``spc_random``) need at least 2 training classes
     (a class with fewer than m images is drawn with replacement, which they allow), ``shuffle``
     at least a batch of training images.

2. **Weights**: the trunk's ``pretrained`` is resolved as a fold would resolve it
   (:func:`mlrc.models.weights.check_weights`: the file found, downloaded first for ``true`` when
   not cached, read, its names and shapes matched), without building the trunk's parameters.

3. **Images**: every image of both halves (train+val and test) is decoded once
   (:func:`mlrc.data.verify.verify_images`, the decoding of ``mlrc data check``); the ones that
   decoded are remembered in ``$MLRC_CACHE/checked`` by file, size and mtime, so a rerun decodes
   only what changed. A progress bar is shown when more than :data:`BAR_OVER` images are to be
   decoded.

4. **Disk for the decoded cache** (a preset with ``decoded_cache``): when the study's decoded
   cache is not built yet, the bytes it and the evaluation crops will take (from the image
   headers, :func:`mlrc.data.estimate.estimate_cache_bytes`) must fit on ``$MLRC_CACHE``'s disk
   with a margin (:func:`mlrc.data.cache.check_room`), or the study is refused in one line
   before the first fold would stop on it.

The cheap checks come first. :func:`preflight` returns a :class:`Preflight` whose
:meth:`~Preflight.line` the commands print (unless ``--quiet``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrc import data
from mlrc.config import ConfigError, ResolvedStudy
from mlrc.config.splits import build_split
from mlrc.data.base import DatasetError, ImageDataset
from mlrc.data.verify import verify_images
from mlrc.protocol.splits import Split

__all__ = [
    "BAR_OVER",
    "Preflight",
    "check_cache_room",
    "check_class_sizes",
    "check_images",
    "preflight",
]

BAR_OVER = 2000  # images to decode above which a progress bar is shown
SHOWN = 5  # class names shown in a message, then how many more


@dataclass(frozen=True)
class Preflight:
    """What the pre-flight checked, for its one line."""

    images: int
    decoded: int  # decoded this time
    cached: int  # known to decode from an earlier run
    classes: int
    folds: int
    weights: str
    seconds: float

    def line(self) -> str:
        folds = f"{self.folds} fold" + ("s" if self.folds != 1 else "")
        return (
            f"pre-flight: {self.images} images ({self.decoded} decoded, {self.cached} checked "
            f"before), {self.classes} classes, {folds} and the test half, {self.weights}: "
            f"ok in {self.seconds:.1f} s"
        )


def preflight(resolved: ResolvedStudy, progress: bool = True) -> Preflight:
    """Check the study's dataset, split and weights (see the module docstring); a one-line
    ``DatasetError`` (images, class sizes), ``ConfigError`` (weights, the split file) or
    ``SplitError`` for the first problem. ``progress``: a bar while decoding many images."""
    from mlrc.models.weights import check_weights

    t0 = time.monotonic()
    study, preset = resolved.study, resolved.preset
    source = resolved.source or "study"
    ds = data.build(study.dataset.name, root=study.dataset.root, **study.dataset.params)
    split = build_split(resolved.split, ds, preset.folds, preset.split_scheme, f"{source}: split")
    check_class_sizes(resolved, ds, split)
    try:
        check_weights(preset.trunk, preset.pretrained)
    except ValueError as e:  # missing, empty or unreadable file, failed download, misfit
        raise ConfigError(f"{source}: pretrained: {e}") from None
    decoded, cached = check_images(resolved, ds, split, progress)
    check_cache_room(resolved, ds)
    return Preflight(
        len(ds),
        decoded,
        cached,
        ds.num_classes,
        len(split.folds),
        _weights(preset.trunk, preset.pretrained),
        time.monotonic() - t0,
    )


def check_cache_room(resolved: ResolvedStudy, ds: ImageDataset) -> None:
    """With the preset's ``decoded_cache``, a cache not built yet must fit on its disk (see the
    module docstring); ``DatasetError`` naming the study, the size and the free space."""
    from mlrc.data.cache import cache_key, cache_paths, check_room, default_cache_dir
    from mlrc.data.estimate import estimate_cache_bytes

    im = resolved.preset.image
    if not resolved.preset.decoded_cache or im.resize is None:
        return
    folder = default_cache_dir()
    data_file, _ = cache_paths(folder, ds.name, im.resize, cache_key(ds, im.resize))
    if data_file.is_file():  # built: the evaluation crops are small beside it
        return
    estimate = estimate_cache_bytes(ds, im.resize, im.crop)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        check_room(folder, estimate.total)
    except DatasetError as e:
        raise DatasetError(f"{resolved.source or 'study'}: decoded_cache: {e}") from None


# --- class sizes -------------------------------------------------------------------------------


def check_class_sizes(resolved: ResolvedStudy, ds: ImageDataset, split: Split) -> None:
    """The test half and each fold's validation classes hold a class with ≥ 2 images; each
    fold's training classes suit the sampler (see the module docstring). ``DatasetError``."""
    where = _where(resolved)
    counts = ds.class_counts()
    if not _retrievable(counts, split.test_classes):
        raise DatasetError(
            f"{where}: the test half has no class with 2 or more images ("
            f"{_single(ds, split.test_classes)}): no test query has another image of its class, "
            "so MAP@R, P@1 and R-Precision cannot be computed"
        )
    for fold in split.folds:
        if not _retrievable(counts, fold.val_classes):
            raise DatasetError(
                f"{where}: fold {fold.index}'s validation classes have no class with 2 or more "
                f"images ({_single(ds, fold.val_classes)}): no validation query has another "
                "image of its class, so MAP@R, P@1 and R-Precision cannot be computed"
            )
        problem = _sampler_problem(resolved, ds, fold.train_classes)
        if problem:
            raise DatasetError(f"{where}: fold {fold.index}'s training classes: {problem}")


def _where(resolved: ResolvedStudy) -> str:
    """The study file, and its split file when it has one."""
    source = resolved.source or "study"
    split = resolved.split
    if split is None:
        return source
    if split.file:
        return f"{source}: split: {split.file}"
    return f"{source}: split" + (f": {split.test}" if isinstance(split.test, str) else "")


def _retrievable(counts: np.ndarray, classes: Sequence[int]) -> bool:
    """Some class of ``classes`` has ≥ 2 images: a query with R > 0 exists."""
    return bool((counts[np.asarray(classes, dtype=np.int64)] >= 2).any())


def _names(ds: ImageDataset, classes: Sequence[int]) -> str:
    shown = ", ".join(repr(ds.class_names[c]) for c in classes[:SHOWN])
    more = len(classes) - SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _single(ds: ImageDataset, classes: Sequence[int]) -> str:
    n = len(classes)
    if n == 1:
        return f"its one class {_names(ds, classes)} has a single image"
    return f"its {n} classes {_names(ds, classes)} have one image each"


def _sampler_problem(resolved: ResolvedStudy, ds: ImageDataset, classes: Sequence[int]) -> str:
    """What the study's batch sampler says of a fold's training classes, built as a fold builds
    it (:func:`mlrc.train.setup.build_fold`); "" when it is content."""
    from mlrc.methods import losses, samplers

    p, sampler = resolved.preset, resolved.study.sampler
    labels = ds.labels[np.isin(ds.labels, np.asarray(classes, dtype=np.int64))]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fewer classes than a batch wants: it copes
            samplers.build(
                sampler.name,
                labels=labels,
                batch_size=p.batch.size,
                m=p.batch.images_per_class[losses.info(resolved.study.loss.name).batch],
                iterations=p.iterations_per_epoch,
                seed=0,
                **sampler.params,
            )
    except ValueError as e:
        return f"{e} (sampler {sampler.name})"
    return ""


# --- images ------------------------------------------------------------------------------------


def check_images(
    resolved: ResolvedStudy, ds: ImageDataset, split: Split, progress: bool = True
) -> tuple[int, int]:
    """Decode every image not known to decode; (decoded now, known before). An image that does
    not decode is a ``DatasetError``: its message, its class and half, and how many more."""
    with_bar = progress and len(ds) > BAR_OVER  # a bar only when there may be much to decode
    done = verify_images(ds, progress=with_bar, bar_over=BAR_OVER)
    if done.failures:
        i, message = done.failures[0]
        more = len(done.failures) - 1
        tail = ""
        if more:
            root = resolved.study.dataset.root
            command = f"mlrc data check {ds.name}" + (f" --root {root}" if root else "")
            tail = f"; {more} more image{'s' if more > 1 else ''} cannot be decoded ({command} lists them all)"
        raise DatasetError(f"{message} ({_class_of(ds, split, int(ds.labels[i]))}){tail}")
    return done.decoded, done.cached


def _class_of(ds: ImageDataset, split: Split, c: int) -> str:
    """``class 'b', test half`` or ``class 'a', train+val half, validated in fold 1``."""
    name = f"class {ds.class_names[c]!r}"
    if c in split.test_classes:
        return f"{name}, test half"
    fold = next((f.index for f in split.folds if c in f.val_classes), None)
    return f"{name}, train+val half" + (f", validated in fold {fold}" if fold is not None else "")


# --- weights -----------------------------------------------------------------------------------


def _weights(trunk: str, pretrained: Any) -> str:
    """The trunk and its weights, for the line."""
    if hasattr(pretrained, "model_dump"):
        pretrained = pretrained.file or pretrained.url
    if pretrained is False or pretrained is None:
        return f"trunk {trunk} (no pretrained weights)"
    if pretrained is True:
        return f"trunk {trunk} (pretrained weights)"
    return f"trunk {trunk} (weights {pretrained})"
