"""mlrc.train.distributed: K = 2 gloo processes on CPU train as one process on the global batch.

Every equivalence test runs the same few steps twice: once as the reference — one process, no
process group, the whole global batch drawn by the plain sampler, ordinary BatchNorm, no gather
— and once as 2 ranks (``mp.spawn``, gloo, a free port), each with its slice of the batch
(:class:`DistributedBatchSampler`), the model in DDP, the embeddings gathered, the loss's
parameters averaged. Everything is float64 so that the two runs, which only sum in different
orders, agree to ~1e-12; the assertions use rtol 1e-7 / atol 1e-9.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mlrc.methods import losses, miners, samplers
from mlrc.models import TRUNKS
from mlrc.models.embedder import Embedder
from mlrc.models.freezing import freeze_batchnorm
from mlrc.train.distributed import (
    DistributedBatchSampler,
    SyncedBatchNorm2d,
    average_gradients,
    gather_embeddings,
    sync_batchnorm,
)
from mlrc.train.model import Model

CLASSES, PER_CLASS, BATCH, EMB, STEPS = 16, 4, 16, 8, 3
TOL = {"rtol": 1e-7, "atol": 1e-9}

CASES = {
    "pair": {"loss": "contrastive", "miner": None, "m": 4, "freeze": True},
    "proxy": {"loss": "proxy_anchor", "miner": None, "m": 1, "freeze": True},
    "miner": {"loss": "multi_similarity", "miner": "multi_similarity", "m": 4, "freeze": True},
    "syncbn": {"loss": "contrastive", "miner": None, "m": 4, "freeze": False, "sync": True},
}


def data() -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(1)
    images = torch.rand(CLASSES * PER_CLASS, 3, 16, 16, generator=g, dtype=torch.float64)
    return images, np.repeat(np.arange(CLASSES), PER_CLASS)


def build(case: dict) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """Model (tiny_cnn → 8-D), loss and miner from mlrc's registries, float64, seeded."""
    torch.manual_seed(0)
    trunk = TRUNKS.get("tiny_cnn")(pretrained=False)
    model = Model(trunk, Embedder(trunk.output_size, EMB)).double().train()
    if case["freeze"]:
        freeze_batchnorm(model.trunk)
    loss = losses.build(case["loss"], num_classes=CLASSES, embedding_size=EMB).double()
    miner = miners.build(case["miner"]) if case["miner"] else None
    return model, loss, miner


def run_case(case: dict, rank: int, world: int) -> dict:
    """STEPS steps of SGD; per step the loss and the gradients after reduction, then the final
    parameters and buffers. ``world`` 1: the one-process reference, which uses none of
    mlrc.train.distributed."""
    images, labels = data()
    model, loss_fn, miner = build(case)
    sampler = samplers.build("m_per_class", labels, BATCH, case["m"], STEPS, 5)
    net = model
    if world > 1:
        sampler = DistributedBatchSampler(sampler, rank, world)
        if case.get("sync"):
            sync_batchnorm(model)
        net = DistributedDataParallel(model) if case.get("ddp", True) else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_opt = (
        torch.optim.SGD(loss_fn.parameters(), lr=0.5) if case["loss"] == "proxy_anchor" else None
    )
    out: dict = {"loss": [], "grads": [], "batches": []}
    for batch in sampler:
        emb = net(images[batch])
        y = torch.as_tensor(labels[batch])
        if world > 1:
            emb, y = gather_embeddings(emb, y, grad_scale=case.get("grad_scale"))
        loss = loss_fn(emb, y, miner(emb, y)) if miner is not None else loss_fn(emb, y)
        for o in (opt, loss_opt):
            if o is not None:
                o.zero_grad()
        loss.backward()
        if world > 1:
            average_gradients(loss_fn.parameters())
        out["loss"].append(loss.item())
        out["batches"].append(list(batch))
        named = [
            *model.named_parameters(),
            *(("loss." + n, p) for n, p in loss_fn.named_parameters()),
        ]
        out["grads"].append({n: p.grad.clone() for n, p in named if p.grad is not None})
        for o in (opt, loss_opt):
            if o is not None:
                o.step()
    out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    out["state"].update({"loss." + k: v.clone() for k, v in loss_fn.state_dict().items()})
    return out


