"""A fold's data loaders whose worker processes live for the whole fold, with the very batches
of per-epoch workers.

torch's ``DataLoader`` starts its ``num_workers`` processes at every ``iter()`` (every epoch and
every validation: ≈ 18,000 process start-ups in a reference study, each waiting for its first
batch) unless ``persistent_workers=True`` — and then the workers are seeded once, so epoch 2
onwards draws other random crops than per-epoch workers, and the main process's torch RNG no
longer advances at each ``iter()``: the numbers of a fold would depend on a speed setting.

:class:`FoldLoader` keeps the workers and restores the per-epoch semantics exactly:

- at each ``iter()`` it draws the base seed from the global torch RNG with the very call
  ``DataLoader``'s iterator makes (``torch.empty((), dtype=torch.int64).random_().item()``,
  ``torch/utils/data/dataloader.py``, ``_BaseDataLoaderIter.__init__``); the ``DataLoader``
  inside draws its own from a private generator instead, so the global RNG advances by one draw
  per epoch, as before;
- every index the workers get carries that seed; a worker seeing a new seed re-seeds itself
  before its first sample of the epoch exactly as a fresh worker does
  (``torch/utils/data/_utils/worker.py``, ``_worker_loop``: ``random``, ``torch`` with
  ``seed + worker_id``, ``numpy`` with the SeedSequence state of ``(worker_id, seed)``);
- batch ``k`` of an epoch goes to worker ``k mod num_workers`` in both cases (the
  ``DataLoader`` restarts its round-robin at every ``iter()``).

So with the same global RNG state (restored from ``last.pt`` on resume) the batches are
identical, bit for bit, to those of a ``DataLoader`` started afresh each epoch (tested). With
``num_workers = 0`` the transforms draw from the global RNG in the main process, as before.
"""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401  (its exit handler first: see the end)
import random
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, get_worker_info

from mlrc.errors import stops_raise_at_once
from mlrc.train.lost import LoaderLost

__all__ = ["CheckedLoader", "FoldLoader", "LoaderLost", "killed_worker", "worker_seed_state"]


class FoldLoader:
    """An iterable over a dataset's batches (``batch_sampler``'s, or ``batch_size`` in order)
    whose ``num_workers`` processes start at the first ``iter()`` and live until the loader is
    garbage-collected; each ``iter()`` yields what a ``DataLoader`` started afresh would (see
    the module docstring). ``pin_memory`` as ``DataLoader``'s (CUDA only)."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_sampler: Iterable[list[int]] | None = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        if (batch_sampler is None) == (batch_size is None):
            raise ValueError("give exactly one of batch_sampler and batch_size")
        if batch_sampler is None:
            batch_sampler = BatchSampler(SequentialSampler(range(len(dataset))), batch_size, False)
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._epoch = _EpochSeed()
        self._loader = CheckedLoader(
            _SeededDataset(dataset),
            batch_sampler=_SeededBatches(batch_sampler, self._epoch),
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=num_workers > 0,
            worker_init_fn=ignore_stop_signals,
            generator=torch.Generator(),  # its own draw must not advance the global RNG
        )

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        # the draw a fresh DataLoader iterator makes from the global RNG (see module docstring)
        self._epoch.seed = int(torch.empty((), dtype=torch.int64).random_().item())
        return iter(self._loader)


class CheckedLoader(DataLoader):
    """A ``DataLoader`` whose loader process ended from outside (SIGKILL, SIGTERM, SIGINT: the
    OOM killer, a kill) is :class:`LoaderLost` at the next batch — interrupted and retried,
    as a lost rank — not an error of the trial; every other error is raised as it is."""

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            return super().__iter__()
        try:
            with stops_raise_at_once():  # a persistent iterator's reset awaits its loaders
                it = super().__iter__()
        except Exception as e:
            _raise_if_lost(getattr(self, "_iterator", None), e)
            raise
        _quiet_sigchld()
        return _loader_lost_checked(it)


def _quiet_sigchld() -> None:
    """torch's SIGCHLD handler (installed by the first multi-process iterator) raises a dead
    loader's error at whatever bytecode the main thread runs — a database write, a weakref
    callback — never at a place that can record it. Without it torch still finds the loader
    dead at the next batch (a broken pipe, or its liveness check), where this module looks."""
    handler = signal.getsignal(signal.SIGCHLD)
    torch_s = callable(handler) and getattr(handler, "__module__", "").startswith("torch.")
    if torch_s and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _loader_lost_checked(it: Any) -> Iterator[Any]:
    """``it``'s batches; an error while one is awaited (a broken pipe, or torch's "exited
    unexpectedly", as it happens) is :class:`LoaderLost` when one of its loader processes was
    ended from outside (looked for during 1 s: its pipe closes just before it ends). A stop
    signal during the wait raises at once: torch waits for a batch in slices of 5 s (and for
    ever while a stalled loader lives), and the step's own check comes only after it."""
    while True:
        try:
            with stops_raise_at_once():
                batch = next(it)
        except StopIteration:
            return
        except Exception as e:
            _raise_if_lost(it, e)
            raise
        yield batch


