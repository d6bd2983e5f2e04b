"""One fold as K processes of ``torch.distributed``, started by torchrun's own launcher.

:func:`train_fold_ranks` runs :func:`~mlrc.train.loop.train_fold` in K processes through
``torch.distributed.launcher.api.elastic_launch`` — the library behind ``torchrun`` — on this
node (rendezvous ``c10d`` on a free local port, no restart: a retry is the search's business).
Each rank joins the default process group (NCCL on CUDA devices, gloo on the CPU, with a bounded
timeout: :data:`TIMEOUT_S`, not the 30-minute default), takes its device
(:func:`rank_devices`) and a share of the fold's threads, and trains its slice of every global
batch (:mod:`mlrc.train.distributed`); rank 0 alone writes ``last.pt``/``best.pt`` and reports
validations. The result comes back from rank 0.

Live validations and failures go through the files of :mod:`mlrc.train.ranks`: this process
hands rank 0's validations to ``on_validation`` as they come; a rank that raises has its own
exception raised here as it was (a user error stays one line); a rank killed from outside
(SIGKILL, the OOM killer) is :class:`~mlrc.train.ranks.RankLost`, naming the rank and its signal:
the search records the trial as interrupted with that reason and retries it, resuming from
``last.pt`` on every rank.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch

from mlrc.train.ranks import EventReader, RankLost, clear_rank_files, ranks_error, run_rank
from mlrc.train.spec import EpochRecord, FoldResult, FoldSpec

__all__ = ["TIMEOUT_S", "RankLost", "rank_devices", "train_fold_ranks"]

# Seconds a collective may wait for a rank that neither answers nor dies (a hung rank, a lost
# node); a rank that dies is seen by the launcher at once. It must outlast what rank 0 does
# alone while the others wait: scoring a validation with the exact k-NN. MLRC_DIST_TIMEOUT_S
# overrides it.
TIMEOUT_S = 600.0
# Ranks are forked from a forkserver that imported the trainer once (set_forkserver_preload):
# a fold's launch costs a fork, not K fresh interpreters importing torch (seconds each), and
# nothing is forked from this process's threads.
START_METHOD = "forkserver"
PRELOAD = ["mlrc.train.loop", "mlrc.train.launch"]


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
    if len(set(out)) < len(out) and any(torch.device(d).type != "cpu" for d in out):
        raise ValueError(f"each rank needs its own GPU, got {', '.join(out)}")
    cuda = [torch.device(d) for d in out if torch.device(d).type == "cuda"]
    if cuda and max(d.index or 0 for d in cuda) >= torch.cuda.device_count():
        raise ValueError(
            f"{procs} processes per trial need GPUs {', '.join(out)}, but this machine shows "
            f"{torch.cuda.device_count()} GPU(s)"
        )
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
    events = clear_rank_files(spec.workdir)
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
    reader = EventReader(events, on_validation)
    reader.start()
    try:
        out = elastic_launch(config, _rank_main)(spec, list(devices), threads, timeout_s())
    except ChildFailedError as e:
        raise ranks_error(spec.workdir, e.failures, len(devices)) from None
    except SignalException as e:  # SIGINT/SIGTERM while the launcher held the handlers
        stop = KeyboardInterrupt(str(e))
        stop.signum = int(e.sigval)  # which one, for the command's line and exit code
        raise stop from None
    finally:
        reader.stop()
    return out[0]


def timeout_s() -> float:
    """The collectives' timeout (seconds): ``MLRC_DIST_TIMEOUT_S`` or :data:`TIMEOUT_S`."""
    return float(os.environ.get("MLRC_DIST_TIMEOUT_S", TIMEOUT_S))


def _rank_main(
    spec: FoldSpec, devices: list[str], threads: int, timeout: float
) -> FoldResult | None:
    """One rank (run by the launcher, which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*): join
    the group, train the fold (:func:`~mlrc.train.ranks.run_rank`), leave; rank 0 returns the
    result."""
    import torch.distributed as dist

    from mlrc.train.numerics import bind_device

    rank = int(os.environ["RANK"])
    device = devices[int(os.environ["LOCAL_RANK"])]
    bind_device(device)
    cuda = torch.device(device).type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=timedelta(seconds=timeout),
        device_id=torch.device(device) if cuda else None,
    )
    try:
        return run_rank(spec, rank, device, threads)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