def rank_main(rank: int, world: int, port: int, job, arg, out_dir: str) -> None:
    """One rank: a gloo group on localhost, ``job(arg, rank, world)`` saved as rank<r>.pt."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        torch.save(job(arg, rank, world), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed(arg, tmp_path: Path, world: int = 2, job=None) -> list[dict]:
    """``job`` (default :func:`run_case`) on ``world`` spawned ranks; their results."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = (world, free_port(), job or run_case, arg, str(tmp_path))
    mp.spawn(rank_main, args=args, nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def reference(case: dict) -> dict:
    with torch.random.fork_rng():
        return run_case(case, 0, 1)


def assert_same(ranks: list[dict], ref: dict) -> None:
    for r, got in enumerate(ranks):
        np.testing.assert_allclose(got["loss"], ref["loss"], **TOL, err_msg=f"rank {r} loss")
        for step, (g, want) in enumerate(zip(got["grads"], ref["grads"], strict=True)):
            assert g.keys() == want.keys()
            for name in want:
                torch.testing.assert_close(
                    g[name], want[name], **TOL, msg=f"rank {r} step {step} {name}"
                )
        assert got["state"].keys() == ref["state"].keys()
        for name, want in ref["state"].items():
            torch.testing.assert_close(got["state"][name], want, **TOL, msg=f"rank {r} {name}")


@pytest.mark.parametrize("kind", ["pair", "proxy", "miner", "syncbn"])
def test_two_ranks_train_as_one_process(kind: str, tmp_path: Path) -> None:
    """Losses, all-reduced gradients (model and proxies) and parameters (and, with trainable
    BatchNorm, its running statistics) after 3 steps match the one-process reference."""
    case = CASES[kind]
    ranks = distributed(case, tmp_path)
    ref = reference(case)
    # the ranks' slices, concatenated in rank order, are the reference's global batches
    joined = [a + b for a, b in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)]
    assert joined == ref["batches"]
    if kind == "proxy":
        assert any(n.startswith("loss.") for n in ref["grads"][0])
    assert_same(ranks, ref)


def test_negative_controls_differ(tmp_path: Path) -> None:
    """The equivalence tests can fail: without the gradient scale (grad_scale=1) the model's
    gradients are the reference's halved, and plain BatchNorm on each rank's half batch (no
    sync_batchnorm) changes the loss itself."""
    unscaled = distributed({**CASES["pair"], "grad_scale": 1.0}, tmp_path / "a")
    ref = reference(CASES["pair"])
    np.testing.assert_allclose(unscaled[0]["loss"][0], ref["loss"][0], **TOL)
    name = "embedder.linear.weight"
    got, want = unscaled[0]["grads"][0][name], ref["grads"][0][name]
    assert not torch.allclose(got, want, **TOL)
    torch.testing.assert_close(got, want / 2, **TOL)

    local_bn = distributed({**CASES["syncbn"], "sync": False}, tmp_path / "b")
    ref = reference(CASES["syncbn"])
    assert not np.allclose(local_bn[0]["loss"], ref["loss"], **TOL)


def test_gather_outside_a_group_and_in_a_group_of_one() -> None:
    emb, y = torch.randn(4, 3, requires_grad=True), torch.arange(4)
    got_emb, got_y = gather_embeddings(emb, y)
    assert got_emb is emb and got_y is y
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        got_emb, got_y = gather_embeddings(emb, y)
        assert got_emb is emb and got_y is y
    finally:
        dist.destroy_process_group()


SAMPLERS = [("m_per_class", 4), ("shuffle", 1), ("spc_random", 1), ("greedy_coreset", 4)]


