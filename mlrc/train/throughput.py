"""How fast a fold's input pipeline feeds its GPU (``mlrc data bench``).

:func:`measure` runs the fold's own input pipeline on the CPU: :func:`~mlrc.train.setup.fold_inputs`
(the decoded cache, built first and timed on its own, and the training and validation views in
the trunk's input convention) and :func:`~mlrc.train.setup.make_loaders` (the preset's loader
options, the protocol's batch sampler over the first fold's training classes, the validation
classes in order at ``eval_batch_size``). No model runs; batches stay on the CPU as uint8 (the
device normalises them).

What each :class:`Rate` says:

* ``first_batch_s``: seconds from asking the loader for its first epoch (a fold's first training
  epoch, or its first validation) to its first batch — loader workers start there;
* ``later_first_batch_s``: the same for a later epoch (with persistent workers: no start-up,
  only the batch's own work);
* ``img_per_s``: images per second over later epochs, each from its start to its last batch
  (epoch boundaries included, as a fold pays them); ``per_core``: that divided by the cores that
  did the work (the loader workers, at most the cores this process may use; 1 for the main
  process with 0 workers, torch limited to 1 thread then).

A training epoch is the sampler's batches up to ``seconds`` (the sampler stops handing out
batches then and the loader drains what it has in flight, so the next epoch starts clean); a
validation is the first fold's validation images, cut to about ``seconds / 3`` at the training
rate so that its passes fit in ``seconds``.

The GPU it is compared with (:func:`gpu_demand`): the images per second the preset's trunk takes
at its batch size, from ``bench/results/gpu_fold.csv`` when ``bench/gpu_fold.py`` measured it on
a GPU (its synthetic-input upper bound), else from :data:`GPU_ESTIMATES` (estimates, marked as
such). Optionally (:class:`PlainComparison`) the fold's pipeline is also timed per core against
a plain PIL + torchvision chain of the same transforms (:func:`plain_train_transform`,
:func:`plain_eval_transform`: the same pixels).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Subset
from tqdm.auto import tqdm

from mlrc.config import Preset
from mlrc.data.base import ImageDataset
from mlrc.methods import samplers
from mlrc.train.gpu_demand import GpuDemand, gpu_demand
from mlrc.train.model import preset_trunk
from mlrc.train.setup import fold_inputs, make_loaders
from mlrc.train.threads import visible_cores

__all__ = [
    "CacheTiming",
    "Rate",
    "Throughput",
    "PlainComparison",
    "measure",
    "plain_eval_transform",
    "plain_train_transform",
    "trunk_input_spec",
]


@dataclass
class Rate:
    """One pipeline's throughput (see the module docstring); seconds, images, images/s."""

    img_per_s: float
    per_core: float
    first_batch_s: float
    later_first_batch_s: float
    images: int
    seconds: float


@dataclass
class CacheTiming:
    """What ``fold_inputs`` built before training: seconds (to open it when ``built`` is
    false: it was there already) and the bytes of its files on disk (0 without a cache)."""

    build_s: float
    bytes: int
    built: bool


@dataclass
class PlainComparison:
    """Images/s per core (the main process, 1 torch thread) of the fold's pipeline and of a
    plain PIL + torchvision chain of the same transforms on the original images (decode →
    Resize → RandomResizedCrop → flip, or → CenterCrop; → ToTensor → the trunk's range and
    channel order → Normalize), for training and evaluation."""

    train_fold: float
    train_plain: float
    eval_fold: float
    eval_plain: float

    def to_json(self) -> dict[str, dict[str, float]]:
        """Per pipeline: the two rates and their ratio (the fold's ÷ the plain chain's)."""
        return {
            part: {
                "fold_per_core": round(fold, 1),
                "plain_per_core": round(plain, 1),
                "ratio": round(fold / plain, 2) if plain > 0 else 0.0,
            }
            for part, fold, plain in (
                ("train", self.train_fold, self.train_plain),
                ("eval", self.eval_fold, self.eval_plain),
            )
        }


