"""Metrix (mixup for DML): mixing, generalised losses against PML and direct loops, training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from conftest import train_tiny_fold

import mlrc.methods.strategies.metrix as metrix  # registers "metrix"
from mlrc.config import load_preset, load_study
from mlrc.methods import losses, strategies
from mlrc.models.bninception import BNInception
from mlrc.models.resnet import ResNet50Trunk
from mlrc.models.small import SmallCNN
from mlrc.protocol import mlrc_split
from mlrc.train import Model, build_model

LOSS_NAMES = ["contrastive", "multi_similarity", "proxy_anchor"]
LAM = 0.3


def test_registry_parameters_and_checks():
    assert "metrix" in strategies.available()
    assert strategies.params("metrix") == {
        "mixup": "embedding",
        "a": 2.0,
        "w": 0.4,
        "pairs": "random",
        "k": 3,
    }
    for bad in ({"mixup": "manifold"}, {"pairs": "pos_pos"}, {"a": 0.0}, {"w": -1.0}, {"k": 0}):
        with pytest.raises(ValueError):
            strategies.build("metrix", **bad)


def test_config_searches_w_and_a(tmp_path):
    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "loss": {"name": "contrastive"},
        "strategy": {"name": "metrix", "params": {"mixup": "feature"}},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = load_study(path)
    assert {"strategy.w", "strategy.a"} <= set(r.space)
    assert r.fixed["strategy.mixup"] == "feature"


def test_lambda_is_beta_a_a_from_the_global_generator():
    torch.manual_seed(0)
    draws = torch.tensor([metrix.draw_lambda(2.0) for _ in range(2000)], dtype=torch.float64)
    torch.manual_seed(0)
    assert metrix.draw_lambda(2.0) == draws[0].item()
    assert abs(draws.mean().item() - 0.5) < 0.02  # Beta(2, 2): mean 1/2, var 1/20
    assert abs(draws.var().item() - 0.05) < 0.006


# --------------------------------------------------------------------------------------------
# Trunk split


@pytest.mark.parametrize(
    "trunk",
    [lambda: SmallCNN(widths=(8, 16, 16, 32)), BNInception, ResNet50Trunk],
    ids=["small_cnn", "bninception", "resnet50"],
)
def test_split_trunk_composes_to_the_trunk(trunk):
    torch.manual_seed(0)
    t = trunk().eval()
    x = torch.randn(2, 3, 64, 64)
    s = metrix.split_trunk(t)
    with torch.no_grad():
        m = s.body(x)
        assert m.ndim == 4 and m.shape[1] == t.output_size
        assert torch.allclose(s.head(m), t(x), atol=1e-5)


def test_unsupported_trunk_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot split trunk Linear"):
        metrix.split_trunk(torch.nn.Linear(3, 3))


# --------------------------------------------------------------------------------------------
# Mixing: pairs, inputs, features, embeddings


def _batch(seed=0, n_classes=4, per_class=3, size=32):
    torch.manual_seed(seed)
    y = torch.arange(n_classes).repeat_interleave(per_class)
    return torch.rand(len(y), 3, size, size), y


def _model():
    torch.manual_seed(1)
    return build_model(load_preset("cpu")).eval()  # tiny_cnn + 128-D embedder


def _expected_pairs(y, emb, mixup, anc_neg, k, distance):
    """Brute force of Eq. 8's M(a): ordered (i, j) pairs and their anchors."""
    n = len(y)
    d = distance(emb, emb)
    rel = {}
    for a in range(n):
        negs = [j for j in range(n) if y[j] != y[a]]
        if mixup == "input":
            sign = -1.0 if distance.is_inverted else 1.0  # hardest first
            key = dict(zip(negs, (sign * d[a, negs]).tolist(), strict=True))
            negs = sorted(negs, key=key.__getitem__)[:k]
        firsts = [a] if anc_neg else [i for i in range(n) if y[i] == y[a] and i != a]
        for i in firsts:
            for j in negs:
                rel.setdefault((i, j), set()).add(a)
    return dict(sorted(rel.items()))


