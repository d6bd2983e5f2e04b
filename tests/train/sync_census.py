"""Host syncs counted by name and by origin (issue #39): a ``TorchDispatchMode`` that notes every
ATen operation that makes the host wait for a GPU, and who called it.

Shared by tests/train/test_sync_census.py (every registered loss, miner and strategy, one
training step on the CPU) and tests/train/test_gpu.py (a reference fold's step on CUDA).

An operation syncs when its output's size or value must reach the host: ``nonzero`` (also
``torch.where(cond)`` and ``argwhere``), ``_local_scalar_dense`` (``.item()``, ``bool()``,
``int()``), ``masked_select``, indexing with a boolean mask (``index``/``index_put_``),
``unique``, ``repeat_interleave`` without ``output_size``, ``bincount``, ``equal``; on a GPU
also a copy to the host (``_to_copy``/``copy_`` to ``cpu``), which the CPU cannot see.

The origin is the innermost Python frame outside torch's own call machinery: ``mlrc``, a
library's distribution name (``pytorch_metric_learning``), ``torch.optim`` (inside an
optimiser's step), ``autograd`` (the backward pass of an operation), or ``torch``.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ALWAYS = {
    "nonzero",
    "argwhere",
    "_local_scalar_dense",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "bincount",
    "equal",
}
GLUE = (  # torch's own call machinery: never an origin
    "torch/utils/_python_dispatch.py",
    "torch/_ops.py",
    "torch/overrides.py",
    "torch/_tensor.py",
    "torch/functional.py",
    "torch/nn/functional.py",
    "torch/nn/modules/module.py",
    "torch/_jit_internal.py",
    "torch/utils/_contextlib.py",
    "torch/_compile.py",
    "torch/_dynamo/",
    "torch/amp/",
    "torch/autograd/grad_mode.py",
)
HERE = str(Path(__file__).resolve())


def sync_name(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The sync this call makes (the operation's name, with why where it depends on its
    arguments), or None."""
    name = func.__name__.split(".")[0]
    if name in ALWAYS:
        return name
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return f"{name} (boolean mask)"
    no_size = kwargs.get("output_size") is None
    if name == "repeat_interleave" and func._overloadname == "Tensor" and no_size:
        return "repeat_interleave (no output_size)"
    if name in ("_to_copy", "copy_"):
        src = args[1] if name == "copy_" else args[0]
        dst = kwargs.get("device") if name == "_to_copy" else args[0].device
        if src.device.type == "cuda" and dst is not None and torch.device(dst).type == "cpu":
            return f"{name} (to the host)"
    return None


def origin() -> tuple[str, str]:
    """(who, where): the package that made the call, and its file:line. An operation with no
    Python caller runs in autograd's device thread (a CUDA backward pass): ``autograd``."""
    try:
        frame = sys._getframe(2)
    except ValueError:  # the stack is shallower: no Python frame called it
        return "autograd", "backward (device thread)"
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if path != HERE and not any(g in path for g in GLUE):
            return classify(path), f"{short(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "autograd", "backward (device thread)"


def classify(path: str) -> str:
    if "/torch/optim/" in path:
        return "torch.optim"
    if "/torch/autograd/" in path:
        return "autograd"
    if "/mlrc/" in path and "site-packages" not in path:
        return "mlrc"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    if "/tests/" in path or "/bench/" in path:
        return "test"
    return "other"


def short(path: str) -> str:
    """A path from its package on: ``pytorch_metric_learning/losses/x.py``, ``mlrc/...``."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    for root in ("/mlrc/", "/tests/", "/bench/"):
        if root in path:
            return root.strip("/") + "/" + path.rsplit(root, 1)[1]
    return path


class SyncCensus(TorchDispatchMode):
    """Counts the host syncs of the operations run under it: ``counts[(op, who, where)]``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = sync_name(func, args, kwargs)
        if name is not None:
            who, where = origin()
            self.counts[(name, who, where)] += 1
        return func(*args, **kwargs)

    def by_origin(self, who: str) -> Counter[tuple[str, str, str]]:
        return Counter({k: n for k, n in self.counts.items() if k[1] == who})

    def summary(self) -> str:
        """``op ×n (who, where)`` for each sync, most frequent first."""
        return "; ".join(f"{op} ×{n} ({who}, {where})" for (op, who, where), n in
                         self.counts.most_common()) or "none"  # fmt: skip


