"""A fold's K ranks as Ray Train workers: the Ray backend's launcher for ``--procs-per-trial K``.

On the Ray backend a trial whose folds train as K ranks holds only its driver (the Tune trial:
the search, the store, the reports); each fold is one ``ray.train.torch.TorchTrainer`` run of K
workers that Ray places on the cluster — one GPU each (``--gpus-per-trial K``) or a share of
``--cpus-per-trial`` on the CPU — and whose process group Ray Train sets up (NCCL on GPUs, gloo
on the CPU, with mlrc's bounded timeout). Each worker runs :func:`mlrc.train.ranks.run_rank`,
so the ranks do exactly what they do under torchrun (:mod:`mlrc.train.launch`): rank 0 reports
validations (``validations.jsonl`` in the fold's folder, read here), writes the checkpoints and
the result (``rank0.result.json``), and a rank's own error is raised here as it was. A worker lost
without an error of its own (killed, its node gone) is
:class:`~mlrc.train.ranks.RankLost`: the trial is interrupted and retried, as in the pool. The
fold folder must be on a file system every node mounts (``--artifacts``), as for the pool.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from mlrc.train import EpochRecord, FoldResult, FoldSpec
from mlrc.train.launch import timeout_s
from mlrc.train.ranks import EventReader, clear_rank_files, ranks_error, run_rank, write_json

__all__ = ["RESULT", "ray_train_fold"]

RESULT = "rank0.result.json"  # rank 0's FoldResult, in the fold's folder


def ray_train_fold(
    spec: FoldSpec,
    devices: Sequence[str],
    threads: int,
    on_validation: Callable[[EpochRecord], None] | None = None,
    *,
    use_gpu: bool = False,
    cpus_per_rank: float = 1.0,
) -> FoldResult:
    """Train (or resume) ``spec`` as ``len(devices)`` Ray Train workers (``devices`` only
    counts them: Ray places them), each with ``threads`` torch threads, ``cpus_per_rank`` CPUs
    and, with ``use_gpu``, one GPU; see the module docstring."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    k = len(devices)
    events = clear_rank_files(spec.workdir)
    (spec.workdir / RESULT).unlink(missing_ok=True)
    scratch = spec.workdir / "ray-train"  # Ray Train's own run folder, removed after
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"spec": spec, "threads": threads, "use_gpu": use_gpu},
        scaling_config=ScalingConfig(
            num_workers=k, use_gpu=use_gpu, resources_per_worker=_resources(use_gpu, cpus_per_rank)
        ),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=int(timeout_s())),
        run_config=RunConfig(
            name=f"fold-{uuid.uuid4().hex[:8]}",
            storage_path=str(scratch.resolve()),
            failure_config=FailureConfig(max_failures=0),  # a retry is the search's business
        ),
    )
    reader = EventReader(events, on_validation)
    reader.start()
    try:
        trainer.fit()
    except Exception:  # noqa: BLE001 — Ray's TrainingFailedError: what the ranks recorded says why
        raise ranks_error(spec.workdir, {}, k) from None
    finally:
        reader.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return result_of(json.loads((spec.workdir / RESULT).read_text()))


def _resources(use_gpu: bool, cpus: float) -> dict[str, float]:
    return {"CPU": cpus, "GPU": 1.0} if use_gpu else {"CPU": cpus}


def _worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: rank ``world_rank`` of the group Ray Train set up."""
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    device = str(ray.train.torch.get_device()) if config["use_gpu"] else "cpu"
    spec: FoldSpec = config["spec"]
    res = run_rank(spec, rank, device, config["threads"])
    if rank == 0:
        write_json(spec.workdir / RESULT, dataclasses.asdict(res))


def result_of(d: dict[str, Any]) -> FoldResult:
    """The :class:`FoldResult` rank 0 wrote as JSON."""
    history = [EpochRecord(**h) for h in d.pop("history")]
    return FoldResult(**d, history=history)
