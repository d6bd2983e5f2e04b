"""Metrix (Venkataramanan et al., "It Takes Two to Tango: Mixup for Deep Metric Learning",
ICLR 2022; notes/003-metrix.md). Equation numbers are the paper's.

Metric learning as binary classification of pairs: relative to an anchor a, every example x has a
label y ∈ {0, 1} (1: same class, U⁺(a); 0: other class, U⁻(a); Eqs. 5–6), and the generic loss
(Eq. 3) is rewritten so that each example enters the positive sum weighted by y and the negative
sum weighted by 1 − y (Eq. 7):

    ℓ(a) = τ( σ⁺( Σ_{(x,y)∈U(a)} y·ρ⁺(s(a,x)) ) + σ⁻( Σ_{(x,y)∈U(a)} (1−y)·ρ⁻(s(a,x)) ) ).

Mixup then only needs interpolated examples with interpolated labels. For a set M(a) of pairs
((x, y), (x', y')) to mix, the mixed set is V(a) = {(f_λ(x, x'), λy + (1−λ)y')} (Eq. 8) with
λ ~ Beta(a, a) and f_λ one of the three mixup types of Eq. 4 (mix_λ(u, u') = λu + (1−λ)u'):

- ``input``:     f(mix_λ(x, x')) — mix the images, one more forward pass over the mixed ones;
- ``feature``:   f_m(mix_λ(g_m(x), g_m(x'))) — mix the trunk's last convolutional map, then run
  pooling + flatten + embedder again (:func:`split_trunk` cuts each trunk there);
- ``embedding``: mix_λ(f(x), f(x')) — mix the L2-normalised embeddings: the paper's f includes
  the normalisation (§3.1: "it is common to ℓ2-normalize embeddings and define s(x, x') :=
  ⟨f(x), f(x')⟩, which is the cosine similarity"), so with e = model(x) the mixed embedding is
  λ·e/‖e‖ + (1−λ)·e'/‖e'‖ (Eq. 4, third case). Its norm is ≤ 1 (< 1 unless e, e' point the
  same way); the loss's distance re-normalises it, as it does every embedding.

The mixed loss ℓ̃(a) is Eq. 7 with U(a) replaced by V(a) (Eq. 9); anchors stay clean. The
strategy minimises (Eq. 10) E = clean loss + w · mixed loss.

Mixing pairs (§4.1, App. B.2). Each iteration picks uniformly at random between positive–negative
pairs M(a) = U⁺(a) × U⁻(a) and anchor–negative pairs M(a) = S(a) × U⁻(a), S(a) = {(a, 1)}
(``pairs="random"``; ``"pos_neg"`` / ``"anc_neg"`` fix one). In both the first member is the
positive (or the anchor) and the second the negative, so every mixed label is exactly λ
(App. A.1, Eq. 13). Feature and embedding mixup mix all such pairs of the batch; input mixup
replaces U⁻(a) by the anchor's k = 3 hardest negatives (largest similarity, or smallest distance,
to the anchor under the wrapped loss's own distance, on the detached clean embeddings).

Generalised losses (Eq. 9 with soft labels y ∈ [0, 1], relation mask "v ∈ V(a)"). The strategy
must know the loss it wraps: it reads the PML class and its hyperparameters from ``loss_fn``
itself (margins, alpha/beta/base, the proxies and the distance object), so the mixed loss is the
clean loss's formula with the SAME hyperparameters, the same distance (PML distances L2-normalise
their inputs, so mixed embeddings are compared after re-normalisation, as the official code's
PML ``CosineSimilarity``) and the same reduction; with binary labels each reduces exactly to the
PML loss (tests check it). Supported (``type(loss_fn)`` exactly, subclasses such as SNR are not):

- ``contrastive`` (PML ``ContrastiveLoss``; Eq. 1 / Table 1 contrastive, mixed: Eq. 14). The
  project's contrastive works on the L2 distance d between unit embeddings with two margins
  instead of the paper's similarity form (ρ⁺(s) = −s, ρ⁻(s) = [s − m]₊), so ρ⁺(d) = [d − m_pos]₊
  (decreasing in similarity, as Eq. 3 requires) and ρ⁻(d) = [m_neg − d]₊; σ± and τ are the
  identity. Per pair (a, v): y·[d(a,v) − m_pos]₊ and (1 − y)·[m_neg − d(a,v)]₊; each of the two
  sums is reduced as PML's AvgNonZero (mean over its non-zero terms) and the two are added.
- ``multi_similarity`` (PML ``MultiSimilarityLoss``; Eq. 2, mixed: Eq. 15, λ inside the sums):
  ℓ̃(a) = (1/α) log(1 + Σ_v y·e^{−α(s(a,v) − base)}) + (1/β) log(1 + Σ_v (1−y)·e^{β(s(a,v) − base)}),
  s the cosine similarity, PML's ``alpha`` = the paper's β (positives), ``beta`` = its γ
  (negatives), ``base`` = m; the mean over all anchors of the batch (Eq. 10's 1/|X|).
- ``proxy_anchor`` (PML ``ProxyAnchorLoss``; Table 1 proxy anchor, Eq. 9 with proxies as anchors,
  s evaluated on R^d × R^d): for proxy c,
  pos(c) = log(1 + Σ_v y·e^{−α(s(c,v) − δ)}), neg(c) = log(1 + Σ_v (1−y)·e^{α(s(c,v) + δ)}),
  loss = Σ_c pos(c) / #{c with a positive weight} + Σ_c neg(c) / #{c with a negative weight}.
  PML divides the negative sum by the number of classes: the same number whenever the batch has
  two classes or more (every proxy then has negatives); for the mixed set, where only the proxies
  of the batch's classes have a V(c), it is the mean over those anchors (Eq. 10's 1/|X|). This
  is the wrapped loss's form (Kim et al. 2020, as PML): Table 1 writes proxy anchor like MS, with
  1/β, 1/γ factors and one margin m, which is not the loss computed here or by PML; the
  generalisation (labels inside the sums) is the paper's.

Any other loss raises ``ValueError``. A study's miner, if any, only affects the clean loss.

Choices, where the paper leaves it open or differs from the note:

- Default mixup: ``embedding`` (Metrix/embed), where the paper's default is ``feature`` (§4.1,
  "We use feature mixup by default"; App. B.4, Table 6 on Cars196: R@1 85.1 feature, 83.4
  embedding, 82.9 input, 81.6 baseline). Embedding mixup is kept as the default because it is
  the cheapest (no second pass through any part of the network), works with every trunk
  (feature mixup needs :func:`split_trunk` to know the last convolutional map) and its effect
  varies little with w (App. B.4, Fig. 6: "especially for input and embedding mixup"). Set
  ``mixup: feature`` to follow the paper.
- Embedding mixup mixes the *normalised* embeddings (above), feature mixup the last map before
  the head. With the GPU trunks of this project (ResNet-50, BN-Inception) the head after the last
  map is an average pool, a flatten and the linear embedder, all affine, so feature mixup there
  mixes the *un-normalised* embeddings: its direction is that of λe + (1−λ)e', embedding mixup's
  that of λe/‖e‖ + (1−λ)e'/‖e'‖; they agree only when ‖e‖ = ‖e'‖ (the paper's head adds global
  max pooling, §4.1, which is not linear). ``tiny_cnn`` / ``small_cnn`` are cut before their
  final MaxPool2d, so there feature mixup is not affine in the map either.
- One λ per iteration, shared by every mixed pair (the official code; Eq. 8 could be read as one
  per pair). λ and the pos-neg / anc-neg coin come from torch's global CPU generator, which the
  fold trainer seeds: the same draws on any device.
- Proxy anchor: the anchors are the proxies of the classes in the batch, U⁺(c) = the batch's
  examples of class c, so M(c) = U⁺(c) × U⁻(c) (hard negatives of the proxy for input mixup).
  Anchor–negative pairs would mix the proxy itself, which input and feature mixup cannot do and
  the paper does not define: proxy anchor always uses pos-neg pairs (``pairs="anc_neg"`` is an
  error there, ``"random"`` means pos-neg).
- Gradients flow through the clean anchors and the mixed examples (nothing is detached except the
  similarities used to pick hard negatives). Mixed examples are never anchors (§4.1).
- Feature mixup captures the last map with a forward pre-hook on the first pooling module during
  the normal ``model(x)`` call (one trunk pass; forward hooks on the model, e.g. a sampler's
  embedding bank, still see the clean batch first).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as Fn
from pytorch_metric_learning import losses as pml_losses
from torch import Tensor, nn
from torchvision.models import ResNet

from mlrc.methods.strategies.base import Strategy, register
from mlrc.models.bninception import BNInception
from mlrc.models.small import SmallCNN
from mlrc.params import Count, NonNegative, Positive

#: Registry name → the PML class whose generalised form (Eq. 9) is implemented here.
SUPPORTED_LOSSES: dict[str, type[nn.Module]] = {
    "contrastive": pml_losses.ContrastiveLoss,
    "multi_similarity": pml_losses.MultiSimilarityLoss,
    "proxy_anchor": pml_losses.ProxyAnchorLoss,
}
Mixup = Literal["input", "feature", "embedding"]
Pairs = Literal["random", "pos_neg", "anc_neg"]
MIXUPS: tuple[str, ...] = typing.get_args(Mixup)
PAIRS: tuple[str, ...] = typing.get_args(Pairs)


def draw_lambda(a: float) -> float:
    """Interpolation factor λ ~ Beta(a, a) (Eq. 8), from torch's global CPU generator."""
    conc = torch.tensor(float(a), dtype=torch.float64)
    return float(torch.distributions.Beta(conc, conc).sample())


