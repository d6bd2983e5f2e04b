"""Fair CPU shares: a study's folds compute with a fixed number of torch threads, and the mlrc
processes of a host share its cores by taking turns.

torch's results depend on its thread count (float sums in another order): a fold trained with 1
thread gives other numbers than with 2 (each reproducible). So the count is the study's, fixed
when the study is created (``--threads N``, ``MLRC_THREADS``, else :func:`study_threads`: the
cores a process may use (:func:`visible_cores`: its CPU affinity, bounded by a cgroup v2 or v1
CPU quota), never more than torch's own default (:func:`initial_threads`) — the same whatever
else runs on the host), stored with it and set before every fold (:func:`apply_threads`). The
fair share (:func:`fair_threads`: those cores divided by the mlrc workers on this host,
:func:`count_workers`) decides how many folds run at once instead: a process whose fold would
take more cores than are free waits for a slot (:func:`fold_slot`).

Workers find each other through a lock directory (``$MLRC_CACHE/workers``, default
``~/.cache/mlrc/workers``): each registered process holds an OS lock (``flock``, via
:mod:`filelock`) on its own file ``HOST-PID.lock``; the OS releases it when the process dies,
so a file whose lock can be taken belongs to a dead process and is removed. Only files of this
host are counted (the directory may be on a shared home). A fold that runs holds
``HOST-PID.run-T.slot`` (T: its threads), a process waiting for a slot ``HOST-PID.wait-N.slot``
(N: when it began to wait; the oldest waiter goes first), both locked the same way.

DataLoader workers (``num_workers`` of the preset) are left as the preset says: their number
changes the augmentation's random streams, hence a study's numbers. The cpu preset uses none.
They count in the host's share all the same: a fold keeps :func:`fold_cores` cores busy (its
torch threads on the CPU, one on a GPU, plus one per loader process), which is what its slot
holds. A GPU fold takes its slot without waiting (an idle GPU costs more than a busy core) so
that the CPU folds beside it wait for the cores its loader processes use.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from mlrc import paths
from mlrc.errors import raise_if_stopped

__all__ = [
    "apply_threads",
    "configure",
    "count_workers",
    "fair_threads",
    "fold_cores",
    "fold_slot",
    "initial_threads",
    "lock_dir",
    "register_worker",
    "requested_threads",
    "study_threads",
    "reset",
    "share",
    "share_line",
    "visible_cores",
    "waiting_line",
]

log = logging.getLogger("mlrc")


@dataclass
class _Share:
    """This process's setting: configured by the CLI, ``threads`` from ``--threads``."""

    configured: bool = False
    threads: int | None = None
    directory: Path | None = None


POLL_S = 0.1  # how often a process waiting for a fold slot looks again


_state = _Share()
_held: dict[Path, FileLock] = {}  # this process's registrations, kept alive until exit