@pytest.mark.parametrize("mixup", ["input", "feature", "embedding"])
@pytest.mark.parametrize("anc_neg", [False, True], ids=["pos_neg", "anc_neg"])
def test_mixing_pairs_are_the_papers(mixup, anc_neg):
    torch.manual_seed(3)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3])  # class 3: one sample, no positive
    emb = torch.randn(len(y), 6)
    st = metrix.Metrix(mixup, 2.0, 0.4, "random", 3)
    loss_fn = losses.build("contrastive", num_classes=4, embedding_size=6)
    d = loss_fn.distance(emb, emb)
    same = y[:, None] == y[None, :]
    pos, neg = same & ~torch.eye(len(y), dtype=torch.bool), ~same
    i, j, rel = st.mixing_pairs(pos, neg, anc_neg, -d)
    want = _expected_pairs(y, emb, mixup, anc_neg, 3, loss_fn.distance)
    assert list(zip(i.tolist(), j.tolist(), strict=True)) == list(want)
    for p, anchors in enumerate(want.values()):
        assert set(torch.nonzero(rel[:, p]).flatten().tolist()) == anchors


@pytest.mark.parametrize("mixup", ["input", "feature", "embedding"])
@pytest.mark.parametrize("pairs", ["pos_neg", "anc_neg"])
def test_mixed_examples_are_exact_interpolations(mixup, pairs, monkeypatch):
    monkeypatch.setattr(metrix, "draw_lambda", lambda a: LAM)
    x, y = _batch()
    model = _model()
    loss_fn = losses.build("contrastive", num_classes=4, embedding_size=128)
    st = strategies.build("metrix", mixup=mixup, pairs=pairs)
    split = metrix.split_trunk(model.trunk)
    model_inputs, maps, embs = [], [], []
    hooks = [
        model.register_forward_pre_hook(lambda _m, args: model_inputs.append(args[0])),
        split.entry.register_forward_pre_hook(lambda _m, args: maps.append(args[0])),
        model.embedder.register_forward_hook(lambda _m, _a, out: embs.append(out)),
    ]
    seen = {}
    real_soft_loss = metrix.soft_loss

    def spy(loss_fn, mat, y_soft, rel):
        seen.update(mat=mat, y_soft=y_soft, rel=rel)
        return real_soft_loss(loss_fn, mat, y_soft, rel)

    monkeypatch.setattr(metrix, "soft_loss", spy)
    with torch.no_grad():
        st.batch_loss(model, loss_fn, None, x, y)
        for h in hooks:
            h.remove()
        emb = model(x)
        want = _expected_pairs(y, emb, mixup, pairs == "anc_neg", 3, loss_fn.distance)
        i = torch.tensor([p[0] for p in want])
        j = torch.tensor([p[1] for p in want])
        assert torch.equal(embs[0], emb)  # the clean pass comes first
        if mixup == "input":
            assert len(model_inputs) == 2
            assert torch.equal(model_inputs[1], LAM * x[i] + (1 - LAM) * x[j])
            mixed = embs[1]
        elif mixup == "feature":
            assert len(model_inputs) == 1 and len(maps) == 2
            assert torch.equal(maps[0], split.body(x))
            assert torch.equal(maps[1], LAM * maps[0][i] + (1 - LAM) * maps[0][j])
            mixed = embs[1]
            assert torch.equal(mixed, model.embedder(split.head(maps[1])))
        else:
            assert len(model_inputs) == 1 and len(embs) == 1
            unit = emb / emb.norm(dim=1, keepdim=True)  # the paper's f includes the L2 norm
            mixed = LAM * unit[i] + (1 - LAM) * unit[j]
        assert torch.allclose(seen["mat"], loss_fn.distance(emb, mixed), rtol=0, atol=1e-6)
        assert torch.equal(seen["y_soft"], LAM * seen["rel"].float())  # label mix_λ(1, 0) = λ