def mix(lam: float, u: Tensor, v: Tensor) -> Tensor:
    """mix_λ(u, v) = λu + (1 − λ)v (§3.3)."""
    return lam * u + (1.0 - lam) * v


def loss_kind(loss_fn: nn.Module) -> str:
    """The registry name of the supported loss ``loss_fn`` is; ``ValueError`` for any other."""
    for name, cls in SUPPORTED_LOSSES.items():
        if type(loss_fn) is cls:
            return name
    supported = ", ".join(f"{k} (PML {c.__name__})" for k, c in SUPPORTED_LOSSES.items())
    raise ValueError(
        f"strategy 'metrix' has no generalised (mixed-label) form of loss "
        f"{type(loss_fn).__name__}; it supports {supported}"
    )


# --------------------------------------------------------------------------------------------
# Trunk split for feature mixup: f = f_m ∘ g_m at the last convolutional map (Eq. 4)


@dataclass(frozen=True)
class TrunkSplit:
    """``trunk(x) == head(body(x))``; ``entry`` is head's first module (its input is the map)."""

    body: Callable[[Tensor], Tensor]  # g_m: input → last convolutional map (N, C, H, W)
    head: Callable[[Tensor], Tensor]  # pooling + flatten: map → the trunk's pooled feature
    entry: nn.Module


