"""One `reference` fold on a GPU: img/s, GPU busy %, first batches, checkpoints; the
synthetic-input upper bound; 1, 2 and 4 folds packed on one GPU (with and without CUDA MPS).

    python bench/gpu_fold.py                 # ≤ 8 min on one GPU (cuda:0)
    python bench/gpu_fold.py --quick         # ≤ 2 min: shorter runs, packed 1 and 4, no MPS
    python bench/gpu_fold.py --device cpu    # smoke run in seconds: tiny images and sizes

On a machine with torch/torchvision but none of mlrc's other dependencies, run
``bench/gpu_check.sh`` (it installs the wheels ``bench/gpu_wheels.sh`` prepared, then this).

Synthetic CUB-sized JPEGs (500 × 375, 375 × 500, 500 × 333 px, smooth colour fields plus grain,
quality 90) are written to a temporary image folder (one sub-folder per class) and read with
mlrc's ``image_folder`` dataset; ``MLRC_CACHE`` points into the same temporary folder, where the
decoded cache is built first and timed on its own.

a. **One fold**: mlrc's real ``train_fold`` on the ``reference`` preset (random BN-Inception
   weights: ``pretrained: false``; ``iterations_per_epoch`` and ``max_epochs: 2`` fixed, a
   validation after each epoch on a few held-out classes; everything else the preset's:
   batch 32 of 8 classes × 4, 227 px crops, 4 loader workers, decoded cache, contrastive loss).
   The loss is contrastive wrapped to note the time of each call (a plug-in loss,
   ``bench_timed_contrastive``): img/s = training images between the call at iteration
   ``warm-up`` of epoch 2 and the last one, over the time between them. GPU busy % is NVML's
   utilisation (``torch.cuda.utilization``, else ``nvidia-smi``), sampled every 0.1 s in a
   thread, averaged over that window. Time to the first batch of epoch k: from the end of the
   previous validation to the first loss call of epoch k, less the ``last.pt`` writes that the
   main thread made in between. Checkpoint seconds: the time of each ``last.pt`` write
   (``mlrc.train.checkpoint.atomic_save``, timed through a wrapper), and whether the training
   thread or a background thread made it.
b. **Upper bound**: the same trunk + embedder + loss + RMSprop, same batch, fed one synthetic
   batch that already lives on the device (no loader, no host work but the launches); img/s over
   the timed steps, synchronised at both ends; and the ratio a ÷ b.
c. **Packed**: k = 1, 2, 4 processes (this script, ``--worker``) each training a fold on the
   same GPU at once (one epoch; loader workers each); total img/s over the window in which all
   k train, and GPU busy %. With CUDA MPS too where ``nvidia-cuda-mps-control`` exists (a
   private daemon started and stopped here, its pipe and log folders in the temporary folder).

Goals (issue #22): ≥ 85 % GPU busy and ≥ 0.85 × the upper bound for one fold; 4 packed folds
≥ 2.5 × one packed fold's img/s. Printed beside each measurement, never a failure: the script
exits non-zero only on a real error. Prints rich tables and writes
``bench/results/gpu_fold.csv`` (``--out``; one row per measurement, with the machine), and
names any of Ray, faiss, MLflow, Plotly or Optuna that the fold path imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

BENCH = Path(__file__).resolve().parent
SIZES = [(500, 375), (375, 500), (500, 333)]  # (width, height): CUB photos are mostly these
HEAVY = ("ray", "faiss", "mlflow", "plotly", "optuna")  # the fold path must not import these
GOAL_BUSY = 85.0  # % GPU busy, one fold
GOAL_RATIO = 0.85  # × the synthetic-input upper bound, one fold
GOAL_PACKED = 2.5  # 4 packed folds ÷ one, total img/s
REHEARSE_FAIL = "MLRC_REHEARSE_FAIL"  # =packed: the packed part fails on purpose (rehearsal)
STAMPS: list[float] = []  # time.monotonic() of each call of the timed loss (this process)


@dataclass(frozen=True)
class Profile:
    """Sizes of one run. ``iterations``: per epoch of the fold (a); ``warmup``: iterations of
    the timed epoch left out of img/s; ``packed_iterations``: the one epoch of each packed fold;
    ``resize``/``crop``/``batch``/``num_workers``/``eval_batch``: None = the preset's."""

    classes: int
    per_class: int
    val_classes: int
    iterations: int
    warmup: int
    upper_iterations: int
    packed_iterations: int
    packed: tuple[int, ...]
    mps: bool
    image_scale: float = 1.0  # JPEG sides × this (the CPU smoke run writes small ones)
    resize: int | None = None
    crop: int | None = None
    batch: int | None = None
    num_workers: int | None = None
    eval_batch: int | None = None