@dataclass
class Throughput:
    """Everything ``mlrc data bench`` prints."""

    train: Rate
    eval: Rate
    cache: CacheTiming
    workers: int
    cores: int
    gpu: GpuDemand | None
    plain: PlainComparison | None = None

    def verdict(self) -> str:
        """One line: what the CPUs feed against what the GPU takes."""
        who = f"{self.workers} CPU workers feed" if self.workers else "the main process feeds"
        fed = f"{who} ≈ {self.train.img_per_s:,.0f} img/s"
        if self.gpu is None:
            return f"{fed}; no GPU figure for this trunk and batch (run bench/gpu_fold.py on one)"
        takes = self.gpu.img_per_s
        bound = "input-bound" if self.train.img_per_s < takes else "GPU-bound"
        mark = " (estimate)" if self.gpu.estimate else ""
        return f"{fed}; the GPU takes ≈ {takes:,.0f}{mark}: {bound}"

    def to_json(self) -> dict[str, Any]:
        """``{"train": {img_per_s, per_core, first_batch_s}, "eval": {…}, "cache": {build_s,
        bytes}}`` and, under other keys, the later epochs' first batches, the cores, the GPU."""

        def core(r: Rate) -> dict[str, float]:
            return {
                "img_per_s": round(r.img_per_s, 1),
                "per_core": round(r.per_core, 1),
                "first_batch_s": round(r.first_batch_s, 4),
            }

        return {
            "train": core(self.train),
            "eval": core(self.eval),
            "cache": {"build_s": round(self.cache.build_s, 3), "bytes": self.cache.bytes},
            "later_first_batch_s": {
                "train": round(self.train.later_first_batch_s, 4),
                "eval": round(self.eval.later_first_batch_s, 4),
            },
            "cache_built": self.cache.built,
            "workers": self.workers,
            "cores": self.cores,
            "gpu": asdict(self.gpu) if self.gpu else None,
            "verdict": self.verdict(),
            **({"plain": self.plain.to_json()} if self.plain else {}),
        }


def trunk_input_spec(preset: Preset) -> dict:
    """The input convention of the preset's trunk (its ``normalize`` applied) without building
    weights: the trunk is made on the meta device (on the CPU, randomly initialised, where that
    fails)."""
    try:
        with torch.device("meta"):
            return dict(preset_trunk(preset, False).input_spec)
    except Exception:  # noqa: BLE001 - a trunk with no meta build: a real one, no weights
        return dict(preset_trunk(preset, False).input_spec)