def split_trunk(trunk: nn.Module) -> TrunkSplit:
    """Cut ``trunk`` at its last convolutional map, before any pooling; ValueError if unknown."""
    if isinstance(trunk, SmallCNN):
        last = trunk.body[-1]
        if isinstance(last, nn.MaxPool2d):  # ... Conv → BN → ReLU → [MaxPool2d] → avg pool
            to_map = trunk.body[:-1]
            return TrunkSplit(
                body=lambda x: to_map(x),
                head=lambda m: trunk.pool(last(m)).flatten(1),
                entry=last,
            )
    elif isinstance(trunk, BNInception):
        return TrunkSplit(
            body=trunk.features,
            head=lambda m: trunk.global_pool(m).flatten(1),
            entry=trunk.global_pool,
        )
    elif isinstance(trunk, ResNet) and isinstance(trunk.fc, nn.Identity):  # ResNet50Trunk

        def resnet_body(x: Tensor) -> Tensor:
            t = trunk
            x = t.maxpool(t.relu(t.bn1(t.conv1(x))))
            return t.layer4(t.layer3(t.layer2(t.layer1(x))))

        return TrunkSplit(
            body=resnet_body,
            head=lambda m: trunk.fc(torch.flatten(trunk.avgpool(m), 1)),
            entry=trunk.avgpool,
        )
    raise ValueError(
        f"metrix feature mixup cannot split trunk {type(trunk).__name__} at its last "
        "convolutional map (supported: SmallCNN = small_cnn/tiny_cnn, BNInception, "
        "ResNet50Trunk); use mixup='input' or 'embedding'"
    )