PROFILES = {
    "full": Profile(64, 24, 8, 250, 30, 250, 200, (1, 2, 4), True),
    "quick": Profile(32, 16, 4, 100, 20, 100, 100, (1, 4), False),
    "cpu": Profile(6, 6, 2, 4, 1, 4, 4, (1, 2), False, 0.25, 72, 64, 8, 1, 8),
}


# --- data ------------------------------------------------------------------------------------


def write_jpeg(path: str, size: tuple[int, int], seed: int) -> None:
    """One CUB-like JPEG (quality 90): a smooth random colour field plus sensor-like grain."""
    rng = np.random.default_rng(seed)
    w, h = size
    field = np.zeros((h, w, 3), np.float32)
    for cells, amplitude in ((4, 90.0), (16, 40.0)):  # coarse → fine colour variation
        small = rng.normal(128, amplitude, (max(cells * h // w, 1), cells, 3))
        band = Image.fromarray(np.clip(small, 0, 255).astype(np.uint8)).resize((w, h), 3)
        field += (np.asarray(band, np.float32) - 128) * 0.8
    field += rng.normal(0, 6.0, field.shape).astype(np.float32)
    image = np.clip(field + 128, 0, 255).astype(np.uint8)
    Image.fromarray(image).save(path, quality=90)


def make_image_folder(root: Path, prof: Profile) -> int:
    """``root/c<k>/<i>.jpg``, ``prof.classes`` × ``prof.per_class`` JPEGs written by all cores;
    returns their total size in bytes."""
    jobs = []
    for c in range(prof.classes):
        (root / f"c{c:03d}").mkdir(parents=True, exist_ok=True)
        for i in range(prof.per_class):
            w, h = SIZES[(c + i) % len(SIZES)]
            size = (max(int(w * prof.image_scale), 32), max(int(h * prof.image_scale), 32))
            jobs.append((str(root / f"c{c:03d}" / f"{i:04d}.jpg"), size, c * 10_000 + i))
    workers = min(os.cpu_count() or 1, 16)
    if workers == 1 or len(jobs) < 64:
        for job in jobs:
            write_jpeg(*job)
    else:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(write_jpeg, *zip(*jobs, strict=True), chunksize=16))
    return sum(Path(p).stat().st_size for p, _, _ in jobs)


# --- the fold ---------------------------------------------------------------------------------


def timed_name(loss: str) -> str:
    """The plug-in name under which ``loss`` is registered with its calls timed."""
    return f"bench_timed_{loss}"


def register_timed_loss(loss: str = "contrastive") -> str:
    """``loss`` (its default parameters), noting the time of each call in ``STAMPS``; returns
    the name it is registered under (:func:`timed_name`)."""
    from mlrc.methods import losses

    name = timed_name(loss)
    if name in losses.available():
        return name

    class Timed(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, *rest: Any) -> Any:
            STAMPS.append(time.monotonic())
            return self.inner(embeddings, labels, *rest)

    def timed(*, num_classes: int, embedding_size: int) -> torch.nn.Module:
        """A loss that notes the time of each call (bench/gpu_fold.py)."""
        inner = losses.build(loss, num_classes=num_classes, embedding_size=embedding_size)
        return Timed(inner)

    meta = losses.info(loss)
    losses.register(
        name, batch=meta.batch, has_parameters=meta.has_parameters, takes_tuples=meta.takes_tuples
    )(timed)
    return name


@dataclass
class CheckpointWrite:
    """One ``atomic_save`` call: file name, start/end (time.monotonic(), s), which thread."""

    name: str
    start: float
    end: float
    main_thread: bool


def time_checkpoints(writes: list[CheckpointWrite]) -> None:
    """Wrap ``mlrc.train.checkpoint.atomic_save`` (and every ``mlrc.train`` module's name for
    it) so that each call is appended to ``writes``."""
    import mlrc.train  # noqa: F401 - loads the modules that hold a reference to atomic_save
    from mlrc.train import checkpoint

    original = getattr(checkpoint.atomic_save, "__wrapped__", checkpoint.atomic_save)

    def timed_save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return original(obj, path, *args, **kwargs)
        finally:
            main = threading.current_thread() is threading.main_thread()
            writes.append(CheckpointWrite(Path(path).name, t0, time.monotonic(), main))

    timed_save.__wrapped__ = original  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        if name.startswith("mlrc.train") and getattr(module, "atomic_save", None) in (
            original,
            checkpoint.atomic_save,
        ):
            module.atomic_save = timed_save


def fold_preset(prof: Profile, epochs: int, iterations: int) -> Any:
    """The ``reference`` preset with random trunk weights and a fixed schedule: ``epochs`` of
    ``iterations``, a validation after each, no early stop (and the profile's sizes)."""
    from mlrc.config import load_preset

    over: dict[str, Any] = {
        "pretrained": False,
        "iterations_per_epoch": iterations,
        "max_epochs": epochs,
        "validate_every": {"default": 1},
        "patience": {"default": 10_000},
    }
    if prof.resize is not None:
        over["image"] = {"resize": prof.resize, "crop": prof.crop}
    if prof.batch is not None:
        over["batch"] = {"size": prof.batch}
    if prof.num_workers is not None:
        over["num_workers"] = prof.num_workers
    if prof.eval_batch is not None:
        over["eval_batch_size"] = prof.eval_batch
    return load_preset("reference", over)


def run_fold(
    root: Path, workdir: Path, device: str, prof: Profile, epochs: int, its: int, loss: str
) -> dict:
    """Train one fold through ``train_fold`` with ``loss``; the timestamps (time.monotonic(), s)
    of every loss call, of every validation's end and of every checkpoint write, the batch."""
    from mlrc import data
    from mlrc.methods import losses
    from mlrc.train import FoldSpec, train_fold

    timed = register_timed_loss(loss)
    writes: list[CheckpointWrite] = []
    time_checkpoints(writes)
    ds = data.build("image_folder", root=root)
    classes = list(range(ds.num_classes))
    preset = fold_preset(prof, epochs, its)
    validations: list[float] = []
    STAMPS.clear()
    start = time.monotonic()
    spec = FoldSpec(
        ds,
        ds.name,
        classes[: -prof.val_classes],
        classes[-prof.val_classes :],
        timed,
        {},
        1e-3 if losses.info(loss).has_parameters else None,
        preset,
        0,
        workdir,
        device=device,
        progress=False,
    )
    res = train_fold(spec, on_validation=lambda _rec: validations.append(time.monotonic()))
    if res.status != "complete":
        raise RuntimeError(f"the fold failed: {res.reason}")
    return {
        "start": start,
        "end": time.monotonic(),
        "stamps": list(STAMPS),
        "validations": validations,
        "writes": [asdict(w) for w in writes],
        "batch": preset.batch.size,
        "iterations": its,
        "epochs": epochs,
        "heavy": heavy_imports(),
    }


def heavy_imports() -> list[str]:
    """Which of :data:`HEAVY` this process has imported."""
    return [m for m in HEAVY if m in sys.modules]


def fold_figures(run: dict, warmup: int) -> dict[str, Any]:
    """img/s of the last epoch after ``warmup`` iterations, its window, the time to the first
    batch of each epoch, and the ``last.pt`` writes."""
    n, stamps, vals = run["iterations"], run["stamps"], run["validations"]
    if len(stamps) != n * run["epochs"] or len(vals) != run["epochs"] + 1:
        raise RuntimeError(
            f"expected {n * run['epochs']} loss calls and {run['epochs'] + 1} validations, "
            f"saw {len(stamps)} and {len(vals)}"
        )
    i0, i1 = n * (run["epochs"] - 1) + min(warmup, n - 2), n * run["epochs"] - 1
    window = (stamps[i0], stamps[i1])
    writes = [CheckpointWrite(**w) for w in run["writes"]]
    first = []
    for k in range(run["epochs"]):
        t0, t1 = vals[k], stamps[k * n]
        blocked = sum(w.end - w.start for w in writes if w.main_thread and t0 <= w.start < t1)
        first.append(t1 - t0 - blocked)
    last = [w for w in writes if w.name == "last.pt"]
    return {
        "img_per_s": (i1 - i0) * run["batch"] / (window[1] - window[0]),
        "window": window,
        "first_batch_s": first,
        "last_pt_s": [w.end - w.start for w in last],
        "last_pt_in_step": sum(w.main_thread for w in last),
    }


# --- the upper bound --------------------------------------------------------------------------


def upper_bound(
    prof: Profile, device: str, busy: BusySampler | None, loss: str = "contrastive"
) -> tuple[float, float | None]:
    """img/s (and GPU busy %) of the fold's model, ``loss`` and optimiser on one synthetic
    batch already on the device: forward, loss, backward, step; synchronised at both ends."""
    from mlrc.methods import losses
    from mlrc.models.freezing import freeze_batchnorm
    from mlrc.train import build_model

    preset = fold_preset(prof, 1, 1)
    torch.manual_seed(0)
    model = build_model(preset).to(device).fast_paths(preset.amp, preset.channels_last)
    model.train()
    if preset.freeze_batchnorm:
        freeze_batchnorm(model.trunk)
    kind = losses.info(loss).batch
    b, m, crop = preset.batch.size, preset.batch.images_per_class[kind], preset.image.crop
    n_classes = b // m
    loss_fn = losses.build(loss, num_classes=n_classes, embedding_size=preset.embedding_size)
    loss_fn = loss_fn.to(device)
    o = preset.optimizer
    opt = torch.optim.RMSprop(
        model.parameters(), lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum
    )
    x = torch.randn(b, 3, crop, crop, device=device) * 50  # the trunk's input range: 0–255 − mean
    y = torch.arange(n_classes, device=device).repeat_interleave(m)

    def steps(n: int) -> None:
        for _ in range(n):
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync(device)

    steps(max(prof.upper_iterations // 10, 2))  # warm-up: cuDNN's choice, allocator
    t0 = time.monotonic()
    steps(prof.upper_iterations)
    t1 = time.monotonic()
    return prof.upper_iterations * b / (t1 - t0), busy.mean(t0, t1) if busy else None


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# --- GPU busy ---------------------------------------------------------------------------------


class BusySampler(threading.Thread):
    """NVML's GPU utilisation (% of the last sample period with a kernel running) every
    ``period`` s: ``torch.cuda.utilization``, else ``nvidia-smi``."""

    def __init__(self, index: int, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.index, self.period = index, period
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()
        self.source = "torch.cuda.utilization"
        try:
            torch.cuda.utilization(index)
        except Exception:  # no pynvml: ask nvidia-smi
            self.source = "nvidia-smi" if shutil.which("nvidia-smi") else "none"

    def read(self) -> float | None:
        if self.source == "torch.cuda.utilization":
            return float(torch.cuda.utilization(self.index))
        if self.source == "nvidia-smi":
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
                + ["-i", str(self.index)],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return float(out.stdout.split()[0]) if out.returncode == 0 else None
        return None

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            value = self.read()
            if value is not None:
                self.samples.append((time.monotonic(), value))

    def mean(self, t0: float, t1: float) -> float | None:
        """Mean utilisation over [t0, t1] (samples of the first 0.5 s, which may cover time
        before t0, left out when the window is long enough)."""
        inside = [u for t, u in self.samples if t0 + min(0.5, (t1 - t0) / 4) <= t <= t1]
        return float(np.mean(inside)) if inside else None


# --- packed workers ---------------------------------------------------------------------------


@contextlib.contextmanager
def mps_daemon(tmp: Path) -> Iterator[dict[str, str] | str]:
    """A private CUDA MPS daemon (pipe and log folders under ``tmp``): yields the environment its
    clients need, or a one-line reason why there is none; stopped on exit."""
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        yield "nvidia-cuda-mps-control not found"
        return
    base = Path(os.environ.get("MLRC_MPS_DIR") or tmp)  # bench/gpu_check.py stops it there too
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(base / "mps-pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(base / "mps-log"),
    }
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    started = subprocess.run([exe, "-d"], env=full, capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        yield f"nvidia-cuda-mps-control -d failed: {(started.stderr or started.stdout).strip()}"
        return
    try:
        yield env
    finally:
        subprocess.run([exe], input="quit\n", env=full, text=True, timeout=30, check=False)
        time.sleep(1.0)  # the server exits after its clients


def packed(
    args: argparse.Namespace, tmp: Path, k: int, env: dict[str, str], busy: BusySampler | None
) -> dict[str, Any]:
    """``k`` worker processes training a fold each on ``args.device`` at once: total img/s over
    the window in which all of them train (after their warm-up), GPU busy % over it."""
    procs, outs = [], []
    for w in range(k):
        out = tmp / f"packed-{k}-{len(env)}-{w}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out)]
        cmd += ["--data", str(tmp / "images"), "--device", args.device, "--profile", args.profile]
        cmd += ["--loss", args.loss]
        log = open(tmp / f"{out.stem}.log", "w")  # noqa: SIM115 - closed below
        procs.append(
            (subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=log), log)
        )
        outs.append(out)
    try:
        start_together(procs, outs)
        for proc, log in procs:
            code = proc.wait(timeout=300)
            log.close()
            if code != 0:
                tail = Path(log.name).read_text().strip().splitlines()[-5:]
                raise RuntimeError(f"packed worker exited {code}: " + " | ".join(tail))
    finally:
        for proc, log in procs:  # on an error: none left behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    runs = [json.loads(o.read_text()) for o in outs]
    warm = PROFILES[args.profile].warmup
    start = max(r["stamps"][min(warm, len(r["stamps"]) - 2)] for r in runs)
    end = min(r["stamps"][-1] for r in runs)
    if end <= start:
        return {"img_per_s": None, "busy": None, "overlap_s": 0.0, "heavy": []}
    done = sum(sum(start < t <= end for t in r["stamps"]) * r["batch"] for r in runs)
    return {
        "img_per_s": done / (end - start),
        "busy": busy.mean(start, end) if busy else None,
        "overlap_s": end - start,
        "heavy": sorted({m for r in runs for m in r["heavy"]}),
    }


def start_together(procs: list, outs: list[Path], timeout_s: float = 300.0) -> None:
    """Wait until every worker has imported what it needs (``OUT.ready``), then let them all
    start their fold at once (``OUT.go``), so that their training overlaps."""
    deadline = time.monotonic() + timeout_s
    while not all(o.with_suffix(".ready").exists() for o in outs):
        if any(p.poll() is not None for p, _log in procs) or time.monotonic() > deadline:
            return  # a worker died or hangs: its exit code tells
        time.sleep(0.02)
    for o in outs:
        o.with_suffix(".go").touch()


def wait_for_go(out: Path, timeout_s: float = 300.0) -> None:
    """Say this worker is ready, wait for the parent's go (see :func:`start_together`)."""
    out.with_suffix(".ready").touch()
    deadline = time.monotonic() + timeout_s
    while not out.with_suffix(".go").exists() and time.monotonic() < deadline:
        time.sleep(0.005)


def worker_main(args: argparse.Namespace) -> None:
    """``--worker OUT``: one packed fold, its timestamps written to OUT as JSON."""
    import mlrc.train  # noqa: F401 - the imports before the go, not inside the timed fold

    prof = PROFILES[args.profile]
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(1)
    register_timed_loss(args.loss)
    if os.environ.get(REHEARSE_FAIL) == "packed":
        time.sleep(3600)  # a hung worker: the part's process group must end it
    wait_for_go(Path(args.worker))
    with tempfile.TemporaryDirectory(prefix="mlrc-gpu-fold-worker-") as work:
        its = prof.packed_iterations
        run = run_fold(Path(args.data), Path(work), args.device, prof, 1, its, args.loss)
    Path(args.worker).write_text(json.dumps(run))


# --- main -------------------------------------------------------------------------------------


def row(section: str, measure: str, value: float | None, unit: str, goal: str = "", **kw) -> dict:
    met = kw.pop("met", None)
    return {
        "section": section,
        "measure": measure,
        "value": None if value is None else round(float(value), 4),
        "unit": unit,
        "goal": goal,
        "met": "" if met is None else ("yes" if met else "no"),
        **kw,
    }


def build_cache(args: argparse.Namespace, tmp: Path) -> list[dict]:
    """The decoded cache of the images, built and timed before any fold (CPU only)."""
    from mlrc import data
    from mlrc.data.cache import decoded_cache, default_cache_dir

    prof = PROFILES[args.profile]
    ds = data.build("image_folder", root=tmp / "images")
    t0 = time.monotonic()
    decoded_cache(ds, fold_preset(prof, 1, 1).image.resize, default_cache_dir(), progress=False)
    return [row("data", "decoded cache build", time.monotonic() - t0, "s", images=len(ds))]


def measure_fold(args: argparse.Namespace, tmp: Path, busy: BusySampler | None) -> list[dict]:
    """Parts a and b: one fold, the upper bound (in this process); sections named after the
    loss when it is not contrastive (``fold (LOSS)``, ``upper bound (LOSS)``)."""
    prof = PROFILES[args.profile]
    fold_sec, upper_sec = section("fold", args.loss), section("upper bound", args.loss)
    work = tmp / f"fold-{args.loss}"  # a fold of its own (a finished one would be resumed)
    run = run_fold(tmp / "images", work, args.device, prof, 2, prof.iterations, args.loss)
    fig = fold_figures(run, prof.warmup)
    fold_busy = busy.mean(*fig["window"]) if busy else None
    save_partial(args, [row(fold_sec, "train_fold img/s", fig["img_per_s"], "img/s")])
    upper, upper_busy = upper_bound(prof, args.device, busy, args.loss)
    ratio = fig["img_per_s"] / upper
    busy_met = None if fold_busy is None else fold_busy >= GOAL_BUSY
    ckpt = fig["last_pt_s"]
    in_step = fig["last_pt_in_step"]
    return [
        row(fold_sec, "train_fold img/s", fig["img_per_s"], "img/s"),
        row(fold_sec, "GPU busy", fold_busy, "%", f"≥ {GOAL_BUSY:.0f} %", met=busy_met),
        row(upper_sec, "synthetic on-device img/s", upper, "img/s"),
        row(upper_sec, "GPU busy", upper_busy, "%"),
        row(fold_sec, "÷ upper bound", ratio, "×", f"≥ {GOAL_RATIO}", met=ratio >= GOAL_RATIO),
        row(fold_sec, "first batch, epoch 1", fig["first_batch_s"][0], "s"),
        row(fold_sec, "first batch, epoch 2", fig["first_batch_s"][1], "s"),
        row(fold_sec, "last.pt writes", len(ckpt), "n", in_step=in_step,
            note=f"{in_step} by the training thread"),
        row(fold_sec, "last.pt write, mean", float(np.mean(ckpt)) if ckpt else None, "s"),
        row(fold_sec, "last.pt write, max", max(ckpt) if ckpt else None, "s"),
        row(fold_sec, "heavy imports", len(run["heavy"]), "n", note=" ".join(run["heavy"])),
    ]  # fmt: skip


def save_partial(args: argparse.Namespace, rows: list[dict]) -> None:
    """The rows measured so far to ``--rows`` (bench/gpu_check.py reads them even if this
    part is ended at its limit before it reports); the report overwrites them."""
    if args.rows is not None:
        extra = {"device": args.device, "profile": args.profile, "loss": args.loss}
        args.rows.write_text(json.dumps([{**r, **extra, "partial": True} for r in rows]))


def section(name: str, loss: str) -> str:
    """A section's name: ``name`` for the contrastive loss (the reference), else with the
    loss (``mlrc.train.gpu_demand`` reads the plain ``upper bound`` rows only)."""
    return name if loss == "contrastive" else f"{name} ({loss})"


def packed_modes(args: argparse.Namespace) -> list[bool]:
    """Without MPS, with it, or both (``--part``; ``all``: with it on CUDA unless
    ``--quick``/``--no-mps``)."""
    if args.part == "packed":
        return [False]
    if args.part == "mps":
        return [True]
    cuda = torch.device(args.device).type == "cuda"
    return [False] + ([True] if PROFILES[args.profile].mps and cuda and not args.no_mps else [])


def measure_packed(args: argparse.Namespace, tmp: Path, busy: BusySampler | None) -> list[dict]:
    """Part c: packed folds (the profile's counts, or ``--workers``), without and (where it
    exists) with MPS; "× one packed fold" where one is among the counts."""
    prof = PROFILES[args.profile]
    counts = [int(k) for k in args.workers.split(",")] if args.workers else list(prof.packed)
    cuda = torch.device(args.device).type == "cuda"
    modes = packed_modes(args)
    if os.environ.get(REHEARSE_FAIL) == "packed" and False in modes:
        rehearse_failure(args, tmp)
    rows, base = [], None
    for mps in modes:
        with contextlib.ExitStack() as stack:
            env: dict[str, str] | str = {}
            if mps:
                env = stack.enter_context(mps_daemon(tmp)) if cuda else "CUDA only"
                if isinstance(env, str):
                    rows.append(row("packed", "MPS", None, "", note=f"skipped: {env}", mps=True))
                    continue
            for k in counts:
                got = packed(args, tmp, k, env, busy)
                if k == 1 and not mps:
                    base = got["img_per_s"]
                rows += packed_rows(k, mps, got, base)
                save_partial(args, rows)
    if args.part == "all" and not cuda:
        rows.append(row("packed", "MPS", None, "", note="skipped: CUDA only", mps=True))
    elif args.part == "all" and True not in modes:
        rows.append(row("packed", "MPS", None, "", note="skipped: --quick / --no-mps", mps=True))
    return rows


def packed_rows(k: int, mps: bool, got: dict[str, Any], base: float | None) -> list[dict]:
    """The rows of ``k`` packed folds: total img/s, × one packed fold, GPU busy."""
    times = got["img_per_s"] / base if got["img_per_s"] and base else None
    goal = f"≥ {GOAL_PACKED} × 1" if k == 4 else ""
    met = None if k != 4 or times is None else times >= GOAL_PACKED
    note = f"overlap {got['overlap_s']:.1f} s"
    if got["heavy"]:
        note += "; imported " + " ".join(got["heavy"])
    common = {"workers": k, "mps": mps, "note": note}
    return [
        row("packed", "total img/s", got["img_per_s"], "img/s", **common),
        row("packed", "× one packed fold", times, "×", goal, met=met, **common),
        row("packed", "GPU busy", got["busy"], "%", **common),
    ]


def rehearse_failure(args: argparse.Namespace, tmp: Path) -> None:
    """``MLRC_REHEARSE_FAIL=packed`` (bench/gpu_check.sh --rehearse): the packed part fails
    the worst way short of hanging itself: two workers that hang in its process group, one
    process that left the group (as an MPS daemon does), then an error."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tmp / "hung.json")]
    cmd += ["--data", str(tmp / "images"), "--device", args.device, "--profile", args.profile]
    for _ in range(2):
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    subprocess.Popen(sleeper, start_new_session=True, stdout=subprocess.DEVNULL)
    raise RuntimeError(f"{REHEARSE_FAIL}=packed: the packed part fails on purpose")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"gpu_fold: --device {args.device}: no CUDA device here (--device cpu: smoke run)")
        return 2
    args.profile = args.profile or ("cpu" if not cuda else "quick" if args.quick else "full")
    if args.worker:
        worker_main(args)
        return 0
    if not cuda:
        torch.set_num_threads(1)
    with work_folder(args.work) as tmp:
        os.environ["MLRC_CACHE"] = str(tmp / "cache")  # the decoded cache, for every process
        rows = prepare_images(args, tmp)
        busy = BusySampler(torch.device(args.device).index or 0) if cuda else None
        if busy is not None:
            busy.start()
        try:
            # the packed processes first: this one opens no CUDA context before them (an MPS
            # server is started for them alone); NVML's utilisation needs none
            packed_rows = []
            if args.part in ("packed", "mps") or (args.part == "all" and not args.no_packed):
                packed_rows = measure_packed(args, tmp, busy)
            if args.part in ("all", "fold"):
                rows += measure_fold(args, tmp, busy)
            rows += packed_rows
        finally:
            if busy is not None:
                busy.stopped.set()
    report(args, rows, busy)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0) or cpu (smoke)")
    ap.add_argument("--quick", action="store_true", help="≤ 2 min: shorter runs, packed 1 and 4")
    ap.add_argument("--no-packed", action="store_true", help="skip part c")
    ap.add_argument("--no-mps", action="store_true", help="packed folds without MPS only")
    ap.add_argument(
        "--part",
        choices=("all", "fold", "packed", "mps"),
        default="all",
        help="one part only: the fold and its upper bound, packed folds, packed folds under MPS",
    )
    ap.add_argument("--loss", default="contrastive", help="the fold's loss (default contrastive)")
    ap.add_argument("--workers", help="packed: comma-separated process counts (e.g. 2,4)")
    ap.add_argument(
        "--work", type=Path, help="folder for the JPEGs and decoded cache, kept and reused"
    )
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "gpu_fold.csv")
    ap.add_argument("--rows", type=Path, help="also write the rows as a JSON list here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one packed fold → JSON
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--profile", choices=sorted(PROFILES), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


@contextlib.contextmanager
def work_folder(path: Path | None) -> Iterator[Path]:
    """``path`` (made if missing, kept), else a temporary folder removed on exit."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="mlrc-gpu-fold-") as name:
        yield Path(name)


def prepare_images(args: argparse.Namespace, tmp: Path) -> list[dict]:
    """The JPEGs and their decoded cache, timed, unless an earlier run left them in ``tmp``."""
    done = tmp / "images.complete"
    if done.exists():
        return []
    t0 = time.monotonic()
    jpeg_bytes = make_image_folder(tmp / "images", PROFILES[args.profile])
    rows = [row("data", "JPEGs written", time.monotonic() - t0, "s", bytes=jpeg_bytes)]
    rows += build_cache(args, tmp)
    done.touch()
    return rows


def report(args: argparse.Namespace, rows: list[dict], busy: BusySampler | None) -> None:
    """Rich tables of ``rows``, the CSV with the machine, the heavy-import line."""
    import pandas as pd
    from common import machine  # bench/common.py (imports pandas)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    prof = PROFILES[args.profile]
    title = (
        f"One reference fold on {args.device} ({args.profile}: 2 epochs × {prof.iterations} it, "
        f"batch {prof.batch or 32}, loss {args.loss})"
    )
    table = Table(title=title)
    for col in ("section", "measure", "value", "unit", "goal", "met", "note"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for r in rows:
        if r["section"] != "packed":
            cells = (r["section"], r["measure"], fmt(r["value"]), r["unit"], r["goal"], r["met"])
            table.add_row(*cells, r.get("note") or "")
    console.print(table)
    console.print(f"GPU busy: {busy.source if busy else 'n/a (no GPU)'}")
    packed_rows = [r for r in rows if r["section"] == "packed"]
    if packed_rows:
        pt = Table(title="Folds packed on one device (one process each)")
        for col in ("workers", "MPS", "measure", "value", "unit", "goal", "met", "note"):
            pt.add_column(col, justify="right" if col == "value" else "left")
        for r in packed_rows:
            pt.add_row(
                str(r.get("workers", "")),
                "yes" if r.get("mps") else "no",
                r["measure"],
                fmt(r["value"]),
                r["unit"],
                r["goal"],
                r["met"],
                r.get("note", ""),
            )
        console.print(pt)
    heavy = sorted({m for r in rows if r["measure"] == "heavy imports" for m in r["note"].split()})
    console.print(
        "fold path imports: " + (" ".join(heavy) if heavy else f"none of {', '.join(HEAVY)}"),
        soft_wrap=True,
    )
    console.print(f"machine: {machine()}", soft_wrap=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows).assign(
        device=args.device,
        profile=args.profile,
        loss=args.loss,
        trunk="bninception",  # the reference preset's (mlrc data bench reads these two)
        batch=prof.batch or 32,
        machine=machine(),
    )
    for col in ("workers", "images", "bytes", "in_step"):
        if col in df:
            df[col] = df[col].astype("Int64")
    df.to_csv(args.out, index=False)
    console.print(f"wrote {args.out}", soft_wrap=True)
    if args.rows is not None:
        args.rows.write_text(df.to_json(orient="records", force_ascii=False))


def fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(main())
