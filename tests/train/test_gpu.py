"""GPU-only checks of the fold path (issue #22): no host sync in the training step, CUDA
determinism, device binding. Every test here skips, saying why, where torch sees no CUDA
device — also in CI, which has no GPU (a missing GPU is not a missing part: MLRC_REQUIRE_ALL
does not turn these skips into failures). ``bench/gpu_check.sh`` runs them on a GPU machine.

Each fold is the ``reference`` preset with random trunk weights (``pretrained: false``) on
generated CUB-sized JPEGs, a few iterations at the preset's batch (32) and crop (227 px).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="GPU-only: torch sees no CUDA device here"
    ),
]

OVERRIDES: dict[str, Any] = {
    "pretrained": False,
    "iterations_per_epoch": 4,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "num_workers": 2,
}

# One script for the subprocess tests: on the images of write_images, optionally binds the
# device first (as `mlrc worker` / `study run` do), trains `runs` folds, prints one JSON line:
# the histories, its pid and GPU 0's used memory before and after (NVML; None without pynvml);
# with "hold" it then waits for a line on stdin (so that the parent can look at it alive).
FOLD_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    from pathlib import Path

    args = json.loads(sys.argv[1])

    def gpu0_used():
        try:
            import pynvml
            pynvml.nvmlInit()
            return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
        except Exception:
            return None

    before = gpu0_used()
    if args["bind"]:
        from mlrc.train.numerics import bind_device
        bind_device(args["device"])
    import mlrc.config, mlrc.data
    from mlrc.train import FoldSpec, train_fold

    root = Path(args["root"])
    ds = mlrc.data.build("image_folder", root=root)
    preset = mlrc.config.load_preset("reference", args["overrides"])
    histories = []
    for run in range(args["runs"]):
        spec = FoldSpec(ds, ds.name, list(range(10)), [10, 11], "contrastive", {}, None, preset,
                        0, root.parent / f"work-{run}", device=args["device"], progress=False)
        res = train_fold(spec)
        assert res.status == "complete", res.reason
        histories.append([dataclasses.asdict(h) for h in res.history])
    print(json.dumps({"histories": histories, "pid": os.getpid(), "gpu0_used": [before, gpu0_used()]}), flush=True)
    if args["hold"]:
        sys.stdin.readline()
    """
)


def write_images(root: Path) -> Path:
    """12 classes × 6 CUB-sized JPEGs (smooth random colours, quality 90) under ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(12):
        (root / f"c{c:02d}").mkdir(parents=True)
        for i in range(6):
            w, h = [(500, 375), (375, 500), (500, 333)][(c + i) % 3]
            pixels = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
            image = Image.fromarray(pixels).resize((w, h), Image.BICUBIC)
            image.save(root / f"c{c:02d}" / f"{i}.jpg", quality=90)
    return root


def fold_process(
    tmp: Path, device: str, overrides: dict, runs: int = 1, bind: bool = False, hold: bool = False
) -> subprocess.Popen:
    """A fresh Python process running :data:`FOLD_SCRIPT` (its own CUDA state)."""
    write_images(tmp / "images")
    args = {
        "root": str(tmp / "images"),
        "device": device,
        "overrides": overrides,
        "runs": runs,
        "bind": bind,
        "hold": hold,
    }
    env = {**os.environ, "MLRC_CACHE": str(tmp / "cache")}
    return subprocess.Popen(
        [sys.executable, "-c", FOLD_SCRIPT, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result_of(proc: subprocess.Popen) -> dict:
    """The JSON line a :func:`fold_process` prints (or its stderr as the failure)."""
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=60)
        pytest.fail(f"fold process exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
    return json.loads(line)


def fold_in_this_process(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """One reference-shaped fold on cuda in this process."""
    write_images(tmp / "images")
    monkeypatch.setenv("MLRC_CACHE", str(tmp / "cache"))
    import mlrc.data
    from mlrc.config import load_preset
    from mlrc.train import FoldSpec, train_fold

    ds = mlrc.data.build("image_folder", root=tmp / "images")
    preset = load_preset("reference", OVERRIDES)
    spec = FoldSpec(
        ds, ds.name, list(range(10)), [10, 11], "contrastive", {}, None, preset, 0,
        tmp / "work-cuda", device="cuda", progress=False,
    )  # fmt: skip
    return train_fold(spec)


def counted(fn: Callable, calls: list[str], census: Any, seen: list) -> Callable:
    """``fn`` run under the sync census (tests/train/sync_census.py) and
    ``torch.cuda.set_sync_debug_mode("warn")``, whose warnings go to ``seen``; each call is
    noted in ``calls``."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        calls.append(fn.__name__)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught, census:
                warnings.simplefilter("always")
                return fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            seen.extend(w for w in caught if "synchroniz" in str(w.message))

    return guarded


