"""Registered losses: the registry contract, the parameter mapping against direct formulas (our
own float64 references, not PML against PML), and a few real training iterations on Omniglot."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import train_tiny_fold

from mlrc.config import LOSS_SPACES_DIR, default_space
from mlrc.methods import losses

# the losses mlrc ships (tests register throwaways; an installed plug-in ships its own space)
NAMES = [n for n in losses.available() if losses.info(n).factory.__module__.startswith("mlrc.")]
NEW = [
    "proxy_nca",
    "margin",
    "margin_per_class",
    "cosface",
    "arcface",
    "fastap",
    "snr",
    "soft_triple",
    "proxy_anchor",
    "angular",
    "lifted_structure",
    "generalized_lifted_structure",
    "npairs",
    "histogram",
]
C, D, B = 6, 16, 24  # classes, embedding size, batch (each class 4 times)
TOL = {"rtol": 1e-5, "atol": 1e-8}


def batch(seed: int = 0, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(B, D, generator=g, dtype=dtype)
    labels = torch.arange(B) % C
    return emb[torch.randperm(B, generator=g)], labels


def build(name: str, num_classes: int = C, **params) -> torch.nn.Module:
    torch.manual_seed(0)
    return losses.build(name, num_classes=num_classes, embedding_size=D, **params)


def unit(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return x / x.norm(dim=dim, keepdim=True)


def pair_masks(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    same = labels[:, None] == labels[None, :]
    return same & ~torch.eye(len(labels), dtype=torch.bool), ~same


def triplets(labels: torch.Tensor) -> torch.Tensor:
    """All (a, p, n): y_a = y_p, a ≠ p, y_n ≠ y_a."""
    pos, neg = pair_masks(labels)
    return (pos[:, :, None] & neg[:, None, :]).nonzero()


def avg_non_zero(x: torch.Tensor) -> torch.Tensor:
    nz = x[x > 0]
    return nz.mean() if len(nz) else x.sum() * 0


# ---------------------------------------------------------------------------------------------
# 1. Registry contract, for every registered loss
# ---------------------------------------------------------------------------------------------


def test_all_requested_losses_are_registered():
    assert set(NEW) <= set(NAMES)
    kinds = {n: losses.info(n).batch for n in NEW}
    assert {n for n, k in kinds.items() if k == "class"} == {
        "proxy_nca",
        "cosface",
        "arcface",
        "soft_triple",
        "proxy_anchor",
    }


@pytest.mark.parametrize("name", NAMES)
def test_builds_with_defaults_and_gives_a_finite_differentiable_scalar(name):
    info = losses.info(name)
    loss_fn = build(name, **info.params)
    assert bool(list(loss_fn.parameters())) == info.has_parameters
    emb, labels = batch()
    emb.requires_grad_(True)
    loss = loss_fn(emb, labels)
    assert loss.ndim == 0 and torch.isfinite(loss) and loss.requires_grad
    loss.backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all()
    if info.has_parameters:
        grads = [p.grad for p in loss_fn.parameters()]
        assert any(g is not None for g in grads)
        assert all(torch.isfinite(g).all() for g in grads if g is not None)


@pytest.mark.parametrize("name", NAMES)
def test_search_space_loads_and_names_only_accepted_parameters(name):
    info = losses.info(name)
    assert (LOSS_SPACES_DIR / f"{name}.yaml").is_file(), (
        f"studies/spaces/losses/{name}.yaml is missing"
    )
    space = default_space(name)
    accepted = set(info.params) | ({"loss_lr"} if info.has_parameters else set())
    assert set(space) <= accepted, f"{name}: {sorted(set(space) - accepted)} not accepted"
    if name in NEW and info.has_parameters:
        assert "loss_lr" in space  # MLRC searches the loss optimiser's lr
    # every searched value can actually be passed to the factory
    point = {
        k: (s.choices[0] if s.choices else int(s.low) if s.int_ else s.low)
        for k, s in space.items()
        if k != "loss_lr"
    }
    build(name, **point)


# ---------------------------------------------------------------------------------------------
# 2. Parameter mapping against direct formulas (float64)
# ---------------------------------------------------------------------------------------------


def test_contrastive_margins_are_unit_l2_distances_averaged_over_non_zero_pairs():
    emb, y = batch(1, torch.float64)
    d = torch.cdist(unit(emb), unit(emb))
    pos, neg = pair_masks(y)
    mp, mn = 1.2, 1.5  # about half the pairs of random unit vectors (d ≈ √2) are active
    ref = avg_non_zero(F.relu(d[pos] - mp)) + avg_non_zero(F.relu(mn - d[neg]))
    assert 0 < (F.relu(d[pos] - mp) > 0).float().mean() < 1
    loss = build("contrastive", pos_margin=mp, neg_margin=mn)(emb, y)
    torch.testing.assert_close(loss, ref, **TOL)


def test_triplet_margin_is_a_distance_over_all_triplets_averaged_over_non_zero():
    emb, y = batch(2, torch.float64)
    d = torch.cdist(unit(emb), unit(emb))
    a, p, n = triplets(y).T
    m = 0.1
    terms = F.relu(d[a, p] - d[a, n] + m)
    assert 0 < (terms > 0).float().mean() < 1
    torch.testing.assert_close(build("triplet", margin=m)(emb, y), avg_non_zero(terms), **TOL)


def test_ntxent_temperature_divides_cosine_similarities():
    emb, y = batch(3, torch.float64)
    s = unit(emb) @ unit(emb).T / 0.1
    pos, neg = pair_masks(y)
    terms = []
    for a, p in pos.nonzero().tolist():
        logits = torch.cat([s[a, p : p + 1], s[a][neg[a]]])
        terms.append(torch.logsumexp(logits, 0) - s[a, p])
    ref = torch.stack(terms).mean()
    torch.testing.assert_close(build("ntxent", temperature=0.1)(emb, y), ref, **TOL)


@pytest.mark.parametrize("name", ["margin", "margin_per_class"])
def test_margin_beta_and_margin_are_unit_l2_distances(name):
    emb, y = batch(4, torch.float64)
    m, beta0 = 0.1, 1.3
    loss_fn = build(name, margin=m, beta=beta0).double()
    assert torch.allclose(loss_fn.beta.detach(), torch.tensor(beta0, dtype=torch.float64))
    if name == "margin_per_class":
        assert loss_fn.beta.shape == (C,)
        with torch.no_grad():  # distinct betas: the anchor's class must pick its own
            loss_fn.beta.copy_(torch.linspace(1.1, 1.6, C, dtype=torch.float64))
    else:
        assert loss_fn.beta.shape == (1,)
    beta = loss_fn.beta.detach()
    d = torch.cdist(unit(emb), unit(emb))
    a, p, n = triplets(y).T
    b = beta[y[a]] if len(beta) > 1 else beta[0]
    pos_l, neg_l = F.relu(d[a, p] - b + m), F.relu(b - d[a, n] + m)
    ref = (pos_l.sum() + neg_l.sum()) / ((pos_l > 0).sum() + (neg_l > 0).sum())
    torch.testing.assert_close(loss_fn(emb, y), ref, **TOL)


def class_cosines(emb: torch.Tensor, weights_cd: torch.Tensor) -> torch.Tensor:
    """B × C cosines between embeddings and class vectors given as C × D."""
    return unit(emb) @ unit(weights_cd).T


def test_arcface_margin_is_in_degrees():
    emb, y = batch(5, torch.float64)
    m_deg, s = 30.0, 16.0
    loss_fn = build("arcface", margin=m_deg, scale=s).double()
    cos = class_cosines(emb, loss_fn.W.detach().T)  # PML's W is D × C
    theta = torch.acos(cos[torch.arange(B), y])
    m = m_deg * math.pi / 180
    assert (theta + m < math.pi).all()  # the plain cos(θ + m) branch applies everywhere
    logits = cos.clone()
    logits[torch.arange(B), y] = torch.cos(theta + m)
    ref = F.cross_entropy(s * logits, y)
    torch.testing.assert_close(loss_fn(emb, y), ref, **TOL)
    no_margin = F.cross_entropy(s * cos, y)
    assert ref > no_margin + 0.1  # the margin really is 30°, not 30 radians nor 0


def test_cosface_subtracts_the_margin_from_the_target_cosine_then_scales():
    emb, y = batch(6, torch.float64)
    m, s = 0.4, 20.0
    loss_fn = build("cosface", margin=m, scale=s).double()
    cos = class_cosines(emb, loss_fn.W.detach().T)
    ref = F.cross_entropy(s * (cos - m * F.one_hot(y, C)), y)
    torch.testing.assert_close(loss_fn(emb, y), ref, **TOL)


def test_proxy_nca_softmax_scale_multiplies_squared_unit_l2_distances():
    emb, y = batch(7, torch.float64)
    scale = 3.0
    loss_fn = build("proxy_nca", softmax_scale=scale).double()
    d2 = torch.cdist(unit(emb), unit(loss_fn.proxies.detach())) ** 2
    ref = F.cross_entropy(-scale * d2, y)
    torch.testing.assert_close(loss_fn(emb, y), ref, **TOL)


def test_proxy_anchor_is_eq_4_with_alpha_and_delta_on_cosine_similarity():
    emb, y = batch(8, torch.float64)
    alpha, delta, n_cls = 16.0, 0.2, C + 1  # class C is absent from the batch: |P⁺| < |P|
    loss_fn = build("proxy_anchor", num_classes=n_cls, alpha=alpha, margin=delta).double()
    cos = class_cosines(emb, loss_fn.proxies.detach())  # B × (C+1)
    present = [c for c in range(n_cls) if (y == c).any()]
    pos = sum(torch.log1p(torch.exp(-alpha * (cos[y == c, c] - delta)).sum()) for c in present)
    neg = sum(torch.log1p(torch.exp(alpha * (cos[y != c, c] + delta)).sum()) for c in range(n_cls))
    ref = pos / len(present) + neg / n_cls
    torch.testing.assert_close(loss_fn(emb, y), ref, **TOL)


def test_snr_regularizer_weight_is_the_zero_mean_term_on_unit_embeddings():
    emb, y = batch(9, torch.float64)
    w = 0.3
    plain = build("snr", pos_margin=0.2, neg_margin=1.5, regularizer_weight=0.0)(emb, y)
    reg = build("snr", pos_margin=0.2, neg_margin=1.5, regularizer_weight=w)(emb, y)
    ref = w * unit(emb).sum(dim=1).abs().mean()  # PML 0.9.x: regularizer_weight·mean|Σ_m x̂_m|
    torch.testing.assert_close(reg - plain, ref, **TOL)
    # and the SNR distance itself: Var(x̂_a − x̂_b)/Var(x̂_a), margins averaged over non-zero
    u = unit(emb)
    snr_d = (u[:, None] - u[None]).var(dim=2) / u.var(dim=1)[:, None]
    pos, neg = pair_masks(y)
    ref_plain = avg_non_zero(F.relu(snr_d[pos] - 0.2)) + avg_non_zero(F.relu(1.5 - snr_d[neg]))
    torch.testing.assert_close(plain, ref_plain, **TOL)


def test_soft_triple_reg_weight_is_the_papers_centre_regulariser():
    emb, y = batch(10, torch.float64)
    k, rw = 3, 0.5
    kw = {"la": 20.0, "gamma": 0.1, "margin": 0.01, "centers_per_class": k}
    plain = build("soft_triple", reg_weight=0.0, **kw).double()
    withreg = build("soft_triple", reg_weight=rw, **kw).double()
    centres = unit(withreg.fc.detach().T)  # (C·K) × D, class-major
    terms = [
        torch.sqrt(2 - 2 * centres[c * k + i] @ centres[c * k + j])
        for c in range(C)
        for i in range(k)
        for j in range(i + 1, k)
    ]
    ref_reg = rw * torch.stack(terms).sum() / (C * k * (k - 1))
    torch.testing.assert_close(withreg(emb, y) - plain(emb, y), ref_reg, **TOL)
    # base term: per-class soft similarity with 1/gamma inside the softmax, scale la
    sim = (unit(emb) @ centres.T).view(B, C, k)
    s_c = (F.softmax(sim / kw["gamma"], dim=2) * sim).sum(dim=2)
    ref = F.cross_entropy(kw["la"] * (s_c - kw["margin"] * F.one_hot(y, C)), y)
    torch.testing.assert_close(plain(emb, y), ref, **TOL)


def test_histogram_survives_similarities_of_exactly_one():
    emb, y = batch(11)
    emb[C:] = emb[:C].repeat(3, 1)[: B - C]  # duplicates: cosine similarity 1 between positives
    y = torch.arange(B) % C
    for n_bins in (10, 64, 100, 200):
        loss = build("histogram", n_bins=n_bins)(emb.requires_grad_(True), y)
        assert torch.isfinite(loss)


# ---------------------------------------------------------------------------------------------
# 3. A few real iterations on the Omniglot subset, cpu preset
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_trains_a_few_iterations_on_omniglot_without_nan(name, omniglot_ds, tmp_path):
    res = train_tiny_fold(omniglot_ds, tmp_path, name)
    assert res.status == "complete", res.reason
    assert [h.epoch for h in res.history] == [0, 1]
    assert math.isfinite(res.history[-1].train_loss)