def test_embedding_mixup_mixes_the_l2_normalised_embeddings():
    """Eq. 4, embedding mixup: mix_λ(f(x), f(x')) with the paper's f ending in the L2
    normalisation (§3.1), i.e. λ·e/‖e‖ + (1−λ)·e'/‖e'‖ — not λe + (1−λ)e'."""
    torch.manual_seed(5)
    emb = torch.randn(6, 16, dtype=torch.float64)
    emb = emb * torch.tensor([0.1, 0.5, 1.0, 2.0, 5.0, 20.0], dtype=torch.float64)[:, None]
    i, j = torch.tensor([0, 1, 2, 5]), torch.tensor([5, 3, 4, 0])
    st = metrix.Metrix("embedding", 2.0, 0.4, "pos_neg", 3)
    got = st.mixed_embeddings(None, None, emb, None, LAM, i, j)
    norm = emb.pow(2).sum(dim=1).sqrt()  # ‖e‖, computed without torch's normalize
    want = torch.stack(
        [LAM * emb[a] / norm[a] + (1 - LAM) * emb[b] / norm[b] for a, b in zip(i, j, strict=True)]
    )
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    # Mixing the raw embeddings fails the same check, even after the re-normalisation every
    # loss distance applies: the direction differs whenever ‖e‖ ≠ ‖e'‖.
    raw = LAM * emb[i] + (1 - LAM) * emb[j]
    assert not torch.allclose(raw, want, rtol=0, atol=1e-3)
    unit = torch.nn.functional.normalize
    assert not torch.allclose(unit(raw, dim=1), unit(want, dim=1), rtol=0, atol=1e-3)


# --------------------------------------------------------------------------------------------
# Generalised losses (float64)

PARAMS = {
    "contrastive": [{}, {"pos_margin": 0.3, "neg_margin": 1.2}],
    "multi_similarity": [{}, {"alpha": 18.0, "beta": 75.0, "base": 0.77}],
    "proxy_anchor": [{}, {"alpha": 16.0, "margin": 0.3}],
}
CASES = [(name, p) for name, ps in PARAMS.items() for p in ps]


def _loss(name, params, num_classes=5, dim=8):
    torch.manual_seed(7)
    return losses.build(name, num_classes=num_classes, embedding_size=dim, **params).double()


def _anchors(loss_fn, emb):
    """Anchor rows of Eq. 9: the batch, or every proxy."""
    if isinstance(loss_fn, metrix.SUPPORTED_LOSSES["proxy_anchor"]):
        return loss_fn.proxies.detach().double()
    return emb


@pytest.mark.parametrize(("name", "params"), CASES)
def test_one_hot_labels_reduce_to_the_clean_pml_loss(name, params):
    torch.manual_seed(11)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4])
    emb = torch.randn(len(y), 8, dtype=torch.float64)
    loss_fn = _loss(name, params)
    clean = loss_fn(emb, y)
    if name == "proxy_anchor":
        mat = loss_fn.distance(emb, loss_fn.proxies).t()  # proxies × examples
        labels = (torch.arange(5)[:, None] == y[None, :]).double()
        rel = torch.ones_like(labels, dtype=torch.bool)
    else:
        mat = loss_fn.distance(emb, emb)
        labels = (y[:, None] == y[None, :]).double()
        rel = ~torch.eye(len(y), dtype=torch.bool)
    got = metrix.soft_loss(loss_fn, mat, labels, rel)
    assert got.item() == pytest.approx(clean.item(), rel=1e-12, abs=1e-12)
    assert clean.item() > 0


