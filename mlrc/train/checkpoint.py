"""A fold's checkpoints in its workdir, written all or nothing.

- ``last.pt``: everything needed to resume (models, optimisers, sampler and torch RNG states,
  epoch, best so far, history), written after epoch 0, every validation epoch, at the end, and
  after any other epoch once the preset's ``checkpoint_minutes`` have passed since the last
  write; it holds only tensors and plain Python values and is loaded with ``weights_only=True``;
- ``best.pt``: trunk + embedder weights at the best validation MAP@R.

Writes leave the training thread (:class:`CheckpointWriter`): the state is copied off the device
(:func:`snapshot`) and one background thread writes the copies, in the order they were taken.

Every file is written to a temp file, fsynced and renamed (a kill leaves the previous version; a
full disk raises a one-line :class:`CheckpointError` and removes the temp file). A new best model
is first written as ``best.pending-e<epoch>.pt`` (:func:`save_pending_best`) and becomes
``best.pt`` only after ``last.pt`` has recorded that epoch as best (:func:`commit_best`), so
``best.pt`` always holds the model of the best epoch that ``last.pt`` (and hence the store) knows.
The writer runs pending best → ``last.pt`` → commit as one job, so this order holds there too.
"""

from __future__ import annotations

import copy as copy_module
import errno
import logging
import os
import socket
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlrc.errors import alive, first_line
from mlrc.train.spec import EpochRecord, FoldResult, trained_best

log = logging.getLogger("mlrc")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written (disk full, file too large) or read back; one line."""


class _RecordingWriter:
    """The file object handed to ``torch.save``: keeps the first ``OSError`` of a write, which
    torch reports only as an opaque RuntimeError ("unexpected pos ...")."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, b: bytes) -> int:
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _temp_path(path: Path) -> Path:
    """The temp file of one writer: host and pid, so stale ones can be told from live ones."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def atomic_save(obj: Any, path: Path) -> None:
    """Write ``obj`` to ``path`` all or nothing: temp file, fsync, rename, fsync of the folder.
    On a failed write the temp file is removed and ``path`` keeps its previous content. The
    folder is created if it is gone (a worker declared lost and still finishing the same fold
    cleans it up as its retry trains there)."""
    tmp, writer = _temp_path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            writer = _RecordingWriter(f)
            torch.save(obj, writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # also Ctrl-C mid-write: never leave a temp file behind
        tmp.unlink(missing_ok=True)
        err = writer.error if writer is not None and writer.error is not None else e
        if isinstance(err, OSError):
            what = "disk full / file too large writing" if err.errno in FULL else "cannot write"
            raise CheckpointError(f"{what} {path} ({err.strerror or err})") from None
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (a no-op where directories cannot be fsynced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(folder: Path) -> None:
    """Temp files of this host's dead processes (killed mid-write) in ``folder``; also this
    process's own, which are from before: it is not writing them now."""
    host = socket.gethostname()
    for tmp in folder.glob(".*.tmp-*"):
        rest, _, pid = tmp.name.rpartition("-")
        if not (rest.endswith(f".tmp-{host}") and pid.isdigit()):
            continue
        if int(pid) == os.getpid() or not alive(int(pid)):
            tmp.unlink(missing_ok=True)


