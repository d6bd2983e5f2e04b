"""One fold as K processes of ``torch.distributed``, started by torchrun's own launcher.

:func:`train_fold_ranks` runs :func:`~mlrc.train.loop.train_fold` in K processes through
``torch.distributed.launcher.api.elastic_launch`` — the library behind ``torchrun`` — on this
node (rendezvous ``c10d`` on a free local port, no restart: a retry is the search's business).
Each rank joins the default process group (NCCL on CUDA devices, gloo on the CPU, with a bounded
timeout: :data:`TIMEOUT_S`, not the 30-minute default), takes its device
(:func:`rank_devices`) and a share of the fold's threads, and trains its slice of every global
batch (:mod:`mlrc.train.distributed`); rank 0 alone writes ``last.pt``/``best.pt`` and reports
validations. The result comes back from rank 0.

Live validations: rank 0 appends each :class:`~mlrc.train.spec.EpochRecord` to
``<workdir>/validations.jsonl``; this process reads the file while the ranks train and hands the
new records to ``on_validation`` (from a reader thread), then the rest once they end.

Failures. A rank that raises records its exception (``<workdir>/rank<r>.error``); the agent sees
the process end, stops the others, and :func:`train_fold_ranks` raises the first recorded
exception as it was (a user error stays one line). A rank killed from outside (SIGKILL, the OOM
killer) or a rank lost otherwise is :class:`RankLost`, naming the rank and its signal or exit
code: the search records the trial as interrupted with that reason and retries it, resuming from
``last.pt`` on every rank.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import pickle
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from mlrc.train.spec import EpochRecord, FoldResult, FoldSpec

__all__ = ["TIMEOUT_S", "RankLost", "rank_devices", "train_fold_ranks"]

# Seconds a collective may wait for a rank that neither answers nor dies (a hung rank, a lost
# node); a rank that dies is seen by the launcher at once. It must outlast what rank 0 does
# alone while the others wait: scoring a validation with the exact k-NN. MLRC_DIST_TIMEOUT_S
# overrides it.
TIMEOUT_S = 600.0
EVENTS = "validations.jsonl"
POLL_S = 0.5  # how often the validations file is read while the ranks train (seconds)
# Ranks are forked from a forkserver that imported the trainer once (set_forkserver_preload):
# a fold's launch costs a fork, not K fresh interpreters importing torch (seconds each), and
# nothing is forked from this process's threads.
START_METHOD = "forkserver"
# A rank whose collective failed because a peer went away waits this long (seconds) before
# ending, so that the launcher, which reports the first rank it sees end, names the peer.
PEER_GRACE_S = 2.0
PRELOAD = ["mlrc.train.loop", "mlrc.train.launch"]


class RankLost(RuntimeError):
    """A rank of a K-process fold ended without an error of its own (killed, lost)."""


def rank_devices(device: str, procs: int, devices: Sequence[str] | None = None) -> list[str]:
    """The device of each of ``procs`` ranks: ``devices`` in order when given (it must name at
    least ``procs``), else ``cpu`` for every rank when ``device`` is the CPU, else ``cuda:0`` …
    ``cuda:K−1`` (``device`` ``cuda``; ``cuda:N``: from GPU N on). ``ValueError`` in one line
    when there are fewer devices than ranks, or a GPU that is not there."""
    if procs < 1:
        raise ValueError(f"processes per trial must be ≥ 1, got {procs}")
    if devices:
        if len(devices) < procs:
            raise ValueError(
                f"{procs} processes per trial need {procs} devices, but --devices names "
                f"{len(devices)} ({','.join(devices)})"
            )
        out = list(devices[:procs])
    elif torch.device(device).type == "cpu":
        return ["cpu"] * procs
    else:
        d = torch.device(device)
        first = d.index or 0
        out = [f"{d.type}:{first + r}" for r in range(procs)]
    cuda = [torch.device(d) for d in out if torch.device(d).type == "cuda"]
    if cuda and max(d.index or 0 for d in cuda) >= torch.cuda.device_count():
        raise ValueError(
            f"{procs} processes per trial need GPUs {', '.join(out)}, but this machine shows "
            f"{torch.cuda.device_count()} GPU(s)"
        )
    if len(set(out)) < len(out) and any(torch.device(d).type != "cpu" for d in out):
        raise ValueError(f"each rank needs its own GPU, got {', '.join(out)}")
    return out


def train_fold_ranks(
    spec: FoldSpec,
    devices: Sequence[str],
    threads: int,
    on_validation: Callable[[EpochRecord], None] | None = None,
) -> FoldResult:
    """Train (or resume) ``spec`` as ``len(devices)`` ranks, rank r on ``devices[r]`` with
    ``threads`` torch threads; see the module docstring. One device: the fold in this process."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from mlrc.train.loop import train_fold

    if len(devices) == 1:
        return train_fold(dataclasses.replace(spec, device=devices[0]), on_validation)
    spec.workdir.mkdir(parents=True, exist_ok=True)
    events = spec.workdir / EVENTS
    events.write_text("")
    for old in spec.workdir.glob("rank*.error"):
        old.unlink()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=len(devices),
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as torchrun --standalone
        max_restarts=0,
        monitor_interval=0.2,
        start_method=START_METHOD,
    )
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the forkserver first starts
    reader = _EventReader(events, on_validation)
    reader.start()
    try:
        out = elastic_launch(config, _rank_main)(spec, list(devices), threads, timeout_s())
    except ChildFailedError as e:
        raise _rank_error(spec.workdir, e, len(devices)) from None
    except SignalException as e:  # SIGINT/SIGTERM while the launcher held the handlers
        raise KeyboardInterrupt(str(e)) from None
    finally:
        reader.stop()
    return out[0]