def measure(
    preset: Preset,
    dataset: ImageDataset,
    train_classes: Sequence[int],
    val_classes: Sequence[int],
    seconds: float = 10.0,
    progress: bool = True,
    seed: int = 0,
    plain: bool = False,
) -> Throughput:
    """Time the fold's input pipeline (see the module docstring) with ``preset.num_workers``
    loader workers; each of the two measurements takes about ``seconds`` (s) after the cache.
    ``plain``: also compare it per core with a plain chain (:class:`PlainComparison`: four
    more measurements of ``seconds / 2``)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    spec = trunk_input_spec(preset)
    cache, (_, train_set, val_set) = _timed_inputs(
        preset, dataset, train_classes, val_classes, spec, progress
    )
    workers = preset.num_workers
    cores = 1 if workers == 0 else max(1, min(workers, visible_cores()))
    with _one_thread(workers == 0):
        train, evaluation = _fold_rates(preset, train_set, val_set, seconds, progress, seed, cores)
    result = Throughput(train, evaluation, cache, workers, cores, gpu_demand(preset))
    if plain:
        result.plain = _compare_plain(
            preset, dataset, (train_set, val_set), (train_classes, val_classes), spec, seconds / 2
        )
    return result


def _fold_rates(
    p: Preset, train_set: Any, val_set: Any, seconds: float, progress: bool, seed: int, cores: int
) -> tuple[Rate, Rate]:
    """Training, then evaluation (its pass sized by the training rate), through the fold's
    loaders (``make_loaders``)."""
    until = _sampler(p, train_set.labels, seed)
    train_loader, _ = make_loaders(p, train_set, val_set, until, "cpu")
    train = _timed("training pipeline", train_loader, until, seconds, progress, cores)
    del train_loader  # its persistent workers end here
    val_head = Subset(val_set, range(_eval_images(train.img_per_s, seconds, p, len(val_set))))
    _, val_loader = make_loaders(p, train_set, val_head, _sampler(p, train_set.labels, seed), "cpu")
    return train, _timed("evaluation pipeline", val_loader, None, seconds, progress, cores)


def _compare_plain(
    p: Preset,
    dataset: ImageDataset,
    fold_sets: tuple[Any, Any],
    classes: tuple[Sequence[int], Sequence[int]],
    spec: dict,
    seconds: float,
) -> PlainComparison:
    """Per core: the fold's views and the plain chain's, in the main process, 1 thread."""
    from torch.utils.data import DataLoader

    from mlrc.train.embed import IndexedView, View

    p0 = p.model_copy(update={"num_workers": 0})
    plain_train = View(dataset, classes[0], plain_train_transform(p, spec))
    plain_val = View(dataset, classes[1], plain_eval_transform(p, spec))
    with _one_thread(True):
        fold_train, fold_eval = _fold_rates(p0, *fold_sets, seconds, False, 0, 1)
        until = _sampler(p0, plain_train.labels, 0)
        loader = DataLoader(IndexedView(plain_train), batch_sampler=until)
        train = _timed("plain training", loader, until, seconds, False, 1)
        n = _eval_images(train.img_per_s, seconds, p0, len(plain_val))
        loader = DataLoader(Subset(plain_val, range(n)), batch_size=p.eval_batch_size)
        evaluation = _timed("plain evaluation", loader, None, seconds, False, 1)
    return PlainComparison(
        fold_train.img_per_s, train.img_per_s, fold_eval.img_per_s, evaluation.img_per_s
    )


def plain_train_transform(p: Preset, spec: dict) -> Any:
    """The preset's training transform as a torchvision user writes it, on PIL images:
    Resize → RandomResizedCrop → [flip] → ToTensor → ×range, [BGR] → Normalize (float32, per
    image). Same pixels as the fold's uint8 batches normalised by ``to_trunk_input``."""
    from torchvision import transforms as T

    im = p.image
    steps = [T.Resize(im.resize), T.RandomResizedCrop(im.crop, scale=im.scale, ratio=im.ratio)]
    if im.flip:
        steps.append(T.RandomHorizontalFlip(0.5))
    return T.Compose(steps + _plain_tail(spec))


