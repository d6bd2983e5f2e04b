"""Registered PML losses against independent, loop-based references written from the papers.

Complements tests/methods/test_losses_pml.py for the losses it does not check. Each reference follows the
paper's formula with the conventions PML 2.9 uses (read from its source, never called here):

- multi_similarity: cosine similarity, all pairs of the batch (no hard-pair mining as in the
  MS paper's code), mean over all anchors.
- normalized_softmax: logits = cos(x, w_c)/temperature with the module's own W (D × C).
- fastap: squared L2 distance between unit embeddings in [0, 4]; num_bins + 1 triangular bins
  centred on linspace(0, 4, num_bins + 1), width 4/num_bins; loss = mean over anchors of 1 − AP.
- angular: Wang et al. Eq. 8 (log(1 + Σ_n e^f)), one term per ordered anchor-positive pair, mean
  over them; alpha in degrees. PML 2.9 normalises the anchor and positive but NOT the negatives
  (PML ≤ 0.9 normalised everything before the loss), so the paper's form is matched only for
  unit-norm inputs; see test_angular_negatives_are_not_normalised_by_pml_2_9.
- lifted_structure: Song et al. Eq. 4 with pos_margin subtracted, L2 distance of unit embeddings,
  ½[J]₊² averaged over the positive pairs.
- generalized_lifted_structure: per anchor [LSE_p(d − m⁺) + LSE_n(m⁻ − d)]₊, mean over anchors.
- npairs: ONE pair per class (PML: anchor = the class's first index in the batch, positive = its
  second), dot products of unit embeddings, cross-entropy, mean over the classes.
- histogram: unordered pairs, cosine similarity, n_bins intervals on [−1, 1] (n_bins + 1 nodes).
"""

from __future__ import annotations

import math

import pytest
import torch

from mlrc.methods import losses

D = 8
SEEDS = [0, 1, 2]
COUNTS = {0: [2, 3, 4, 2, 3], 1: [4, 2, 2, 3, 2, 4], 2: [3, 2, 4, 2]}  # items per class
TOL64 = {"rtol": 1e-6, "atol": 1e-9}


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw (not unit) float64 embeddings; every class has ≥ 2 items, some 3–4; shuffled."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(COUNTS[seed])])
    labels = labels[torch.randperm(len(labels), generator=g)]
    emb = 3.0 * torch.randn(len(labels), D, generator=g, dtype=torch.float64)
    return emb, labels


def build(name: str, num_classes: int, **params) -> torch.nn.Module:
    torch.manual_seed(0)
    return losses.build(name, num_classes=num_classes, embedding_size=D, **params).double()


def unit_rows(x: torch.Tensor) -> list[torch.Tensor]:
    return [v / math.sqrt(float(v @ v)) for v in x]


def cos(u: list[torch.Tensor], i: int, j: int) -> float:
    return float(u[i] @ u[j])


def l2(u: list[torch.Tensor], i: int, j: int) -> float:
    diff = u[i] - u[j]
    return math.sqrt(float(diff @ diff))