@contextmanager
def _capture_input(module: nn.Module) -> Iterator[list[Tensor]]:
    """Collect the first positional input of the first call of ``module`` inside the block."""
    got: list[Tensor] = []

    def hook(_m: nn.Module, args: tuple) -> None:
        if not got:
            got.append(args[0])

    handle = module.register_forward_pre_hook(hook)
    try:
        yield got
    finally:
        handle.remove()


# --------------------------------------------------------------------------------------------
# Generalised losses (Eq. 9): mat (A × V) anchor–example distance/similarity from the loss's own
# distance object, y (A × V) soft labels in [0, 1], rel (A × V) bool "v ∈ V(a)".


def _log1p_weighted_sum_exp(x: Tensor, weight: Tensor) -> Tensor:
    """log(1 + Σ_j weight_ij · exp(x_ij)) per row i; weights ≥ 0, a zero weight drops the term."""
    x = x + torch.log(weight)  # log 0 = −inf: the term contributes exp(−inf) = 0
    return torch.logsumexp(torch.cat([x, x.new_zeros(x.shape[0], 1)], dim=1), dim=1)


def _avg_nonzero(terms: Tensor, anchor: Tensor) -> Tensor:
    """PML's AvgNonZeroReducer: the mean of the terms > 0, or 0 (in the graph) if none."""
    nz = terms[terms > 0]
    return nz.mean() if len(nz) else anchor.sum() * 0.0


def soft_contrastive(
    mat: Tensor, y: Tensor, rel: Tensor, *, pos_margin: float, neg_margin: float, distance
) -> Tensor:
    """Contrastive with interpolated labels (Eq. 9 / Eq. 14 on PML's distance form, see above)."""
    pos = y * Fn.relu(distance.margin(mat, pos_margin))  # y·[d − m_pos]₊
    neg = (1.0 - y) * Fn.relu(distance.margin(neg_margin, mat))  # (1−y)·[m_neg − d]₊
    return _avg_nonzero(pos[rel], mat) + _avg_nonzero(neg[rel], mat)


def soft_multi_similarity(
    mat: Tensor, y: Tensor, rel: Tensor, *, alpha: float, beta: float, base: float, distance
) -> Tensor:
    """Multi-similarity with interpolated labels inside the sums (Eq. 15), mean over anchors."""
    w_pos, w_neg = y * rel, (1.0 - y) * rel
    pos = (1.0 / alpha) * _log1p_weighted_sum_exp(alpha * distance.margin(mat, base), w_pos)
    neg = (1.0 / beta) * _log1p_weighted_sum_exp(beta * distance.margin(base, mat), w_neg)
    return (pos + neg).mean()


def soft_proxy_anchor(
    mat: Tensor, y: Tensor, rel: Tensor, *, alpha: float, margin: float, distance
) -> Tensor:
    """Proxy anchor with interpolated labels (Eq. 9, proxies as anchors: rows of ``mat``)."""
    w_pos, w_neg = y * rel, (1.0 - y) * rel
    pos = _log1p_weighted_sum_exp(alpha * distance.margin(mat, margin), w_pos)
    neg = _log1p_weighted_sum_exp(alpha * distance.margin(-margin, mat), w_neg)
    n_pos, n_neg = (int((w > 0).any(dim=1).sum()) for w in (w_pos, w_neg))
    zero = mat.sum() * 0.0
    return (pos.sum() / n_pos if n_pos else zero) + (neg.sum() / n_neg if n_neg else zero)


