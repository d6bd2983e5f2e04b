"""Fair CPU shares: each mlrc process that trains uses its share of the host's cores.

The cores a process may use (:func:`visible_cores`: its CPU affinity, bounded by a cgroup v2 or
v1 CPU quota) are divided by the mlrc workers running on this host (:func:`count_workers`),
and torch's intra-op threads are set to that share (:func:`apply_share`) at the start of every
fold, since workers come and go; never more than torch's own default (:func:`initial_threads`),
so a process alone uses the threads it used before. ``--threads N`` (``MLRC_THREADS``) fixes the
number instead. torch's results depend on its thread count (float sums in another order): a fold
trained with 1 thread gives other numbers than with 2 (each reproducible).

Workers find each other through a lock directory (``$MLRC_CACHE/workers``, default
``~/.cache/mlrc/workers``): each registered process holds an OS lock (``flock``, via
:mod:`filelock`) on its own file ``HOST-PID.lock``; the OS releases it when the process dies,
so a file whose lock can be taken belongs to a dead process and is removed. Only files of this
host are counted (the directory may be on a shared home).

DataLoader workers (``num_workers`` of the preset) are left as the preset says: their number
changes the augmentation's random streams, hence a study's numbers. The cpu preset uses none.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = [
    "apply_share",
    "configure",
    "count_workers",
    "initial_threads",
    "lock_dir",
    "register_worker",
    "reset",
    "share",
    "share_line",
    "visible_cores",
]

log = logging.getLogger("mlrc")


@dataclass
class _Share:
    """This process's setting: configured by the CLI, ``threads`` from ``--threads``."""

    configured: bool = False
    threads: int | None = None
    directory: Path | None = None
    applied: int | None = None


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
    """``$MLRC_CACHE/workers`` (``MLRC_CACHE`` defaults to ``~/.cache/mlrc``)."""
    root = os.environ.get("MLRC_CACHE") or os.path.join("~", ".cache", "mlrc")
    return Path(root).expanduser() / "workers"


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
    """Turn fair shares on for this process (the CLI does): register it as a worker and let
    :func:`apply_share` set torch's threads to ``threads`` or, None, the fair share."""
    try:
        register_worker(directory)
    except OSError as e:  # an unwritable cache folder: share without being counted
        log.warning("cpu share: cannot register in %s (%s)", directory or lock_dir(), e)
    initial_threads()  # before anything sets torch's threads
    _state.configured, _state.threads, _state.directory = True, threads, directory
    _state.applied = None


def apply_share() -> int | None:
    """Set torch's intra-op threads to ``--threads`` or this host's fair share now; returns
    the number (None, nothing changed, unless :func:`configure` was called). Called at the
    start of every fold."""
    if not _state.configured:
        return None
    import torch

    fair = share(count_workers(_state.directory), visible_cores())
    n = _state.threads or min(fair, initial_threads())
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    if n != _state.applied and _state.applied is not None:
        log.info("cpu share: now %d thread(s) of %d core(s)", n, visible_cores())
    _state.applied = n
    return n


def share_line() -> str:
    """``cpu share: 1 thread of 2 cores (3 mlrc workers on this host)`` (applies it first)."""
    n = apply_share() or 0
    cores = visible_cores()
    if _state.threads:
        return f"cpu share: {n} thread{'s' * (n != 1)} of {cores} cores (--threads)"
    w = count_workers(_state.directory)
    return (
        f"cpu share: {n} thread{'s' * (n != 1)} of {cores} cores "
        f"({w} mlrc worker{'s' * (w != 1)} on this host)"
    )


def reset() -> None:
    """Undo :func:`configure` in this process: release its registrations and forget the
    setting (torch's thread count is left as it is). For tests."""
    for path in list(_held):
        _unregister(path)
    _state.configured, _state.threads, _state.directory, _state.applied = False, None, None, None
