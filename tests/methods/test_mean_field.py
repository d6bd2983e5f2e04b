"""Mean-field-paper losses against direct loops over the batch formulas of issue #4 (Eqs. 8–10)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from mlrc.methods import losses
from mlrc.methods.losses.mean_field import segment_logsumexp

torch.manual_seed(0)


def unit(v: torch.Tensor) -> list[list[float]]:
    return [[float(a) / math.sqrt(sum(float(b) ** 2 for b in row)) for a in row] for row in v]


def dist(a: list[float], b: list[float]) -> float:
    return 1.0 - sum(p * q for p, q in zip(a, b, strict=True))


def groups(y: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, c in enumerate(y):
        out.setdefault(c, []).append(i)
    return dict(sorted(out.items()))


def ref_mfcont(x, y, W, mP, mN, lam):
    F, M, C, B = unit(x), unit(W), len(W), groups(y)
    total = 0.0
    for c, members in B.items():
        s = 0.0
        for i in members:
            s += max(dist(F[i], M[c]) - mP, 0.0)
            s += sum(max(mN - dist(F[i], M[c2]), 0.0) for c2 in range(C) if c2 != c)
        total += s / len(members)
    reg = sum(max(mN - dist(M[c], M[c2]), 0.0) ** 2 for c in range(C) for c2 in range(C) if c != c2)
    return total / len(B) + lam / C * reg


def ref_cwms(x, y, a, b, delta):
    F, B = unit(x), groups(y)
    K = len(B)
    pos = sum(
        math.log(
            1
            + sum(math.exp(a * (dist(F[i], F[j]) - delta)) for i in Bc for j in Bc)
            / (2 * len(Bc) ** 2)
        )
        for Bc in B.values()
    )
    neg = 0.0
    for c, Bc in B.items():
        for c2, Bc2 in B.items():
            if c != c2:
                s = sum(math.exp(-b * (dist(F[i], F[j]) - delta)) for i in Bc for j in Bc2)
                neg += math.log(1 + s / (len(Bc) * len(Bc2)))
    return pos / (a * K) + neg / (2 * b * K)


def ref_mfcwms(x, y, W, a, b, delta, lam):
    F, M, C, B = unit(x), unit(W), len(W), groups(y)
    K = len(B)

    def A(c, c2):
        if c not in B:
            return 0.0
        return sum(math.exp(-b * (dist(F[i], M[c2]) - delta)) for i in B[c]) / len(B[c])

    pos = sum(
        math.log(1 + sum(math.exp(a * (dist(F[i], M[c]) - delta)) for i in Bc) / len(Bc))
        for c, Bc in B.items()
    )
    neg = sum(math.log(1 + A(c, c2) + A(c2, c)) for c in range(C) for c2 in range(C) if c != c2)
    reg = sum(
        math.log(1 + math.exp(-b * (dist(M[c], M[c2]) - delta))) ** 2
        for c in range(C)
        for c2 in range(C)
        if c != c2
    )
    return pos / (a * K) + neg / (2 * b * K) + lam / C * reg


# 7 classes, 3 absent from the batch, uneven class sizes
Y = [0, 0, 0, 2, 2, 4, 5, 5, 5, 5, 0, 2]
C, D = 7, 5


def batch(dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    return torch.randn(len(Y), D, generator=g, dtype=dtype), torch.tensor(Y)


def build(name, dtype=torch.float64, **params):
    loss = losses.build(name, num_classes=C, embedding_size=D, **params).to(dtype)
    return loss


@pytest.mark.parametrize(("mP", "mN", "lam"), [(0.02, 0.3, 0.0), (0.1, 1.2, 0.5), (-0.1, 2.0, 2.0)])
def test_mean_field_contrastive_equals_eq8(mP, mN, lam):
    loss = build("mean_field_contrastive", pos_margin=mP, neg_margin=mN, lambda_mf=lam)
    x, y = batch()
    want = ref_mfcont(x, Y, loss.mean_fields.detach(), mP, mN, lam)
    assert float(loss(x, y).detach()) == pytest.approx(want, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize(
    ("a", "b", "delta"), [(0.01, 80.0, 0.8), (2.0, 10.0, 0.5), (30.0, 0.5, 0.0)]
)
def test_class_wise_multi_similarity_equals_eq9(a, b, delta):
    loss = build("class_wise_multi_similarity", alpha=a, beta=b, delta=delta)
    x, y = batch()
    assert float(loss(x, y).detach()) == pytest.approx(ref_cwms(x, Y, a, b, delta), rel=1e-10)


@pytest.mark.parametrize(
    ("a", "b", "delta", "lam"),
    [(0.01, 80.0, 0.8, 0.0), (2.0, 10.0, 0.5, 0.3), (30.0, 0.5, 0.0, 1.0)],
)
def test_mean_field_class_wise_multi_similarity_equals_eq10(a, b, delta, lam):
    loss = build(
        "mean_field_class_wise_multi_similarity", alpha=a, beta=b, delta=delta, lambda_mf=lam
    )
    x, y = batch()
    want = ref_mfcwms(x, Y, loss.mean_fields.detach(), a, b, delta, lam)
    assert float(loss(x, y).detach()) == pytest.approx(want, rel=1e-10)


def test_defaults_parameter_names_and_mean_fields():
    assert losses.info("mean_field_contrastive").params == {
        "pos_margin": 0.02,
        "neg_margin": 0.3,
        "lambda_mf": 0.0,
    }
    assert losses.info("class_wise_multi_similarity").params == {
        "alpha": 0.01,
        "beta": 80.0,
        "delta": 0.8,
    }
    assert losses.info("mean_field_class_wise_multi_similarity").params == {
        "alpha": 0.01,
        "beta": 80.0,
        "delta": 0.8,
        "lambda_mf": 0.0,
    }
    torch.manual_seed(0)
    loss = losses.build("mean_field_contrastive", num_classes=300, embedding_size=128)
    W = loss.mean_fields
    assert isinstance(W, torch.nn.Parameter) and W.shape == (300, 128)
    assert list(loss.parameters()) == [W]
    assert abs(float(W.mean())) < 0.02 and abs(float(W.std()) - 1.0) < 0.02  # N(0, 1)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("mean_field_contrastive", {"lambda_mf": 0.7}),
        ("class_wise_multi_similarity", {"alpha": 2.0, "beta": 5.0}),
        ("mean_field_class_wise_multi_similarity", {"alpha": 2.0, "beta": 5.0, "lambda_mf": 0.4}),
    ],
)
def test_gradcheck(name, params):
    loss = build(name, **params)
    x, y = batch()
    x = x[:8].clone().requires_grad_(True)
    y = y[:8]
    if hasattr(loss, "mean_fields"):
        W = loss.mean_fields.detach().clone().requires_grad_(True)
        assert torch.autograd.gradcheck(
            lambda x, W: functional_call(loss, {"mean_fields": W}, (x, y)), (x, W)
        )
    else:
        assert torch.autograd.gradcheck(lambda x: loss(x, y), (x,))


@pytest.mark.parametrize(
    "name", ["class_wise_multi_similarity", "mean_field_class_wise_multi_similarity"]
)
@pytest.mark.parametrize("beta", [80.0, 500.0])
def test_large_beta_is_finite_in_float32_and_matches_float64(name, beta):
    torch.manual_seed(3)
    l64 = build(name, alpha=50.0, beta=beta, delta=0.8)
    l32 = build(name, torch.float32, alpha=50.0, beta=beta, delta=0.8)
    if hasattr(l64, "mean_fields"):
        l32.mean_fields.data = l64.mean_fields.detach().float()
    x, y = batch()
    x32 = x.float().requires_grad_(True)
    v32 = l32(x32, y)
    v32.backward()
    assert torch.isfinite(v32) and torch.isfinite(x32.grad).all()
    assert float(v32.detach()) == pytest.approx(float(l64(x, y).detach()), rel=1e-4)


def test_segment_logsumexp_against_direct_sums():
    v = torch.tensor([[1.0, -900.0], [3.0, -1000.0], [2.0, 5.0]], dtype=torch.float64)
    seg = torch.tensor([1, 1, 0])
    out = segment_logsumexp(v, seg, 3)
    assert out[0].tolist() == [2.0, 5.0]
    assert float(out[1, 0]) == pytest.approx(math.log(math.exp(1) + math.exp(3)))
    assert float(out[1, 1]) == pytest.approx(-900.0 + math.log(1 + math.exp(-100)))
    assert torch.isneginf(out[2]).all()  # empty segment


def test_without_regulariser_no_class_by_class_matrix_is_built(monkeypatch):
    """λ_MF = 0: only the B × C distances are computed (O(B·C·D)), never the C × C ones."""
    from mlrc.methods.losses import mean_field

    def forbidden(self):
        raise AssertionError("C × C mean-field distances computed with lambda_mf = 0")

    monkeypatch.setattr(mean_field._MeanFields, "field_distances", forbidden)
    for name in ("mean_field_contrastive", "mean_field_class_wise_multi_similarity"):
        loss = losses.build(name, num_classes=20_000, embedding_size=128)
        x, y = torch.randn(32, 128, requires_grad=True), torch.randint(0, 20_000, (32,))
        loss(x, y).backward()
        assert torch.isfinite(x.grad).all()