def sampler(name: str, m: int, batch: int = BATCH, seed: int = 7) -> samplers.BatchSampler:
    labels = np.repeat(np.arange(CLASSES), PER_CLASS)
    s = samplers.build(name, labels, batch, m, 6, seed)
    if s.needs_bank:
        s.set_bank(np.random.default_rng(3).normal(size=(len(labels), 5)))
    return s


@pytest.mark.parametrize(("name", "m"), SAMPLERS)
@pytest.mark.parametrize("world", [2, 4])
def test_sampler_slices_join_into_the_global_batch(name: str, m: int, world: int) -> None:
    one = sampler(name, m)
    ranks = [DistributedBatchSampler(sampler(name, m), r, world) for r in range(world)]
    for _ in range(5):
        want = one.next_batch()
        slices = [s.next_batch() for s in ranks]
        assert all(len(s) == BATCH // world for s in slices)
        assert [i for s in slices for i in s] == want
    assert len(ranks[0]) == len(one)
    assert all(s.state() == ranks[0].state() for s in ranks)


@pytest.mark.parametrize(("name", "m"), SAMPLERS)
def test_sampler_state_round_trip(name: str, m: int) -> None:
    first = DistributedBatchSampler(sampler(name, m), 1, 2)
    for _ in range(2):
        first.next_batch()
    saved = first.state()
    assert saved == first.sampler.state()
    ahead = [first.next_batch() for _ in range(3)]
    resumed = DistributedBatchSampler(sampler(name, m, seed=99), 1, 2)
    resumed.set_state(saved)
    assert [resumed.next_batch() for _ in range(3)] == ahead


def bank_rows(indices: torch.Tensor, step: int) -> torch.Tensor:
    """Made-up embeddings of training items ``indices`` at ``step`` (5-D)."""
    return torch.sin(indices[:, None].double() * torch.arange(1, 6) + step).float()


def bank_job(_arg, rank: int, world: int) -> dict:
    """A memory-bank sampler fed the batch's rows: each rank its own slice's (gathered by the
    wrapper), the reference the whole batch's."""
    s = sampler("greedy_coreset", 4)
    if world > 1:
        s = DistributedBatchSampler(s, rank, world)
    batches = []
    for step in range(3):
        batch = torch.as_tensor(s.next_batch())
        s.update(batch, bank_rows(batch, step))
        batches.append(batch.tolist())
    return {
        "batches": batches,
        "bank": torch.from_numpy((s.sampler if world > 1 else s).bank.copy()),
    }


def test_memory_bank_stays_the_one_process_bank(tmp_path: Path) -> None:
    ranks = distributed(None, tmp_path, job=bank_job)
    ref = bank_job(None, 0, 1)
    joined = [a + b for a, b in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)]
    assert joined == ref["batches"]
    for got in ranks:
        np.testing.assert_array_equal(got["bank"], ref["bank"])


def test_sampler_refuses_a_batch_not_divisible_by_the_ranks() -> None:
    with pytest.raises(
        ValueError, match=r"^global batch size 18 is not divisible by the 4 processes$"
    ):
        DistributedBatchSampler(sampler("shuffle", 1, batch=18), 0, 4)
    with pytest.raises(ValueError, match=r"^rank 2 is not one of the 2 ranks$"):
        DistributedBatchSampler(sampler("shuffle", 1), 2, 2)


def test_sync_batchnorm_converts_only_trainable_batchnorm() -> None:
    trunk = TRUNKS.get("tiny_cnn")(pretrained=False).train()
    bns = [m for m in trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    bns[0].eval()  # frozen, as freeze_batchnorm leaves it
    weights = [bn.weight for bn in bns]
    sync_batchnorm(trunk)
    after = [m for m in trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    assert after[0] is bns[0]
    assert all(type(m) is SyncedBatchNorm2d for m in after[1:])
    assert all(bn.weight is w for bn, w in zip(after, weights, strict=True))  # shared
    assert freeze_batchnorm(trunk) == len(bns)  # still frozen by mlrc's freezing