def soft_loss(loss_fn: nn.Module, mat: Tensor, y: Tensor, rel: Tensor) -> Tensor:
    """Eq. 9 for the loss ``loss_fn`` wraps, with ITS hyperparameters and distance.

    ``mat`` = ``loss_fn.distance(anchors, examples)``: batch embeddings × examples for the pair
    losses, proxies × examples for proxy anchor (then rows may be a subset of the proxies).
    """
    kind, d = loss_kind(loss_fn), loss_fn.distance
    if kind == "contrastive":
        return soft_contrastive(
            mat, y, rel, pos_margin=loss_fn.pos_margin, neg_margin=loss_fn.neg_margin, distance=d
        )
    if kind == "multi_similarity":
        return soft_multi_similarity(
            mat, y, rel, alpha=loss_fn.alpha, beta=loss_fn.beta, base=loss_fn.base, distance=d
        )
    return soft_proxy_anchor(mat, y, rel, alpha=loss_fn.alpha, margin=loss_fn.margin, distance=d)


# --------------------------------------------------------------------------------------------
# The strategy


def _hardest(neg: Tensor, hardness: Tensor, k: int) -> Tensor:
    """Mask of the (at most) k negatives of each row with the largest ``hardness``."""
    score = hardness.masked_fill(~neg, float("-inf"))
    idx = score.topk(min(k, neg.shape[1]), dim=1).indices
    return torch.zeros_like(neg).scatter_(1, idx, True) & neg