def test_the_training_step_never_waits_for_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loss, backward, optimiser steps and the loss tally of a reference fold on cuda make no
    host sync of mlrc's own: none counted by the census with mlrc as its origin, and none that
    CUDA's sync debug mode reports from an mlrc line. The libraries' syncs (the contrastive
    loss's ``torch.where`` in pytorch-metric-learning) are named in a warning, not failed on:
    docs/guide/performance.md counts them. Reading the losses once per epoch, the validation
    and the checkpoints are outside the step."""
    from sync_census import SyncCensus, classify

    from mlrc.train import loop

    calls: list[str] = []
    census, seen = SyncCensus(), []
    for name in ("calculate_loss", "step_optimizers"):
        assert hasattr(loop, name), f"mlrc.train.loop.{name} is gone: guard its successor"
        monkeypatch.setattr(loop, name, counted(getattr(loop, name), calls, census, seen))
    assert hasattr(loop, "LossTally"), "mlrc.train.loop.LossTally is gone: guard its successor"
    monkeypatch.setattr(loop.LossTally, "add", counted(loop.LossTally.add, calls, census, seen))
    res = fold_in_this_process(tmp_path, monkeypatch)
    assert res.status == "complete", res.reason
    steps = OVERRIDES["iterations_per_epoch"] * OVERRIDES["max_epochs"]
    assert calls.count("calculate_loss") == steps and calls.count("step_optimizers") == steps
    assert calls.count("add") == steps
    assert not census.by_origin("mlrc"), f"mlrc syncs the host: {census.summary()}"
    ours = [f"{w.filename}:{w.lineno}" for w in seen if classify(w.filename) == "mlrc"]
    assert not ours, f"CUDA's sync debug mode saw mlrc sync the host at {ours}"
    if census.counts or seen:
        places = sorted({f"{w.filename}:{w.lineno}" for w in seen})
        warnings.warn(
            f"library host syncs in {steps} reference steps: {census.summary()}; "
            f"sync debug mode: {len(seen)} at {places[:6]}",
            stacklevel=1,
        )


def test_deterministic_folds_on_cuda_give_identical_histories(tmp_path: Path) -> None:
    """Two folds with ``deterministic: true`` in one fresh process (CUBLAS_WORKSPACE_CONFIG is
    read at the first cuBLAS call) give the same validation history, bit for bit."""
    proc = fold_process(tmp_path, "cuda", {**OVERRIDES, "deterministic": True}, runs=2)
    got = result_of(proc)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    first, second = got["histories"]
    assert len(first) == OVERRIDES["max_epochs"] + 1  # epoch 0 and each trained epoch
    assert first == second


def gpu_uuids() -> list[str]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.split()


def compute_apps() -> dict[int, set[str]]:
    """pid → UUIDs of the GPUs on which it holds a context, as nvidia-smi sees them."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    apps: dict[int, set[str]] = {}
    for line in out.stdout.splitlines():
        pid, _, uuid = line.partition(",")
        if pid.strip().isdigit():
            apps.setdefault(int(pid), set()).add(uuid.strip())
    return apps


def test_a_worker_on_cuda_1_opens_no_context_on_gpu_0(tmp_path: Path) -> None:
    """A process bound to cuda:1 (mlrc.train.numerics.bind_device, as ``mlrc worker`` and
    ``study run`` do) trains a fold with pinned memory and loader workers: GPU 0 holds no
    context of it. Checked with nvidia-smi's compute apps where it shows this machine's pids,
    else by GPU 0's used memory before and after (a context costs hundreds of MB)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    proc = fold_process(tmp_path, "cuda:1", OVERRIDES, bind=True, hold=True)
    try:
        got = result_of(proc)
        apps = compute_apps() if shutil.which("nvidia-smi") else {}
        uuids = gpu_uuids() if shutil.which("nvidia-smi") else []
    finally:
        proc.communicate("\n", timeout=120)
    assert proc.returncode == 0, proc.stderr
    if got["pid"] in apps:  # nvidia-smi sees our pid namespace
        assert apps[got["pid"]] == {uuids[1]}, (apps[got["pid"]], uuids)
        return
    before, after = got["gpu0_used"]
    if before is None:
        pytest.skip("nvidia-smi does not show this process and pynvml is absent: cannot tell")
    assert after - before < 150 * 2**20, f"GPU 0 used {(after - before) / 2**20:.0f} MiB more"


def _preset(**over: Any):
    from mlrc.config import load_preset

    return load_preset("reference", {**OVERRIDES, **over})


@pytest.mark.parametrize("tf32", [False, True])
def test_tf32_setting_decides_the_precision_of_fp32_convolutions_and_matmuls(tf32: bool) -> None:
    """apply_numerics with tf32: false gives IEEE fp32 (error vs float64 ~1e-6 relative); with
    tf32: true on Ampere or later, TF32's 10-bit mantissa (~1e-3). The reference: float64."""
    from mlrc.train.numerics import apply_numerics

    if tf32 and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("TF32 needs an Ampere or later GPU")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        apply_numerics(_preset(tf32=tf32), "cuda:0")
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(512, 512, device="cuda", generator=g)
        b = torch.randn(512, 512, device="cuda", generator=g)
        x = torch.randn(8, 64, 32, 32, device="cuda", generator=g)
        w = torch.randn(64, 64, 3, 3, device="cuda", generator=g)
        mm = ((a @ b).double() - a.double() @ b.double()).abs().max() / (
            a.double() @ b.double()
        ).abs().max()
        conv = torch.nn.functional.conv2d(x, w, padding=1)
        ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        cv = (conv.double() - ref).abs().max() / ref.abs().max()
        if tf32:
            assert mm > 1e-5 and cv > 1e-5, (mm, cv)
        else:
            assert mm < 1e-5 and cv < 1e-5, (mm, cv)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_provenance_names_this_gpu_and_its_versions() -> None:
    """provenance("cuda:0") against torch's own getters and nvidia-smi's driver version."""
    from mlrc.train.numerics import cudnn_text, provenance

    p = provenance("cuda:0")
    assert p["device_name"] == torch.cuda.get_device_name(0)
    assert p["cuda"] == torch.version.cuda
    assert p["cudnn"] == cudnn_text(torch.backends.cudnn.version())
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert p["driver"] == out
    json.dumps(p)  # JSON-able, as the store keeps it


def test_a_checkpoint_snapshot_of_cuda_state_is_a_pinned_copy_taken_at_that_moment() -> None:
    """snapshot() queues device → pinned-host copies and returns the event that ends them; the
    copy holds the values of the moment it was taken, whatever training does after."""
    from mlrc.train.checkpoint import snapshot

    w = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    expected = w.cpu()
    copy, event = snapshot({"model": {"w": w}, "epoch": 3})
    w.add_(1.0)  # the next step, queued after the copy on the same stream
    assert event is not None
    event.synchronize()
    assert copy["model"]["w"].device.type == "cpu" and copy["model"]["w"].is_pinned()
    assert torch.equal(copy["model"]["w"], expected) and copy["epoch"] == 3


def test_metrics_on_cuda_equal_the_cpu_path_with_reduced_matmul_precision_outside() -> None:
    """The exact k-NN forces full fp32 locally: with the process at "high" (TF32) precision,
    CUDA metrics of clustered embeddings equal the numpy path's bit for bit."""
    import numpy as np

    from mlrc.protocol import retrieval_metrics

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(50, 64))
    labels = np.repeat(np.arange(50), 40)
    emb = (centres[labels] + 3.0 * rng.normal(size=(2000, 64))).astype(np.float32)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        on_gpu = retrieval_metrics(torch.from_numpy(emb).cuda(), torch.from_numpy(labels))
        assert torch.get_float32_matmul_precision() == "high"  # the caller's setting restored
    finally:
        torch.set_float32_matmul_precision(saved)
    assert on_gpu == retrieval_metrics(emb, labels)