def _raise_if_lost(it: Any, e: Exception) -> None:
    """:class:`LoaderLost` from ``e`` if a process of the iterator ``it`` was ended from
    outside (looked for during 1 s: its pipe closes just before it ends)."""
    deadline = time.monotonic() + 1.0
    while (lost := killed_worker(it)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if lost is not None:
        raise LoaderLost(lost) from e


_FROM_OUTSIDE = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


def killed_worker(it: Any) -> str | None:
    """``data loader process PID ended by SIGKILL`` for a process of the DataLoader iterator
    ``it`` that one of :data:`_FROM_OUTSIDE` ended, else None. torch keeps its processes in
    the iterator's ``_workers`` and offers no public way to them: read with ``getattr``."""
    for w in getattr(it, "_workers", ()):
        code = w.exitcode  # polls (reaps) the process: a negative code is the signal's number
        if code is not None and -code in _FROM_OUTSIDE:
            return f"data loader process {w.pid} ended by {signal.Signals(-code).name}"
    return None


def worker_seed_state(seed: int, worker_id: int) -> np.ndarray:
    """The numpy seed a fresh DataLoader worker ``worker_id`` of base seed ``seed`` gets: four
    uint32 words of NumPy's SeedSequence over ``(worker_id, seed's low and high 32 bits)`` (what
    torch's ``_generate_state`` computes, written with NumPy's own SeedSequence)."""
    return np.random.SeedSequence([worker_id, seed & 0xFFFFFFFF, seed >> 32]).generate_state(4)


class _EpochSeed:
    """The base seed of the epoch being loaded, shared by the loader and its batches."""

    seed: int = 0


class _SeededBatches:
    """The batch sampler's batches with every index tagged by the epoch's base seed."""

    def __init__(self, batches: Iterable[list[int]], epoch: _EpochSeed) -> None:
        self.batches, self.epoch = batches, epoch

    def __len__(self) -> int:
        if not isinstance(self.batches, Sized):
            raise TypeError("the batch sampler has no length")
        return len(self.batches)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        seed = self.epoch.seed  # read at the first batch: after FoldLoader.__iter__ drew it
        for batch in self.batches:
            yield [(seed, i) for i in batch]


class _SeededDataset(Dataset):
    """``dataset[i]`` for an index ``(seed, i)``; in a worker, first re-seeded as a fresh
    worker of base seed ``seed`` when the seed is new (the first sample of an epoch)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.seeded_for: int | None = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        seed, i = key
        info = get_worker_info()
        if info is not None and seed != self.seeded_for:
            random.seed(seed + info.id)  # as torch's _worker_loop seeds a fresh worker
            torch.manual_seed(seed + info.id)
            np.random.seed(worker_seed_state(seed, info.id))
            self.seeded_for = seed
        return self.dataset[i]


def ignore_stop_signals(_worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: SIGINT and SIGTERM (a Ctrl-C or a preemption
    sent to the whole process group) are its parent's to handle; the worker ends with its
    parent (torch's watchdog sees the parent gone), or by :func:`end_loader_workers`."""
    import signal

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def end_loader_workers() -> None:
    """At exit, SIGKILL the daemonic children still alive (in mlrc, DataLoader workers). One outlives its
    iterator when a traceback kept after an error still holds that iterator. ``multiprocessing``'s
    own exit handler ends daemonic children with SIGTERM, which these workers ignore, and then
    joins them: without this, the process would wait for them forever (they wait for it)."""
    import contextlib
    import multiprocessing
    import signal

    # torch's SIGCHLD handler raises when a loader worker dies: not now, at exit, for these kills
    with contextlib.suppress(ValueError):  # ValueError: not the main thread
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    children = [c for c in multiprocessing.active_children() if c.daemon]
    for child in children:
        child.kill()
    for child in children:
        with contextlib.suppress(Exception):
            child.join(5)


# registered after multiprocessing's own exit handler (registered when multiprocessing.util is
# first imported, here at the latest), so that it runs before it
atexit.register(end_loader_workers)