def _quota_cores(quota: str, period: str) -> int | None:
    """ceil(quota / period) cores, or None for no quota ("max", -1, unreadable)."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    """The stripped text of a file, None if it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cores(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The cgroup CPU quota in whole cores (rounded up), None when there is none: v2
    ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD"), else v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (under ``cpu/``, ``cpu,cpuacct/`` or ``root`` itself)."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        parts = v2.split()
        return _quota_cores(parts[0], parts[1]) if len(parts) == 2 else None
    for sub in ("cpu", "cpu,cpuacct", "."):
        quota = _read(root / sub / "cpu.cfs_quota_us")
        period = _read(root / sub / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            return _quota_cores(quota, period)
    return None


def visible_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, bounded by the cgroup quota; ≥ 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        cores = os.cpu_count() or 1
    quota = cgroup_cores(cgroup_root)
    return max(1, min(cores, quota) if quota else cores)


def lock_dir() -> Path:
    """``$MLRC_CACHE/workers``: :func:`mlrc.paths.workers_dir`."""
    return paths.workers_dir()


def _host_prefix() -> str:
    """``HOST-``: the prefix of this host's lock files."""
    return socket.gethostname().replace(os.sep, "_") + "-"


def register_worker(directory: Path | None = None) -> Path:
    """Register this process as an mlrc worker of this host until it exits (idempotent);
    returns its lock file."""
    d = directory or lock_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{_host_prefix()}{os.getpid()}.lock"
    if path not in _held:
        lock = FileLock(path, timeout=0)
        lock.acquire()
        _held[path] = lock
        atexit.register(_unregister, path)
    return path


def _unregister(path: Path) -> None:
    """Remove this process's registration ``path`` (at exit; the OS frees the lock anyway)."""
    lock = _held.pop(path, None)
    if lock is not None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        lock.release()


def _is_held(path: Path) -> bool:
    """Whether some live process holds the lock of ``path``; a free one is stale: removed."""
    if path in _held:
        return True
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    except OSError:  # vanished or unreadable meanwhile: not a live worker
        return False
    try:
        path.unlink(missing_ok=True)
    finally:
        lock.release()
    return False


def count_workers(directory: Path | None = None) -> int:
    """The mlrc workers registered on this host whose process is alive (stale files removed)."""
    d = directory or lock_dir()
    try:
        files = list(d.glob(f"{_host_prefix()}*.lock")) if d.is_dir() else []
    except OSError:
        return 0
    return sum(_is_held(p) for p in files)


def share(n_workers: int, cores: int) -> int:
    """Threads per worker: ``cores // n_workers``, at least 1 (n_workers < 1 counts as 1)."""
    return max(1, cores // max(1, n_workers))


_initial: list[int] = []
# A forked child reads its own count (a child that set 1 thread must not take the parent's
# count back: libgomp's thread pool does not survive fork, a parallel region there hangs).
os.register_at_fork(after_in_child=_initial.clear)


def initial_threads() -> int:
    """torch's own thread count in this process before mlrc changed it (its default: the
    physical cores, or ``OMP_NUM_THREADS``), read once. The fair share never exceeds it, so a
    single process uses the threads it used before (a study's numbers depend on the count)."""
    if not _initial:
        import torch

        _initial.append(torch.get_num_threads())
    return _initial[0]


def configure(threads: int | None, directory: Path | None = None) -> None:
    """Turn fair shares on for this process (the CLI does): register it as a worker, note its
    ``--threads`` (:func:`requested_threads`) and let its folds take turns (:func:`fold_slot`)."""
    try:
        register_worker(directory)
    except OSError as e:  # an unwritable cache folder: share without being counted
        log.warning("cpu share: cannot register in %s (%s)", directory or lock_dir(), e)
    initial_threads()  # before anything sets torch's threads
    _state.configured, _state.threads, _state.directory = True, threads, directory


def requested_threads() -> int | None:
    """This process's ``--threads`` (None: not given, or not configured)."""
    return _state.threads


def fair_threads() -> int:
    """This process's fair share of the host's cores now: the visible cores ÷ the mlrc workers
    on this host, at least 1, never more than torch's own default (a single process uses the
    threads it used before). What a new study's folds compute with, unless ``--threads``."""
    return min(share(count_workers(_state.directory), visible_cores()), initial_threads())


def study_threads() -> int:
    """The torch threads a new study's folds compute with unless ``--threads``: the cores this
    process may use (:func:`visible_cores`), never more than torch's own default — not divided
    by the mlrc processes running now (:func:`fair_threads`), so a study's numbers do not depend
    on what else ran on the host when it was created; its neighbours take turns for the cores
    instead (:func:`fold_slot`)."""
    return min(visible_cores(), initial_threads())


def apply_threads(n: int) -> int:
    """Set torch's intra-op threads to ``n`` (a study's count; see :mod:`this module
    <mlrc.train.threads>`); returns it."""
    import torch

    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


def fold_cores(threads: int, loader_workers: int, device: str) -> int:
    """The host cores a fold keeps busy: one per DataLoader worker process (``num_workers``;
    each computes with one torch thread) plus, on the CPU, its ``threads`` torch threads, or on
    a GPU (``cuda``, ``cuda:N``, ``mps``) one: the thread that launches the kernels."""
    main = threads if device.split(":", 1)[0] == "cpu" else 1
    return main + max(0, loader_workers)


@contextlib.contextmanager
def fold_slot(threads: int, wait: bool = True) -> Iterator[None]:
    """Hold ``threads`` of this host's cores while a fold runs (:func:`fold_cores`: its torch
    threads and loader processes): wait (one log line) while the folds other mlrc processes are
    running hold so many that this one would not fit, or while an older waiter waits.
    ``wait=False`` (a GPU fold): take the slot at once, so that others count its cores. Never a
    deadlock: a fold runs whenever no other process runs one, and only live processes are
    waited for (a killed one's files are free locks, removed). Nothing is waited for unless
    :func:`configure` was called (an mlrc command, not a library call)."""
    if not _state.configured:
        yield
        return
    d = _state.directory or lock_dir()
    try:
        held = _claim(d, threads) if wait else _take(d, threads)
    except OSError as e:  # an unwritable cache folder: run without taking turns
        log.warning("cpu share: no fold slots in %s (%s)", d, e)
        yield
        return
    try:
        yield
    finally:
        _drop(held)


def _take(d: Path, threads: int) -> FileLock:
    """Take a slot in ``d`` without waiting: the held ``run`` file."""
    with _mutex(d):
        return _hold(d / f"{_host_prefix()}{os.getpid()}.run-{threads}.slot")


def _claim(d: Path, threads: int) -> FileLock:
    """Wait for a slot in ``d`` and take it: the held ``run`` file."""
    waiting: list[FileLock] = []
    try:
        return _wait_and_take(d, threads, waiting)
    finally:  # taken, or stopped while waiting (Ctrl-C): this process waits no more
        for lock in waiting:
            _drop(lock)


def _wait_and_take(d: Path, threads: int, waiting: list[FileLock]) -> FileLock:
    """:func:`_claim`'s loop; ``waiting`` gets this process's ``wait`` file once it waits. A
    stop signal ends the wait within one pass (:data:`POLL_S`)."""
    prefix, pid, cores = _host_prefix(), os.getpid(), visible_cores()
    while True:
        raise_if_stopped()
        with _mutex(d):
            busy, waiters = _others(d, prefix, pid)
            mine = _ticket(waiting[0]) if waiting else None
            first = not waiters or (mine is not None and mine <= min(waiters))
            if first and (busy == 0 or busy + threads <= cores):
                return _hold(d / f"{prefix}{pid}.run-{threads}.slot")
            if not waiting:
                waiting.append(_hold(d / f"{prefix}{pid}.wait-{time.time_ns()}.slot"))
                log.warning("%s", waiting_line(busy, cores, threads, len(waiters)))
        time.sleep(POLL_S)


def waiting_line(busy: int, cores: int, threads: int, ahead: int) -> str:
    """The line a fold logs when it starts to wait: the cores other processes' folds hold,
    and the processes that waited first (they go first, even when cores are free)."""
    uses = f"this study's folds use {threads} core{'s' * (threads != 1)}: torch threads and "
    uses += "loader processes"
    if ahead:
        who = f"{ahead} other mlrc process{'es' * (ahead != 1)}"
        return (
            f"cpu share: waiting behind {who} that started waiting first ({busy} of {cores} "
            f"cores busy with other mlrc processes' folds; {uses})"
        )
    return (
        f"cpu share: waiting for a free slot ({busy} of {cores} cores busy with other mlrc "
        f"processes' folds; {uses})"
    )


@contextlib.contextmanager
def _mutex(d: Path) -> Iterator[None]:
    """This host's slot files are read and written by one process at a time."""
    d.mkdir(parents=True, exist_ok=True)
    with FileLock(d / f"{_host_prefix()}slots.mutex", timeout=60):
        yield


def _others(d: Path, prefix: str, pid: int) -> tuple[int, list[int]]:
    """(threads of the folds other live processes run, their waiters' tickets); stale files
    (their process died) are removed."""
    busy, waiters = 0, []
    for path in d.glob(f"{prefix}*.slot"):
        name = path.name.removeprefix(prefix).removesuffix(".slot")
        owner, _, state = name.partition(".")
        kind, _, value = state.partition("-")
        if owner == str(pid) or not value.isdigit() or not _is_held(path):
            continue
        if kind == "run":
            busy += int(value)
        elif kind == "wait":
            waiters.append(int(value))
    return busy, waiters


def _ticket(lock: FileLock) -> int:
    """The time a waiter's ``wait`` file names."""
    return int(Path(lock.lock_file).name.rsplit("wait-", 1)[1].removesuffix(".slot"))


def _hold(path: Path) -> FileLock:
    """Create and lock ``path`` (this process's slot file)."""
    lock = FileLock(path, timeout=0)
    lock.acquire()
    return lock


def _drop(lock: FileLock) -> None:
    """Remove and release this process's slot file."""
    with contextlib.suppress(OSError):
        Path(lock.lock_file).unlink(missing_ok=True)
    lock.release()


def share_line() -> str:
    """``cpu share: 1 thread of 2 cores (3 mlrc workers on this host)``: what a study created
    now would take (``--threads``: that number)."""
    cores = visible_cores()
    if _state.threads:
        n = _state.threads
        return f"cpu share: {n} thread{'s' * (n != 1)} of {cores} cores (--threads)"
    n, w = study_threads(), count_workers(_state.directory)
    return (
        f"cpu share: {n} thread{'s' * (n != 1)} of {cores} cores "
        f"({w} mlrc worker{'s' * (w != 1)} on this host, taking turns)"
    )


def reset() -> None:
    """Undo :func:`configure` in this process: release its registrations and forget the
    setting (torch's thread count is left as it is). For tests."""
    for path in list(_held):
        _unregister(path)
    _state.configured, _state.threads, _state.directory = False, None, None