# --- the census: every registered loss, miner and strategy -----------------------------------


def components() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, loss, FoldSpec fields) for every built-in loss (the plain step), miner and
    strategy (each with the contrastive loss, which every strategy accepts)."""
    from mlrc.methods import losses, miners, strategies

    def builtin(names: list[str]) -> list[str]:
        return [n for n in names if not n.startswith(("test_", "bench_"))]

    out = [(f"loss `{n}`", n, {}) for n in builtin(losses.available())]
    out += [(f"miner `{n}`", "contrastive", {"miner": n}) for n in builtin(miners.available())]
    out += [
        (f"strategy `{n}`", "contrastive", {"strategy": n}) for n in builtin(strategies.available())
    ]
    return out


def step_census(ds: Any, workdir: Path, loss: str, **spec: Any) -> SyncCensus:
    """One training step (loss, backward, optimiser steps, the loss tally) of a tiny fold on
    the CPU, counted; the fold must complete."""
    from conftest import train_tiny_fold

    from mlrc.train import loop

    census = SyncCensus()
    saved = {n: getattr(loop, n) for n in ("calculate_loss", "step_optimizers")}
    saved_add = loop.LossTally.add

    def counted(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with census:
                return fn(*args, **kwargs)

        return run

    for name, fn in saved.items():
        setattr(loop, name, counted(fn))
    loop.LossTally.add = counted(saved_add)
    try:
        res = train_tiny_fold(ds, workdir, loss, iterations=1, **spec)
    finally:
        for name, fn in saved.items():
            setattr(loop, name, fn)
        loop.LossTally.add = saved_add
    assert res.status == "complete", res.reason
    return census


def place(who: str, where: str) -> str:
    """Where a sync comes from, short: ``PML losses/x.py:12``, ``mlrc methods/…``, backward."""
    if who == "autograd":
        return "backward"
    pkg, _, rest = where.partition("/")
    return f"{'PML' if pkg == 'pytorch_metric_learning' else pkg} {rest}"


def cell(census: SyncCensus) -> str:
    """The syncs of one step: ``op ×n (where, …)`` grouped by operation."""
    ops: dict[str, list[str]] = {}
    for (op, who, where), n in sorted(census.counts.items()):
        ops.setdefault(op, []).extend([place(who, where)] * n)
    parts = []
    for op, places in ops.items():
        name, _, why = op.partition(" ")
        uniq = compress(list(dict.fromkeys(places)))
        parts.append(f"`{name}`{' ' + why if why else ''} ×{len(places)} ({uniq})")
    return "; ".join(parts) or "none"


def compress(places: list[str]) -> str:
    """``PML a.py:50, PML a.py:51, backward`` → ``PML a.py:50,51, backward``."""
    lines: dict[str, list[str]] = {}
    for p in places:
        file, colon, line = p.rpartition(":")
        key = file if colon else p
        lines.setdefault(key, [])
        if colon:
            lines[key].append(line)
    return ", ".join(f"{f}:{','.join(n)}" if n else f for f, n in lines.items())


def table(results: list[tuple[str, SyncCensus]]) -> str:
    """The census as the markdown table of docs/guide/performance.md."""
    lines = [
        "| component (one step) | host syncs | of mlrc's own | operations (where) |",
        "| --- | --- | --- | --- |",
    ]
    for label, census in results:
        total, own = sum(census.counts.values()), sum(census.by_origin("mlrc").values())
        lines.append(f"| {label} | {total} | {own} | {cell(census)} |")
    return "\n".join(lines)


if __name__ == "__main__":  # prints the table: python tests/train/sync_census.py
    import tempfile

    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    from mlrc import data

    glyphs = data.build("glyphs")
    got = []
    for label, loss, spec in components():
        with tempfile.TemporaryDirectory() as d:
            got.append((label, step_census(glyphs, Path(d), loss, **spec)))
            print(label, sum(got[-1][1].counts.values()), file=sys.stderr)
    print(table(got))
