"""Densely-Anchored Sampling (notes/002): DFS, MTS, the FIFO bank, pooling, gradients, training.

The checks are written from the paper's definitions (Eq. 7–12), not from the module's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import train_tiny_fold

import mlrc.methods.strategies.das  # noqa: F401  (registers "das")
from mlrc.config import load_study
from mlrc.methods import losses, miners, strategies
from mlrc.methods.strategies import Strategy

D = 16


def _das(**kw):
    return strategies.build("das", **kw)


def _peaked_batch(dims_of_class: dict[int, list[int]], per_class: int, seed: int = 0):
    """Embeddings whose K largest entries are exactly ``dims_of_class[c]`` for every sample of c."""
    g = torch.Generator().manual_seed(seed)
    vs, ys = [], []
    for c, dims in dims_of_class.items():
        v = 0.1 * torch.rand(per_class, D, generator=g) - 0.05
        v[:, dims] = 1.0 + torch.rand(per_class, len(dims), generator=g)
        vs.append(v)
        ys += [c] * per_class
    return torch.cat(vs), torch.tensor(ys)


def test_registry_and_defaults():
    assert "das" in strategies.available()
    assert strategies.params("das") == {
        "T": 3,
        "K": 4,
        "Z": 10,
        "r_s": 0.01,
        "r_b": 0.01,
        "normalize": True,
    }
    assert _das().uses_miner
    for bad in ({"T": -1}, {"K": 0}, {"Z": 0}, {"r_s": 1.0}, {"r_b": -0.1}, {"K": 2.5}):
        with pytest.raises(ValueError):
            _das(**bad)
    with pytest.raises(ValueError, match="exceeds the embedding size"):
        _das(K=D + 1).produce(torch.randn(4, D), torch.tensor([0, 0, 1, 1]))


def test_frequency_recorder_counts_top_k_of_every_real_embedding():
    s = _das(K=2, T=1)
    v, y = torch.randn(12, D), torch.tensor([0, 1, 2] * 4)
    s.produce(v, y)
    s.produce(-v, y)
    want = torch.zeros(3, D, dtype=torch.long)
    for vi, yi in zip(torch.cat([v, -v]), torch.cat([y, y]), strict=True):
        order = sorted(range(D), key=lambda k: -float(vi[k]))  # signed, largest first (Eq. 7)
        for k in order[:2]:
            want[yi, k] += 1
    assert torch.equal(s.frm, want)


@pytest.mark.parametrize("r_s", [0.01, 0.3])
def test_dfs_rescales_only_the_class_top_k_dimensions_within_r_s(r_s):
    K, T = 3, 5
    dims = {0: [1, 4, 9], 1: [0, 2, 15], 2: [3, 4, 5]}
    v, y = _peaked_batch(dims, per_class=4)
    s = _das(K=K, T=T, r_s=r_s, r_b=0.0, normalize=False)
    out = s.produce(v, y).reshape(T, len(y), D)
    lo, hi = 1.0 - r_s, 1.0 + r_s
    ratios = []
    for i in range(len(y)):
        top = dims[int(y[i])]
        rest = [k for k in range(D) if k not in top]
        for t in range(T):
            assert torch.equal(out[t, i, rest], v[i, rest])  # untouched, exactly
            ratio = (out[t, i, top].double() / v[i, top].double()).tolist()
            assert all(lo - 1e-6 <= r <= hi + 1e-6 for r in ratio), ratio
            ratios += ratio
    assert max(ratios) - min(ratios) > r_s  # γ is drawn per produced embedding and dimension
    assert max(ratios) - min(ratios) <= 2 * r_s + 1e-6


def test_dfs_mask_comes_from_the_class_statistic_not_the_embedding():
    K = 2
    s = _das(K=K, T=4, r_s=0.5, r_b=0.0, normalize=False)
    s.produce(*_peaked_batch({0: [6, 7], 1: [6, 7]}, per_class=1))  # allocates P
    s.frm[0, [2, 11]] = 100  # class 0's statistic: dims 2, 11; class 1 keeps 6, 7
    v, y = _peaked_batch({0: [6, 7], 1: [6, 7]}, per_class=2, seed=1)
    out = s.produce(v, y).reshape(4, len(y), D)
    for i in range(len(y)):
        top = [2, 11] if y[i] == 0 else [6, 7]
        changed = (out[:, i] != v[i]).any(0).nonzero().flatten().tolist()
        assert set(changed) <= set(top)
        assert set(changed) == set(top)  # continuous γ: all masked dims move (a.s.)


def test_mts_shift_is_r_b_times_a_stored_difference():
    r_b = 0.25
    s = _das(T=200, r_s=0.0, r_b=r_b, Z=4, normalize=False)
    s.produce(torch.randn(3, D), torch.tensor([0, 1, 2]))  # one sample per class: no differences
    assert s.bank_size.tolist() == [0, 0, 0]
    stored = {0: torch.randn(4, D), 1: torch.randn(2, D)}  # class 2's bank stays empty
    for c, rows in stored.items():
        s.enqueue(c, rows)
    v, y = torch.randn(3, D), torch.tensor([0, 1, 2])
    out = s.produce(v, y).reshape(200, 3, D)
    assert torch.equal(out[:, 2], v[2].expand(200, D))  # empty bank: b = 0
    for c, rows in stored.items():
        candidates = v[c] + r_b * rows  # s = 1 exactly (r_s = 0): v' = v + r_b·t
        hits = (out[:, c, None, :] == candidates[None]).all(2)
        assert (hits.sum(1) == 1).all()  # every shift is exactly r_b·(one stored t)
        counts = hits.sum(0)
        assert (counts > 200 / len(rows) / 3).all()  # uniform over the stored ones


def test_fifo_bank_keeps_the_last_z_differences_per_class():
    Z = 5
    s = _das(Z=Z, T=1)
    s.produce(torch.randn(2, D), torch.tensor([0, 1]))
    rows = torch.arange(13 * D, dtype=torch.float32).reshape(13, D) + 1
    pushed = []
    for chunk in (rows[:3], rows[3:4], rows[4:11], rows[11:]):  # 3, 1, 7 (> Z), 2
        s.enqueue(0, chunk)
        pushed += list(chunk)
        want = {tuple(r.tolist()) for r in pushed[-Z:]}
        n = int(s.bank_size[0])
        assert n == min(len(pushed), Z)
        assert {tuple(r.tolist()) for r in s.bank[0][:Z]} >= want
        assert len(want) == n
    assert int(s.bank_size[1]) == 0


def test_bank_update_uses_all_ordered_intra_class_differences():
    Z = 10
    s = _das(Z=Z, T=1, normalize=False)
    v = torch.randn(6, D)
    v[5] = v[4]  # a duplicate: its zero differences are not stored
    y = torch.tensor([0, 0, 0, 0, 1, 1])
    s.produce(v, y)
    diffs = [v[i] - v[j] for i in range(4) for j in range(4) if i != j]  # 12 > Z
    want = {tuple(d.tolist()) for d in diffs[-Z:]}
    assert int(s.bank_size[0]) == Z
    assert {tuple(r.tolist()) for r in s.bank[0]} == want
    assert int(s.bank_size[1]) == 0
    assert not ({tuple(d.tolist()) for d in diffs[:2]} & want)  # the oldest two were dropped


def test_pool_layout_labels_and_gradients():
    T, B = 3, 8
    model = torch.nn.Linear(5, D)
    x, y = torch.randn(B, 5), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    s = _das(T=T, r_s=0.0, r_b=0.0)  # s = 1, b = 0: produced = normalised anchor
    emb = model(x)
    all_emb, all_y = s.pool(emb, y)
    assert all_emb.shape == ((1 + T) * B, D)
    assert torch.equal(all_y, y.repeat(1 + T))
    assert torch.equal(all_emb[:B], emb)
    for t in range(T):
        blk = all_emb[B * (1 + t) : B * (2 + t)]
        assert torch.allclose(blk, F.normalize(emb.detach(), dim=1), atol=1e-6)
    produced = _das(T=T).produce(emb, y)
    assert not produced.requires_grad and produced.grad_fn is None
    (g_real,) = torch.autograd.grad(all_emb[:B].sum(), model.weight, retain_graph=True)
    (g_prod,) = torch.autograd.grad(all_emb[B:].sum(), model.weight)
    assert g_real.abs().sum() > 0
    assert torch.equal(g_prod, torch.zeros_like(g_prod))


class _Recorder(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, emb, y):
        self.seen.append((emb.shape[0], y.clone()))
        return self.inner(emb, y)


def test_loss_and_miner_see_the_pooled_batch_and_t0_is_the_plain_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, D)
    x, y = torch.randn(8, 5), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    loss_fn = losses.build("multi_similarity", num_classes=4, embedding_size=D)
    for miner in (None, miners.build("multi_similarity")):
        plain = Strategy().batch_loss(model, loss_fn, miner, x, y)
        assert torch.equal(_das(T=0).batch_loss(model, loss_fn, miner, x, y), plain)
        rec = _Recorder(miner) if miner is not None else None
        loss = _das(T=2).batch_loss(model, loss_fn, rec, x, y)
        assert torch.isfinite(loss) and loss.requires_grad
        if rec is not None:
            assert rec.seen[0][0] == 24 and torch.equal(rec.seen[0][1], y.repeat(3))


def test_state_dict_round_trip_keeps_the_bank_and_statistic():
    s = _das(T=2, Z=3)
    v, y = torch.randn(8, D), torch.tensor([0, 0, 1, 1, 4, 4, 4, 2])
    s.produce(v, y)
    t = _das(T=2, Z=3)
    t.load_state_dict(s.state_dict())
    for name in ("frm", "bank", "bank_size", "bank_ptr"):
        assert torch.equal(getattr(t, name), getattr(s, name)), name
    assert s.frm.shape == (5, D) and s.bank.shape == (5, 3, D)
    v2 = torch.randn(8, D)
    torch.manual_seed(1)
    a = s.produce(v2, y)
    torch.manual_seed(1)
    assert torch.equal(t.produce(v2, y), a)


def test_config_adds_the_das_space(tmp_path: Path):
    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "loss": {"name": "contrastive"},
        "miner": {"name": "multi_similarity"},
        "strategy": {"name": "das", "params": {"Z": 4}},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = load_study(path)
    assert {k for k in r.space if k.startswith("strategy.")} == {
        "strategy.T",
        "strategy.K",
        "strategy.r_s",
        "strategy.r_b",
    }


@pytest.mark.parametrize(
    "loss,miner",
    [("contrastive", None), ("multi_similarity", None), ("multi_similarity", "multi_similarity")],
)
def test_das_trains_on_omniglot(loss, miner, tmp_path, omniglot_ds):
    params = {"T": 3, "K": 4, "Z": 10, "r_s": 0.1, "r_b": 0.1}
    res = train_tiny_fold(
        omniglot_ds, tmp_path, loss, miner=miner, strategy="das", strategy_params=params
    )
    assert res.status == "complete", res.reason
    assert len(res.history) == 2 and res.history[1].train_loss is not None


def test_a_resumed_fold_continues_with_the_same_das_state(tmp_path, glyphs_ds):
    """The fold checkpoint carries the strategy's buffers (P and the banks)."""
    res = train_tiny_fold(glyphs_ds, tmp_path, strategy="das")
    assert res.status == "complete"
    state = torch.load(tmp_path / "last.pt", weights_only=False)["strategy"]
    assert state and any(v.abs().sum() > 0 for v in state.values() if torch.is_tensor(v))
