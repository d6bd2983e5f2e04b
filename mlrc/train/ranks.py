"""What a rank of a K-process fold does, whichever launcher started it (torchrun's
``elastic_launch``: :mod:`mlrc.train.launch`; Ray Train's ``TorchTrainer``:
:mod:`mlrc.search.backends.ray_train`), and the files through which the ranks and the launching
process talk (all in the fold's ``workdir``):

- ``validations.jsonl``: rank 0 appends each :class:`~mlrc.train.spec.EpochRecord`; the
  launching process reads it while the ranks train (:class:`EventReader`) and hands each new
  record to its ``on_validation``;
- ``rank<r>.error``: the exception rank r raised, as JSON (its class and message; no pickle:
  the folder may be shared); :func:`ranks_error` turns a failed
  launch into the exception it stands for — a rank's own error as it was, or
  :class:`RankLost` naming the rank that ended without one (killed, lost) and how.

:func:`run_rank` is the body of a rank in a process group that the launcher set up.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mlrc.train.lost import RankLost
from mlrc.train.spec import EpochRecord, FoldResult, FoldSpec

__all__ = [
    "EVENTS",
    "PEER_GRACE_S",
    "EventReader",
    "RankLost",
    "clear_rank_files",
    "peer_gone",
    "ranks_error",
    "record_error",
    "run_rank",
    "write_json",
]

EVENTS = "validations.jsonl"
POLL_S = 0.5  # how often the validations file is read while the ranks train (seconds)
# A rank whose collective failed because a peer went away waits this long (seconds) before
# ending, so that the launcher, which reports the first rank it sees end, names the peer.
PEER_GRACE_S = 2.0


def clear_rank_files(workdir: Path) -> Path:
    """A fresh ``validations.jsonl`` and no ``rank*.error`` left from an earlier run; returns
    the validations file."""
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / EVENTS
    events.write_text("")
    for old in workdir.glob("rank*.error"):
        old.unlink()
    return events


def run_rank(spec: FoldSpec, rank: int, device: str, threads: int) -> FoldResult | None:
    """Train the fold as rank ``rank`` of the default process group (already initialised by
    the launcher) on ``device`` with ``threads`` torch threads: rank 0 reports validations to
    ``validations.jsonl`` and returns the result, the others return None. An exception is
    recorded in ``rank<r>.error`` and raised (after :data:`PEER_GRACE_S` when it is a
    collective failing because a peer went away)."""
    from mlrc.train.loop import train_fold

    spec = dataclasses.replace(spec, device=device, progress=spec.progress and rank == 0)
    torch.set_num_threads(max(1, threads))
    try:
        res = train_fold(spec, on_validation=appender(spec.workdir / EVENTS) if rank == 0 else None)
    except BaseException as e:
        record_error(spec.workdir / f"rank{rank}.error", e)
        if peer_gone(e):  # let the launcher see the peer's end (its signal) before this one
            time.sleep(PEER_GRACE_S)
        raise
    return res if rank == 0 else None


def appender(path: Path) -> Callable[[EpochRecord], None]:
    """``on_validation`` of rank 0: one JSON line per record, flushed at once."""

    def append(rec: EpochRecord) -> None:
        with path.open("a") as f:
            f.write(json.dumps(dataclasses.asdict(rec)) + "\n")

    return append


def record_error(path: Path, e: BaseException) -> None:
    """``e`` for the launching process, as JSON (its class's module and name, its message):
    never a pickle, which the launcher would have to unpickle from a shared folder."""
    cls = type(e)
    write_json(path, {"module": cls.__module__, "name": cls.__qualname__, "message": str(e)})


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON in ``path``, atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def rebuilt_error(record: dict[str, Any]) -> BaseException:
    """The exception :func:`record_error` recorded: its own class when that is a built-in or an
    mlrc exception built from its message (a user error stays one line, KeyboardInterrupt stays
    an interrupt), else a RuntimeError ``Name: message``."""
    module, name, message = record["module"], record["name"], record["message"]
    cls = None
    if module == "builtins":
        cls = getattr(builtins, name, None)
    elif module == "mlrc" or module.startswith("mlrc."):
        cls = getattr(importlib.import_module(module), name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001, S110 — a class that takes other arguments: below
            pass
    return RuntimeError(f"{name.rsplit('.', 1)[-1]}: {message}")


class EventReader:
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


def ranks_error(workdir: Path, failures: dict[int, Any], world: int) -> BaseException:
    """The exception a failed launch stands for: the first one a rank raised of its own (not a
    collective failing because a peer went away), else :class:`RankLost` naming the rank that
    ended without an error — by a signal other than the launcher's SIGTERM to the survivors
    when there is one."""
    recorded = sorted(workdir.glob("rank*.error"), key=lambda p: p.stat().st_mtime)
    errors = {int(p.stem.removeprefix("rank")): load_error(p) for p in recorded}
    own = [x for x in errors.values() if x is not None and not peer_gone(x)]
    if own:
        return own[0]
    silent = sorted(
        (r for r in failures if r not in errors), key=lambda r: by_launcher(failures[r])
    )
    if not silent:
        return RankLost(f"a rank of {world} ended without an error of its own (killed or lost)")
    f = failures[silent[0]]
    how = f"by {f.signal_name()}" if f.exitcode < 0 else f"with exit code {f.exitcode}"
    return RankLost(f"rank {silent[0]} of {world} ended {how}")


def load_error(path: Path) -> BaseException | None:
    try:
        return rebuilt_error(json.loads(path.read_text()))
    except Exception:  # noqa: BLE001 — unreadable: as if the rank recorded nothing
        return None


def peer_gone(e: BaseException) -> bool:
    """Whether ``e`` is a collective failing because another rank went away (gloo's "Connection
    reset/closed by peer", a torch.distributed error) rather than this rank's own failure."""
    import torch.distributed as dist

    text = str(e)
    return isinstance(e, dist.DistError) or any(m in text for m in _PEER_GONE)


_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "gloo/transport")


def by_launcher(failure: Any) -> bool:
    """Whether a rank ended by the SIGTERM the launcher sends to the survivors (sorted last)."""
    return failure.exitcode == -signal.SIGTERM