def plain_eval_transform(p: Preset, spec: dict) -> Any:
    """Resize → CenterCrop → ToTensor → ×range, [BGR] → Normalize, on PIL images."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(p.image.resize), T.CenterCrop(p.image.crop), *_plain_tail(spec)])


def _plain_tail(spec: dict) -> list:
    from torchvision import transforms as T

    return [
        T.ToTensor(),
        _Scale(float(spec["input_range"])),
        _Bgr(bool(spec["bgr"])),
        T.Normalize(spec["mean"], spec["std"]),
    ]


class _Scale:
    """x × factor (a picklable step, for loader workers)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class _Bgr:
    """RGB → BGR when ``on`` (a picklable step)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(0) if self.on else x


def _timed_inputs(
    p: Preset,
    ds: ImageDataset,
    train_classes: Sequence[int],
    val_classes: Sequence[int],
    spec: dict,
    progress: bool,
) -> tuple[CacheTiming, tuple]:
    """``fold_inputs`` timed (it builds the preset's caches, or opens them when they exist:
    ``built`` false), with the bytes of the cache files its views read."""
    from mlrc.data.cache import default_cache_dir

    folder = default_cache_dir()
    before = _files(folder)
    t0 = time.perf_counter()
    inputs = fold_inputs(p, ds, train_classes, val_classes, spec, progress)
    build_s = time.perf_counter() - t0
    after = _files(folder)
    built = any(before.get(path) != size for path, size in after.items())
    return CacheTiming(build_s, _cache_bytes(inputs), built), inputs


def _files(folder: Path) -> dict[str, int]:
    """Size (bytes) of every file under ``folder`` (hidden ones, i.e. locks and temporaries,
    left out), by path."""
    out = {}
    if folder.is_dir():
        for root, _dirs, names in os.walk(folder):
            for name in names:
                if not name.startswith("."):
                    path = os.path.join(root, name)
                    try:
                        out[path] = os.stat(path).st_size
                    except FileNotFoundError:
                        continue
    return out


def _cache_bytes(inputs: tuple) -> int:
    """Bytes on disk of the cache files (data and index) behind ``fold_inputs``' dataset and
    views: the decoded images and the evaluation crops; 0 without a cache."""
    dataset, train_set, val_set = inputs
    files: set[str] = set()
    for ds in (dataset, getattr(train_set, "ds", None), getattr(val_set, "ds", None)):
        files.update(str(f) for f in getattr(ds, "cache_files", ()) or ())
    return sum(os.stat(f).st_size for f in files if os.path.exists(f))


@contextmanager
def _one_thread(on: bool) -> Iterator[None]:
    """torch limited to 1 thread inside (when ``on``): the main process is one core."""
    before = torch.get_num_threads()
    if on:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Until:
    """A batch sampler's batches, but none once ``deadline`` (``time.perf_counter``) has passed
    (always the first): the loader then drains what it has in flight and the epoch ends."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.deadline = float("inf")

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for k, batch in enumerate(self.sampler):
            if k and time.perf_counter() >= self.deadline:
                return
            yield batch

    def __getattr__(self, name: str) -> Any:  # the sampler's other attributes
        if name == "sampler":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.sampler, name)


def _sampler(p: Preset, labels: Any, seed: int) -> _Until:
    """The protocol's default batch sampler (m per class, pair batches) as ``build_fold`` makes
    it, stoppable by a deadline."""
    return _Until(
        samplers.build(
            "m_per_class",
            labels=labels,
            batch_size=p.batch.size,
            m=p.batch.images_per_class["pair"],
            iterations=p.iterations_per_epoch,
            seed=seed,
        )
    )


def _epoch(loader: Iterable, bar: Any) -> tuple[int, float, float]:
    """(images, seconds from asking for the epoch to its last batch, seconds to its first).
    Images are counted by the batch's labels (its images may be a ``DeviceCrop`` pair)."""
    t0 = time.perf_counter()
    first, n = None, 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += len(batch[1])
        bar.update(len(batch[1]))
    return n, time.perf_counter() - t0, first or 0.0


def _rate(loader: Iterable, until: _Until | None, seconds: float, bar: Any, cores: int) -> Rate:
    """A first epoch (its first batch only, when ``until`` can cut it), then later epochs until
    ``seconds`` have passed (at least one)."""
    if until is not None:
        until.deadline = 0.0  # the first batch, then nothing
    _, _, first = _epoch(loader, bar)
    end = time.perf_counter() + seconds
    images, busy, later = 0, 0.0, None
    while later is None or time.perf_counter() < end:
        if until is not None:
            until.deadline = end
        n, s, f = _epoch(loader, bar)
        images, busy, later = images + n, busy + s, f if later is None else later
    rate = images / busy if busy > 0 else 0.0
    return Rate(rate, rate / cores, first, later or 0.0, images, busy)


def _timed(
    desc: str, loader: Iterable, until: _Until | None, seconds: float, progress: bool, cores: int
) -> Rate:
    """:func:`_rate` of ``loader`` under a progress bar named ``desc``."""
    with tqdm(
        desc=desc, unit="img", disable=None if progress else True
    ) as bar:  # None: no tty, no bar
        return _rate(loader, until, seconds, bar, cores)


def _eval_images(train_rate: float, seconds: float, p: Preset, available: int) -> int:
    """Validation images per pass: about ``seconds / 3`` at the training rate, at least two
    batches per worker, at most the fold's validation set."""
    least = p.eval_batch_size * 2 * max(1, p.num_workers)
    return max(1, min(available, max(least, round(train_rate * seconds / 3))))