class Metrix(Strategy):
    losses = frozenset(SUPPORTED_LOSSES)

    def __init__(self, mixup: str, a: float, w: float, pairs: str, k: int) -> None:
        super().__init__()
        if mixup not in MIXUPS:
            raise ValueError(f"mixup must be one of {', '.join(MIXUPS)}, got {mixup!r}")
        if pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {', '.join(PAIRS)}, got {pairs!r}")
        if not a > 0:
            raise ValueError(f"a (Beta(a, a)) must be > 0, got {a}")
        if not w >= 0:
            raise ValueError(f"w must be >= 0, got {w}")
        if int(k) < 1 or int(k) != k:
            raise ValueError(f"k must be a positive integer, got {k}")
        self.mixup, self.a, self.w, self.pairs, self.k = mixup, float(a), float(w), pairs, int(k)

    def ranks_refusal(self, values: dict[str, list[Any]]) -> str | None:
        mixups = [m for m in values.get("mixup", [self.mixup]) if m != "embedding"]
        if not mixups:
            return None
        return (
            f"metrix mixup {mixups[0]!r} mixes the images (or feature maps) of pairs drawn "
            "from the global batch, which no rank holds whole; use mixup: embedding"
        )

    def mixing_pairs(
        self, pos: Tensor, neg: Tensor, anc_neg: bool, hardness: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The pairs to mix and, per anchor, which mixed examples are in its V(a) (Eq. 8).

        ``pos``/``neg`` (A × n, bool): U⁺(a) (the anchor excluded) and U⁻(a) of each anchor among
        the n batch examples. ``anc_neg``: M(a) = S(a) × U⁻(a) (then the anchors are the n batch
        examples, in order), else U⁺(a) × U⁻(a). For input mixup U⁻(a) is cut to the k negatives
        with the largest ``hardness`` (A × n). Returns (i, j, rel): mixed example p is
        mix_λ(example i_p, example j_p); rel[a, p] says p ∈ V(a) (its label for a is then λ).
        """
        negs = _hardest(neg, hardness, self.k) if self.mixup == "input" else neg
        eye = torch.eye(pos.shape[1], dtype=torch.bool, device=pos.device)
        first = eye if anc_neg else pos  # S(a) (the anchor itself) or U⁺(a)
        rel3 = first[:, :, None] & negs[:, None, :]  # (a, i, j)
        i, j = rel3.any(dim=0).nonzero(as_tuple=True)
        return i, j, rel3[:, i, j]

    def mixed_embeddings(
        self,
        model: nn.Module,
        x: Tensor,
        emb: Tensor,
        maps: Tensor | None,
        lam: float,
        i: Tensor,
        j: Tensor,
    ) -> Tensor:
        """f_λ(x_i, x_j) of Eq. 4 for each pair, as the strategy's mixup type (embedding mixup:
        of the L2-normalised embeddings, the paper's f)."""
        if self.mixup == "input":
            return model(mix(lam, x[i], x[j]))
        if self.mixup == "feature":
            head = split_trunk(model.trunk).head
            return model.embedder(head(mix(lam, maps[i], maps[j])))
        unit = Fn.normalize(emb, dim=1)  # f(x) = e/‖e‖ (§3.1)
        return mix(lam, unit[i], unit[j])  # Eq. 4, embedding mixup

    def batch_loss(
        self, model: nn.Module, loss_fn: nn.Module, miner: nn.Module | None, x: Tensor, y: Tensor
    ) -> Tensor:
        kind = loss_kind(loss_fn)
        if kind == "proxy_anchor" and self.pairs == "anc_neg":
            raise ValueError(
                "metrix: pairs='anc_neg' is undefined for proxy_anchor (the anchor is a proxy); "
                "use 'pos_neg' or 'random' (which is pos_neg there)"
            )
        lam = draw_lambda(self.a)
        coin = bool(torch.rand(()) < 0.5)
        anc_neg = self.pairs == "anc_neg" or (self.pairs == "random" and coin)

        maps = None
        if self.mixup == "feature":
            trunk = getattr(model, "trunk", None)
            if trunk is None or not hasattr(model, "embedder"):
                raise ValueError("metrix feature mixup needs a model with .trunk and .embedder")
            with _capture_input(split_trunk(trunk).entry) as got:
                emb = model(x)
            maps = got[0]
        else:
            emb = model(x)
        clean = loss_fn(emb, y, miner(emb, y)) if miner is not None else loss_fn(emb, y)

        dist = loss_fn.distance
        with torch.no_grad():
            if kind == "proxy_anchor":  # anchors: the proxies of the batch's classes
                classes = torch.unique(y)
                pos = classes[:, None] == y[None, :]
                neg, anc_neg = ~pos, False
            else:  # anchors: the batch examples
                same = y[:, None] == y[None, :]
                eye = torch.eye(len(y), dtype=torch.bool, device=y.device)
                pos, neg = same & ~eye, ~same
            hardness = None
            if self.mixup == "input":
                e = emb.detach()
                if kind == "proxy_anchor":
                    sim = dist(loss_fn.proxies[classes].detach(), e)
                else:
                    sim = dist(e, e)
                hardness = sim if dist.is_inverted else -sim
        i, j, rel = self.mixing_pairs(pos, neg, anc_neg, hardness)
        if len(i) == 0:
            return clean
        v = self.mixed_embeddings(model, x, emb, maps, lam, i, j)
        pa = kind == "proxy_anchor"
        mat = dist(v, loss_fn.proxies[classes]).t() if pa else dist(emb, v)  # anchors × mixed
        y_soft = lam * rel.to(mat.dtype)  # mixed label mix_λ(1, 0) = λ for every related pair
        return clean + self.w * soft_loss(loss_fn, mat, y_soft, rel)


@register("metrix")
def metrix(
    *,
    mixup: Mixup = "embedding",
    a: Positive = 2.0,  # λ ~ Beta(a, a) (Eq. 8)
    w: NonNegative = 0.4,  # weight of the mixed loss (Eq. 10)
    pairs: Pairs = "random",
    k: Count = 3,  # hard negatives per anchor, input mixup only
) -> Strategy:
    """Metrix (ICLR 2022): + w · the loss on mixed examples with interpolated labels (Eq. 10)."""
    return Metrix(mixup, a, w, pairs, k)