def timeout_s() -> float:
    """The collectives' timeout (seconds): ``MLRC_DIST_TIMEOUT_S`` or :data:`TIMEOUT_S`."""
    return float(os.environ.get("MLRC_DIST_TIMEOUT_S", TIMEOUT_S))


class _EventReader:
    """Hands the records rank 0 appends to ``path`` to ``on_validation`` as they come."""

    def __init__(self, path: Path, on_validation: Callable[[EpochRecord], None] | None) -> None:
        self.path, self.on_validation, self.done = path, on_validation, 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="mlrc-validations", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        if self.on_validation is not None:
            self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(POLL_S):
            self.read()

    def read(self) -> None:
        """Pass on the complete lines not passed on yet (an error is kept for :meth:`stop`)."""
        lines = self.path.read_text().split("\n")[:-1]  # the last one may be half written
        for line in lines[self.done :]:
            self.done += 1
            try:
                self.on_validation(EpochRecord(**json.loads(line)))
            except BaseException as e:  # noqa: BLE001 — raised by stop(), in the caller
                self.error = self.error or e

    def stop(self) -> None:
        """Stop reading, pass on what is left, raise the first error ``on_validation`` raised."""
        if self.on_validation is None:
            return
        self.stopped.set()
        self.thread.join()
        self.read()
        if self.error is not None:
            raise self.error


def _rank_error(workdir: Path, e: Exception, world: int) -> BaseException:
    """The exception a failed launch stands for: the first one a rank raised of its own (not a
    collective failing because a peer went away), else :class:`RankLost` naming the rank that
    ended without an error — by a signal other than the launcher's SIGTERM to the survivors
    when there is one."""
    recorded = sorted(workdir.glob("rank*.error"), key=lambda p: p.stat().st_mtime)
    errors = {int(p.stem.removeprefix("rank")): _load_error(p) for p in recorded}
    own = [x for x in errors.values() if x is not None and not _peer_gone(x)]
    if own:
        return own[0]
    failures: dict[int, Any] = getattr(e, "failures", {}) or {}
    silent = sorted(
        (r for r in failures if r not in errors), key=lambda r: _by_launcher(failures[r])
    )
    if not silent:
        return RankLost(f"a rank of {world} ended without an error of its own (killed or lost)")
    f = failures[silent[0]]
    how = f"by {f.signal_name()}" if f.exitcode < 0 else f"with exit code {f.exitcode}"
    return RankLost(f"rank {silent[0]} of {world} ended {how}")


def _load_error(path: Path) -> BaseException | None:
    try:
        return pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 — unreadable: as if the rank recorded nothing
        return None


def _peer_gone(e: BaseException) -> bool:
    """Whether ``e`` is a collective failing because another rank went away (gloo's "Connection
    reset/closed by peer", a torch.distributed error) rather than this rank's own failure."""
    import torch.distributed as dist

    text = str(e)
    return isinstance(e, dist.DistError) or any(m in text for m in _PEER_GONE)


_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "gloo/transport")


def _by_launcher(failure: Any) -> bool:
    """Whether a rank ended by the SIGTERM the launcher sends to the survivors (sorted last)."""
    return failure.exitcode == -signal.SIGTERM


def _rank_main(
    spec: FoldSpec, devices: list[str], threads: int, timeout: float
) -> FoldResult | None:
    """One rank (run by the launcher, which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*): join
    the group, train the fold, leave; rank 0 returns the result."""
    import torch.distributed as dist

    from mlrc.train.loop import train_fold
    from mlrc.train.numerics import bind_device

    rank = int(os.environ["RANK"])
    device = devices[int(os.environ["LOCAL_RANK"])]
    spec = dataclasses.replace(spec, device=device, progress=spec.progress and rank == 0)
    torch.set_num_threads(max(1, threads))
    bind_device(device)
    cuda = torch.device(device).type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=timedelta(seconds=timeout),
        device_id=torch.device(device) if cuda else None,
    )
    events = spec.workdir / EVENTS
    try:
        res = train_fold(spec, on_validation=_appender(events) if rank == 0 else None)
    except BaseException as e:
        _record_error(spec.workdir / f"rank{rank}.error", e)
        if _peer_gone(e):  # let the launcher see the peer's end (its signal) before this one
            time.sleep(PEER_GRACE_S)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return res if rank == 0 else None


def _appender(path: Path) -> Callable[[EpochRecord], None]:
    """``on_validation`` of rank 0: one JSON line per record, flushed at once."""

    def append(rec: EpochRecord) -> None:
        with path.open("a") as f:
            f.write(json.dumps(dataclasses.asdict(rec)) + "\n")

    return append


def _record_error(path: Path, e: BaseException) -> None:
    """``e`` pickled to ``path`` for the launching process (as a RuntimeError with its one line
    if it cannot be pickled)."""
    try:
        data = pickle.dumps(e)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 — an exception that does not survive pickling
        data = pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