def lse(xs: list[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def check(loss: torch.Tensor, ref: float) -> None:
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, torch.tensor(ref, dtype=torch.float64), **TOL64)


# ---------------------------------------------------------------------------------------------
# References (plain loops over the batch)
# ---------------------------------------------------------------------------------------------


# MS (Wang et al. 2019, Eq. 2): 1/m Σ_i [1/α log(1 + Σ_P e^{−α(S_ik − λ)}) + 1/β log(1 + Σ_N e^{β(S_ik − λ)})]
def ref_multi_similarity(emb, y, alpha, beta, base):
    u, n, total = unit_rows(emb), len(y), 0.0
    for i in range(n):
        pos = [cos(u, i, k) for k in range(n) if k != i and y[k] == y[i]]
        neg = [cos(u, i, k) for k in range(n) if y[k] != y[i]]
        total += math.log1p(sum(math.exp(-alpha * (s - base)) for s in pos)) / alpha
        total += math.log1p(sum(math.exp(beta * (s - base)) for s in neg)) / beta
    return total / n


# NormFace (Wang et al. 2017, Eq. 6 / Zhai & Wu 2019): −1/m Σ_i log softmax_{y_i}(cos(x_i, w_c) / T)
def ref_normalized_softmax(emb, y, w_dc, temperature):
    u, wu = unit_rows(emb), unit_rows(w_dc.T)
    total = 0.0
    for i in range(len(y)):
        logits = [float(u[i] @ w) / temperature for w in wu]
        total += lse(logits) - logits[int(y[i])]
    return total / len(y)


# FastAP (Cakir et al. 2019, Eq. 9): 1 − 1/N⁺ Σ_j h⁺_j H⁺_j / H_j on ‖x̂_i − x̂_k‖² ∈ [0, 4]
def ref_fastap(emb, y, num_bins):
    u, n = unit_rows(emb), len(y)
    delta = 4.0 / num_bins
    centres = [b * delta for b in range(num_bins + 1)]
    per_anchor = []
    for i in range(n):
        h_pos, h_all = [0.0] * len(centres), [0.0] * len(centres)
        for k in range(n):
            if k == i:
                continue
            d2 = l2(u, i, k) ** 2
            for b, t in enumerate(centres):
                w = max(0.0, 1.0 - abs(d2 - t) / delta)
                h_all[b] += w
                if y[k] == y[i]:
                    h_pos[b] += w
        n_pos = sum(1 for k in range(n) if k != i and y[k] == y[i])
        ap, cum_pos, cum_all = 0.0, 0.0, 0.0
        for b in range(len(centres)):
            cum_pos += h_pos[b]
            cum_all += h_all[b]
            if h_pos[b] * cum_pos > 0 and cum_all > 0:
                ap += h_pos[b] * cum_pos / cum_all
        per_anchor.append(1.0 - ap / n_pos)
    return sum(per_anchor) / n


# Angular (Wang et al. 2017, Eq. 8): log(1 + Σ_n exp(4tan²α (x_a + x_p)ᵀx_n − 2(1 + tan²α) x_aᵀx_p))
def ref_angular(emb, y, alpha_deg, normalise_negatives=True):
    u, n = unit_rows(emb), len(y)
    raw = list(emb)
    t2 = math.tan(math.radians(alpha_deg)) ** 2
    terms = []
    for a in range(n):
        for p in range(n):
            if p == a or y[p] != y[a]:
                continue
            negs = [k for k in range(n) if y[k] != y[a]]
            xn = [u[k] if normalise_negatives else raw[k] for k in negs]
            f = [4 * t2 * float((u[a] + u[p]) @ v) - 2 * (1 + t2) * float(u[a] @ u[p]) for v in xn]
            terms.append(lse([0.0, *f]))
    return sum(terms) / len(terms)


# Lifted structure (Song et al. 2016, Eq. 4): J_ij = log(Σ_{(i,k)∈N} e^{m⁻−D_ik} + Σ_{(j,l)∈N} e^{m⁻−D_jl}) + D_ij − m⁺; L = 1/(2|P|) Σ [J_ij]₊²
def ref_lifted_structure(emb, y, pos_margin, neg_margin):
    u, n = unit_rows(emb), len(y)
    terms = []
    for i in range(n):
        for j in range(i + 1, n):
            if y[j] != y[i]:
                continue
            negs = [neg_margin - l2(u, i, k) for k in range(n) if y[k] != y[i]]
            negs += [neg_margin - l2(u, j, k) for k in range(n) if y[k] != y[j]]
            jij = lse(negs) + l2(u, i, j) - pos_margin
            terms.append(max(jij, 0.0) ** 2)
    return sum(terms) / (2 * len(terms))


# Generalised lifted structure (Hermans et al. 2017, §2): 1/m Σ_a [log Σ_p e^{D_ap − m⁺} + log Σ_n e^{m⁻ − D_an}]₊
def ref_generalized_lifted_structure(emb, y, pos_margin, neg_margin):
    u, n, total = unit_rows(emb), len(y), 0.0
    for a in range(n):
        pos = [l2(u, a, k) - pos_margin for k in range(n) if k != a and y[k] == y[a]]
        neg = [neg_margin - l2(u, a, k) for k in range(n) if y[k] != y[a]]
        total += max(lse(pos) + lse(neg), 0.0)
    return total / n


# N-pair (Sohn 2016, Eq. 3): 1/N Σ_i log(1 + Σ_{j≠i} exp(f_iᵀf_j⁺ − f_iᵀf_i⁺)), one (f_i, f_i⁺) per class
def ref_npairs(emb, y):
    u = unit_rows(emb)
    pairs = []
    for c in sorted(set(y.tolist())):
        idx = [k for k in range(len(y)) if y[k] == c]
        pairs.append((idx[0], idx[1]))  # PML: the class's first and second item in the batch
    total = 0.0
    for i, (a, p) in enumerate(pairs):
        s_pos = cos(u, a, p)
        others = [cos(u, a, pj) - s_pos for j, (_, pj) in enumerate(pairs) if j != i]
        total += math.log1p(sum(math.exp(s) for s in others))
    return total / len(pairs)


# Histogram loss (Ustinova & Lempitsky 2016, Eqs. 2–4): h_r = 1/|S| Σ δ_ijr (triangular on t_r = −1 + rΔ), L = Σ_r h⁻_r Σ_{q≤r} h⁺_q
def ref_histogram(emb, y, n_bins):
    u, n = unit_rows(emb), len(y)
    delta = 2.0 / n_bins
    nodes = [-1.0 + r * delta for r in range(n_bins + 1)]

    def hist(sims):
        h = [0.0] * len(nodes)
        for s in sims:
            for r, t in enumerate(nodes):
                h[r] += max(0.0, 1.0 - abs(s - t) / delta)
        return [v / len(sims) for v in h]

    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    h_pos = hist([cos(u, i, j) for i, j in pairs if y[i] == y[j]])
    h_neg = hist([cos(u, i, j) for i, j in pairs if y[i] != y[j]])
    loss, cum_pos = 0.0, 0.0
    for r in range(len(nodes)):
        cum_pos += h_pos[r]
        loss += h_neg[r] * cum_pos
    return loss


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------


def n_classes(y: torch.Tensor) -> int:
    return int(y.max()) + 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "params",
    [{}, {"alpha": 2.0, "beta": 10.0, "base": 0.2}, {"alpha": 5.0, "beta": 3.0, "base": 0.0}],
)
def test_multi_similarity(seed, params):
    emb, y = batch(seed)
    full = {"alpha": 2.0, "beta": 50.0, "base": 0.5, **params}
    loss = build("multi_similarity", n_classes(y), **params)(emb, y)
    check(loss, ref_multi_similarity(emb, y, **full))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_normalized_softmax_uses_its_own_weights(seed, temperature):
    emb, y = batch(seed)
    loss_fn = build("normalized_softmax", n_classes(y) + 1, temperature=temperature)  # + absent
    w = loss_fn.W.detach()
    assert w.shape == (D, n_classes(y) + 1)
    check(loss_fn(emb, y), ref_normalized_softmax(emb, y, w, temperature))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_bins", [10, 4, 25])