def _direct_loop(name, loss_fn, anchors, ex, lab, rel):
    """The generalised formula, term by term in Python floats."""

    def unit(v):
        n = math.sqrt(sum(t * t for t in v))
        return [t / n for t in v]

    A = [unit(r) for r in anchors.tolist()]
    X = [unit(r) for r in ex.tolist()]
    cos = [[sum(p * q for p, q in zip(a, x, strict=True)) for x in X] for a in A]
    pairs = [(a, v) for a in range(len(A)) for v in range(len(X)) if rel[a][v]]
    if name == "contrastive":
        mp, mn = loss_fn.pos_margin, loss_fn.neg_margin
        dist = [[math.sqrt(max(2 - 2 * c, 0.0)) for c in row] for row in cos]
        pos = [lab[a][v] * max(dist[a][v] - mp, 0.0) for a, v in pairs]
        neg = [(1 - lab[a][v]) * max(mn - dist[a][v], 0.0) for a, v in pairs]

        def avg_nz(ts):
            nz = [t for t in ts if t > 0]
            return sum(nz) / len(nz) if nz else 0.0

        return avg_nz(pos) + avg_nz(neg)
    if name == "multi_similarity":
        al, be, m = loss_fn.alpha, loss_fn.beta, loss_fn.base
        total = 0.0
        for a in range(len(A)):
            sp = sum(lab[a][v] * math.exp(-al * (cos[a][v] - m)) for aa, v in pairs if aa == a)
            sn = sum((1 - lab[a][v]) * math.exp(be * (cos[a][v] - m)) for aa, v in pairs if aa == a)
            total += math.log(1 + sp) / al + math.log(1 + sn) / be
        return total / len(A)
    al, d = loss_fn.alpha, loss_fn.margin
    pos_sum = neg_sum = 0.0
    n_pos = n_neg = 0
    for c in range(len(A)):
        mine = [v for cc, v in pairs if cc == c]
        sp = sum(lab[c][v] * math.exp(-al * (cos[c][v] - d)) for v in mine)
        sn = sum((1 - lab[c][v]) * math.exp(al * (cos[c][v] + d)) for v in mine)
        pos_sum, neg_sum = pos_sum + math.log(1 + sp), neg_sum + math.log(1 + sn)
        n_pos += any(lab[c][v] > 0 for v in mine)
        n_neg += any(lab[c][v] < 1 for v in mine)
    return pos_sum / n_pos + neg_sum / n_neg


@pytest.mark.parametrize(("name", "params"), CASES)
def test_generalised_losses_match_a_direct_loop(name, params):
    torch.manual_seed(5)
    emb = torch.randn(6, 8, dtype=torch.float64)  # clean anchors (pair losses)
    ex = torch.randn(9, 8, dtype=torch.float64)  # mixed examples
    loss_fn = _loss(name, params)
    anchors = _anchors(loss_fn, emb)
    lab = torch.rand(len(anchors), len(ex), dtype=torch.float64)
    lab[0, :3] = 1.0  # some binary labels among the soft ones
    lab[1, :3] = 0.0
    rel = torch.rand(len(anchors), len(ex)) < 0.7
    mat = loss_fn.distance(ex, anchors).t() if name == "proxy_anchor" else loss_fn.distance(emb, ex)
    got = metrix.soft_loss(loss_fn, mat, lab, rel).item()
    want = _direct_loop(name, loss_fn, anchors, ex, lab.tolist(), rel.tolist())
    assert got == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_end_to_end_value_with_fixed_lambda(name, monkeypatch):
    """batch_loss = clean + w · (direct loop over Eq. 9 with labels λ on the paper's pairs)."""
    monkeypatch.setattr(metrix, "draw_lambda", lambda a: LAM)
    x, y = _batch(n_classes=3, per_class=2)
    model = _model().double()
    loss_fn = _loss(name, {}, num_classes=3, dim=128)
    st = strategies.build("metrix", mixup="embedding", pairs="pos_neg", w=0.7)
    with torch.no_grad():
        got = st.batch_loss(model, loss_fn, None, x.double(), y).item()
        emb = model(x.double())
        clean = loss_fn(emb, y).item()
    n = len(y)
    if name == "proxy_anchor":  # anchors: the proxies; M(c) = U⁺(c) × U⁻(c)
        pairs = [(i, j) for i in range(n) for j in range(n) if y[i] != y[j]]
        rel = [[y[i] == c for i, _ in pairs] for c in range(3)]
        anchors = loss_fn.proxies.detach()
    else:
        want = _expected_pairs(y, emb, "embedding", False, 3, loss_fn.distance)
        pairs = list(want)
        rel = [[a in want[p] for p in pairs] for a in range(n)]
        anchors = emb
    unit = emb / emb.norm(dim=1, keepdim=True)
    mixed = torch.stack([LAM * unit[i] + (1 - LAM) * unit[j] for i, j in pairs])
    lab = [[LAM] * len(pairs) for _ in rel]
    want_mixed = _direct_loop(name, loss_fn, anchors, mixed, lab, rel)
    assert got == pytest.approx(clean + 0.7 * want_mixed, rel=1e-9)