def plain(obj: Any) -> Any:
    """``obj`` with numpy scalars and arrays as Python numbers and tensors, and subclasses of
    ``str`` (``torch.__version__`` is one) as ``str``: what ``weights_only`` loading accepts."""
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj] if isinstance(obj, list) else tuple(map(plain, obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


def pending_best(best_path: Path, epoch: int) -> Path:
    """Where the best model of ``epoch`` waits until ``last.pt`` records it:
    ``best.pending-e<epoch>.pt``."""
    return best_path.with_name(f"{best_path.stem}.pending-e{epoch}{best_path.suffix}")


def save_pending_best(weights: dict[str, torch.Tensor], best_path: Path, epoch: int) -> None:
    """Write the model weights of a new best ``epoch`` to its pending file (atomically)."""
    atomic_save(weights, pending_best(best_path, epoch))


def commit_best(best_path: Path, best_epoch: int | None) -> None:
    """``best.pending-e<best_epoch>.pt`` → ``best.pt``, once ``last.pt`` records that epoch."""
    pending = pending_best(best_path, best_epoch) if best_epoch is not None else None
    if pending is not None and pending.is_file():
        os.replace(pending, best_path)
        _fsync_dir(best_path.parent)


def resume_state(last: Path, best_path: Path) -> dict[str, Any] | None:
    """The state saved in ``last.pt`` (``None``: train from scratch), with ``best.pt`` made to
    agree with it: a pending best model that ``last.pt`` records is committed, one it does not
    (killed before ``last.pt`` was written) is dropped; a state whose ``best.pt`` is gone is
    discarded (the fold is trained again, with the same seed)."""
    remove_stale_temps(last.parent)
    state = load_checkpoint(last) if last.is_file() else None
    best_epoch = state["best_epoch"] if state is not None else None
    commit_best(best_path, best_epoch)
    for pending in last.parent.glob(f"{best_path.stem}.pending-e*{best_path.suffix}"):
        pending.unlink(missing_ok=True)
    if state is not None and state["best"] is not None and not best_path.is_file():
        log.warning("%s is missing: training %s again from the start", best_path, last.parent)
        return None
    return state


def load_checkpoint(path: Path) -> dict[str, Any]:
    """``last.pt`` as saved (``weights_only``); an unreadable file raises one line naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — any unreadable file: one line naming it
        first = first_line(e)[:160]
        raise CheckpointError(
            f"cannot resume from {path} ({first}); delete it to train this fold again"
        ) from None


def adopted(state: dict[str, Any]) -> FoldResult:
    """The finished result recorded in ``last.pt`` (older files lack objective and provenance:
    the objective is recomputed from the history, the provenance stays unknown)."""
    history = [EpochRecord(**h) for h in state["history"]]
    res = FoldResult(**{**state["result"], "history": history})
    if res.objective is None:
        res.objective = trained_best(history)
    return res


def set_aside(workdir: Path, recorded: dict[str, Any], wanted: dict[str, Any]) -> None:
    """A fold folder whose checkpoint was computed under another configuration is moved to
    ``<folder>.other-K`` (never adopted, never deleted) and the fold is trained again."""
    diff = next(
        (k for k in sorted(set(recorded) | set(wanted)) if recorded.get(k) != wanted.get(k)), "?"
    )
    aside = next(
        workdir.with_name(f"{workdir.name}.other-{k}")
        for k in range(1, 10_000)
        if not workdir.with_name(f"{workdir.name}.other-{k}").exists()
    )
    os.replace(workdir, aside)
    log.warning(
        "%s was computed under another configuration (%s: %r there, %r now): moved to %s, "
        "training this fold again",
        workdir,
        diff,
        recorded.get(diff),
        wanted.get(diff),
        aside.name,
    )


def snapshot(obj: Any) -> tuple[Any, torch.cuda.Event | None]:
    """A copy of ``obj`` (nested dicts, lists, tuples of tensors and plain values) that training
    can no longer change: every tensor copied to CPU memory (cloned when already there), plain
    values as they are. Copies from a CUDA device are queued on the current stream into pinned
    memory without waiting; the returned event (``None`` when nothing came from CUDA) marks their
    end, and whoever reads the copy waits for it first (:class:`CheckpointWriter` does)."""
    from_cuda = [False]

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.device.type == "cuda":
                from_cuda[0] = True
                return x.detach().to("cpu", non_blocking=True)  # pinned, asynchronous
            return x.detach().to("cpu", copy=True)
        if isinstance(x, np.ndarray):
            return x.copy()
        if isinstance(x, dict):
            items = ((k, copy(v)) for k, v in x.items())
            out = OrderedDict(items) if isinstance(x, OrderedDict) else dict(items)
            if hasattr(x, "_metadata"):  # a state_dict's module versions, as torch.save keeps
                out._metadata = copy_module.deepcopy(x._metadata)
            return out
        if isinstance(x, list | tuple):
            return [copy(v) for v in x] if isinstance(x, list) else tuple(map(copy, x))
        return x

    out = copy(obj)
    event = None
    if from_cuda[0]:
        event = torch.cuda.Event()
        event.record()
    return out, event


class CheckpointWriter:
    """One background thread that writes checkpoints in the order they are handed to it.

    :meth:`save` first waits for the previous write (so at most one snapshot is in memory and
    the disk never falls behind by more than one write), then takes the snapshot in the calling
    thread and queues the write. A write that failed raises its error (a one-line
    :class:`CheckpointError` for a full disk) in the calling thread at the next :meth:`save` or
    :meth:`wait` — never lost. :meth:`close` waits and stops the thread.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None

    def save(self, state: Any, write: Callable[[Any], None]) -> None:
        """Snapshot ``state`` now (:func:`snapshot`) and run ``write(copy)`` in the background."""
        self.wait()
        copy, event = snapshot(state)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlrc-checkpoint")
        self._last = self._pool.submit(_after, event, write, copy)

    def wait(self) -> None:
        """Block until the queued write is on disk; raise its error if it failed."""
        last, self._last = self._last, None
        if last is not None:
            last.result()

    def close(self, *, raise_error: bool = True) -> None:
        """Wait for the queued write and stop the thread; ``raise_error=False`` (the caller is
        already failing) logs a failed write instead of raising it."""
        try:
            self.wait()
        except Exception as e:
            if raise_error:
                raise
            log.warning("checkpoint write failed: %s", first_line(e))
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def _after(event: torch.cuda.Event | None, write: Callable[[Any], None], copy: Any) -> None:
    """The writer thread's job: wait for the device copies, then write."""
    if event is not None:
        event.synchronize()
    write(copy)