def test_fastap(seed, num_bins):
    emb, y = batch(seed)
    loss = build("fastap", n_classes(y), num_bins=num_bins)(emb, y)
    check(loss, ref_fastap(emb, y, num_bins))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("alpha", [40.0, 30.0, 50.0])
def test_angular_alpha_in_degrees_on_unit_inputs(seed, alpha):
    emb, y = batch(seed)
    emb = emb / emb.norm(dim=1, keepdim=True)  # PML 2.9 matches the paper only for unit inputs
    loss = build("angular", n_classes(y), alpha=alpha)(emb, y)
    check(loss, ref_angular(emb, y, alpha))


@pytest.mark.parametrize("seed", SEEDS)
def test_angular_normalises_every_embedding_on_raw_inputs(seed):
    """PML 2.9's AngularLoss normalises x_a and x_p but uses the raw x_n; mlrc's wrapper
    normalises all embeddings first, so on raw inputs it is the paper's unit-sphere form."""
    emb, y = batch(seed)
    loss = build("angular", n_classes(y), alpha=40.0)(emb, y)
    check(loss, ref_angular(emb, y, 40.0))
    assert abs(float(loss) - ref_angular(emb, y, 40.0, normalise_negatives=False)) > 1e-3


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("margins", [(0.0, 1.0), (0.3, 1.5), (0.5, 0.8)])
def test_lifted_structure(seed, margins):
    emb, y = batch(seed)
    mp, mn = margins
    loss = build("lifted_structure", n_classes(y), pos_margin=mp, neg_margin=mn)(emb, y)
    check(loss, ref_lifted_structure(emb, y, mp, mn))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("margins", [(0.0, 1.0), (0.3, 1.5), (3.0, 0.0)])  # last: relu clips some
def test_generalized_lifted_structure(seed, margins):
    emb, y = batch(seed)
    mp, mn = margins
    loss_fn = build("generalized_lifted_structure", n_classes(y), pos_margin=mp, neg_margin=mn)
    check(loss_fn(emb, y), ref_generalized_lifted_structure(emb, y, mp, mn))


@pytest.mark.parametrize("seed", SEEDS)
def test_npairs_one_pair_per_class(seed):
    emb, y = batch(seed)
    check(build("npairs", n_classes(y))(emb, y), ref_npairs(emb, y))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_bins", [100, 10, 37])
def test_histogram(seed, n_bins):
    emb, y = batch(seed)
    loss = build("histogram", n_classes(y), n_bins=n_bins)(emb, y)
    check(loss, ref_histogram(emb, y, n_bins))