@pytest.mark.parametrize("mixup", ["input", "feature", "embedding"])
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_w_zero_is_exactly_the_clean_loss(name, mixup):
    x, y = _batch()
    model = _model()
    loss_fn = _loss(name, {}, num_classes=4, dim=128).float()
    st = strategies.build("metrix", mixup=mixup, w=0.0)
    with torch.no_grad():
        clean = loss_fn(model(x), y)
        got = st.batch_loss(model, loss_fn, None, x, y)
    assert torch.equal(got, clean)
    st = strategies.build("metrix", mixup=mixup, w=0.4)
    with torch.no_grad():
        assert st.batch_loss(model, loss_fn, None, x, y) > clean  # the mixed loss is > 0


def test_gradients_reach_trunk_embedder_and_proxies():
    x, y = _batch()
    model = _model()
    loss_fn = _loss("proxy_anchor", {}, num_classes=4, dim=128).float()
    strategies.build("metrix", mixup="feature").batch_loss(model, loss_fn, None, x, y).backward()
    for p in (model.trunk.body[0].weight, model.embedder.linear.weight, loss_fn.proxies):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_unsupported_loss_or_pairing_is_a_clear_error():
    x, y = _batch()
    model = _model()
    st = strategies.build("metrix")
    for name in ("triplet", "snr", "ntxent"):
        loss_fn = losses.build(name, num_classes=4, embedding_size=128)
        with pytest.raises(ValueError, match="supports contrastive .*multi_similarity .*proxy"):
            st.batch_loss(model, loss_fn, None, x, y)
    loss_fn = losses.build("proxy_anchor", num_classes=4, embedding_size=128)
    with pytest.raises(ValueError, match="anc_neg.*undefined for proxy_anchor"):
        strategies.build("metrix", pairs="anc_neg").batch_loss(model, loss_fn, None, x, y)
    plain = Model(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 8)), None)
    with pytest.raises(ValueError, match="cannot split trunk Sequential"):
        strategies.build("metrix", mixup="feature").batch_loss(
            plain, losses.build("contrastive", num_classes=4, embedding_size=8), None, x, y
        )


# --------------------------------------------------------------------------------------------
# Short training on the real Omniglot subset (cpu preset: tiny_cnn)


@pytest.mark.parametrize("mixup", ["input", "feature", "embedding"])
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_metrix_trains_on_omniglot(name, mixup, omniglot_ds, tmp_path: Path):
    val = mlrc_split(omniglot_ds.labels, scheme="mlrc").folds[0].val_classes[:4]  # fast
    res = train_tiny_fold(
        omniglot_ds,
        tmp_path,
        name,
        iterations=2,
        val_classes=val,
        strategy="metrix",
        strategy_params={"mixup": mixup},
    )
    assert res.status == "complete", res.reason
    assert math.isfinite(res.history[-1].train_loss) and res.history[-1].train_loss > 0
