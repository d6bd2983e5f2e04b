"""Losses of pytorch-metric-learning, with the reality check's conventions.

The built-in losses that are thin wrappers of that one library live together in this module
(one factory each, no code of their own beyond argument conversion); a loss with code of its own
gets a module of its own (see :mod:`mlrc.methods.losses.mean_field`).

Distances are PML defaults: L2 distance on L2-normalised embeddings for the pair losses
(Contrastive, Triplet margins are distances), cosine similarity for NTXent/MultiSimilarity.
Every factory's docstring (first line: the registry's ``doc``) cites the source and states the
units; angles (ArcFace margin, Angular alpha) are in degrees, as PML takes them. Parameter
annotations are checked at validation (:mod:`mlrc.params`): ``Positive`` where the
formula divides by the value, ``Count`` for bin and centre counts, ``Degrees`` for angles;
margins and scales are any finite number (MLRC searched negative margins).
"""

from __future__ import annotations

import torch.nn.functional as F
from pytorch_metric_learning import losses as L
from pytorch_metric_learning.regularizers import SparseCentersRegularizer, ZeroMeanRegularizer

from mlrc.methods.losses.base import register
from mlrc.params import Count, Degrees, Positive


@register("contrastive", batch="pair", takes_tuples=True)
def contrastive(
    *, num_classes: int, embedding_size: int, pos_margin: float = 0.0, neg_margin: float = 1.0
):
    """Contrastive loss (Hadsell et al.); margins are L2 distances between unit embeddings."""
    return L.ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin)


@register("triplet", batch="pair", takes_tuples=True)
def triplet(*, num_classes: int, embedding_size: int, margin: float = 0.05):
    """Triplet margin loss over all triplets of the batch; margin is an L2 distance."""
    return L.TripletMarginLoss(margin=margin)


@register("ntxent", batch="pair", takes_tuples=True)
def ntxent(*, num_classes: int, embedding_size: int, temperature: Positive = 0.07):
    """NT-Xent (InfoNCE) over cosine similarities."""
    return L.NTXentLoss(temperature=temperature)


@register("multi_similarity", batch="pair", takes_tuples=True)
def multi_similarity(
    *,
    num_classes: int,
    embedding_size: int,
    alpha: Positive = 2.0,  # 1/alpha and 1/beta scale the two log-sum-exp terms
    beta: Positive = 50.0,
    base: float = 0.5,
):
    """Multi-Similarity loss (Wang et al. 2019) over cosine similarities."""
    return L.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)


@register("normalized_softmax", batch="class", takes_tuples=True, has_parameters=True)
def normalized_softmax(*, num_classes: int, embedding_size: int, temperature: Positive = 0.05):
    """Normalized softmax (NormFace) with one learnt weight vector per training class."""
    return L.NormalizedSoftmaxLoss(num_classes, embedding_size, temperature=temperature)


# ---------------------------------------------------------------------------------------------
# The other reality-check losses (notes §1.11, §1.14) and the Revisiting-DML / Proxy-Anchor ones.
# Parameter names and units are PML 2.9's unless a docstring says otherwise.
# ---------------------------------------------------------------------------------------------


@register("proxy_nca", batch="class", takes_tuples=True, has_parameters=True)
def proxy_nca(*, num_classes: int, embedding_size: int, softmax_scale: float = 1.0):
    """ProxyNCA (Movshovitz-Attias et al. 2017): softmax over −softmax_scale·‖x̂ − p̂‖² (squared L2 between unit embedding and unit proxy), own proxy included in the denominator."""
    return L.ProxyNCALoss(num_classes, embedding_size, softmax_scale=softmax_scale)


# MLRC trained β without weight decay
@register("margin", batch="pair", takes_tuples=True, has_parameters=True, loss_weight_decay=0.0)
def margin_loss(*, num_classes: int, embedding_size: int, margin: float = 0.2, beta: float = 1.2):
    """Margin loss (Wu et al. 2017), all triplets: [m + d_ap − β]₊ + [m + β − d_an]₊ with L2 distances between unit embeddings; one learnt β (init ``beta``), ν = 0."""
    return L.MarginLoss(margin=margin, nu=0.0, beta=beta, learn_beta=True)


@register(
    "margin_per_class", batch="pair", takes_tuples=True, has_parameters=True, loss_weight_decay=0.0
)
def margin_per_class(
    *, num_classes: int, embedding_size: int, margin: float = 0.2, beta: float = 1.2
):
    """Margin loss (Wu et al. 2017) with one learnt β per training class (the anchor's), all init ``beta``; L2 distances between unit embeddings, ν = 0."""
    return L.MarginLoss(margin=margin, nu=0.0, beta=beta, learn_beta=True, num_classes=num_classes)


@register("cosface", batch="class", takes_tuples=True, has_parameters=True)
def cosface(*, num_classes: int, embedding_size: int, margin: float = 0.35, scale: float = 64.0):
    """CosFace (Wang et al. 2018): softmax over scale·(cos θ − margin·[target]), cosines between unit embedding and unit class weight; margin is a cosine offset."""
    return L.CosFaceLoss(
        num_classes=num_classes, embedding_size=embedding_size, margin=margin, scale=scale
    )


@register("arcface", batch="class", takes_tuples=True, has_parameters=True)
def arcface(*, num_classes: int, embedding_size: int, margin: Degrees = 28.6, scale: float = 64.0):
    """ArcFace (Deng et al. 2019): softmax over scale·cos(θ + margin) for the target class, θ the angle to the unit class weight; margin in DEGREES (PML), not radians."""
    return L.ArcFaceLoss(num_classes, embedding_size, margin=margin, scale=scale)


@register("fastap", batch="pair", takes_tuples=True)
def fastap(*, num_classes: int, embedding_size: int, num_bins: Count = 10):
    """FastAP (Cakir et al. 2019): 1 − histogram-binned AP per anchor over squared L2 distances between unit embeddings (range [0, 4], ``num_bins`` bins)."""
    return L.FastAPLoss(num_bins=int(num_bins))


class _UnitZeroMeanRegularizer(ZeroMeanRegularizer):
    """|Σ_m x̂_m| of the *L2-normalised* embeddings, averaged over the batch.

    PML ≤ 0.9.8x (the reality check's) normalised the embeddings before the loss, so its SNR
    ``regularizer_weight`` term saw unit embeddings; PML 2.x hands the regulariser the raw ones.
    """

    def compute_loss(self, embeddings):
        return super().compute_loss(F.normalize(embeddings, p=2, dim=1))


@register("snr", batch="pair", takes_tuples=True)
def snr(
    *,
    num_classes: int,
    embedding_size: int,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    regularizer_weight: float = 0.0,
):
    """SNR contrastive (Yuan et al. 2019): margins on the SNR distance Var(x̂_a − x̂)/Var(x̂_a) of unit embeddings, AvgNonZero; + regularizer_weight·mean|Σ_m x̂_m| (zero-mean)."""
    # PML 2.9 has no ``regularizer_weight``: it is embedding_regularizer=ZeroMeanRegularizer()
    # with embedding_reg_weight (here on the normalised embeddings, as in PML 0.9.8x / MLRC).
    return L.SignalToNoiseRatioContrastiveLoss(
        pos_margin=pos_margin,
        neg_margin=neg_margin,
        embedding_regularizer=_UnitZeroMeanRegularizer(),
        embedding_reg_weight=regularizer_weight,
    )


@register("soft_triple", batch="class", takes_tuples=True, has_parameters=True)
def soft_triple(
    *,
    num_classes: int,
    embedding_size: int,
    la: float = 20.0,
    gamma: Positive = 0.1,  # the intra-class softmax is over similarities / gamma
    margin: float = 0.01,
    reg_weight: float = 0.2,
    centers_per_class: Count = 10,
):
    """SoftTriple (Qian et al. 2019): cosine similarities to unit centres, intra-class softmax with 1/gamma, scale la, similarity margin; reg_weight × the paper's centre-merging term."""
    # PML 2.9 has no ``reg_weight``: the paper's regulariser Σ√(2 − 2ψ₁ᵀψ₂)/(C·K·(K−1)) is
    # SparseCentersRegularizer passed as weight_regularizer, scaled by weight_reg_weight.
    centers_per_class = int(centers_per_class)
    reg = (
        SparseCentersRegularizer(num_classes, centers_per_class) if centers_per_class > 1 else None
    )
    return L.SoftTripleLoss(
        num_classes,
        embedding_size,
        centers_per_class=centers_per_class,
        la=la,
        gamma=gamma,
        margin=margin,
        weight_regularizer=reg,
        weight_reg_weight=reg_weight,
    )


@register("proxy_anchor", batch="class", takes_tuples=True, has_parameters=True)
def proxy_anchor(
    *, num_classes: int, embedding_size: int, alpha: float = 32.0, margin: float = 0.1
):
    """Proxy Anchor (Kim et al. 2020, notes/001 Eq. 4): scale alpha, margin = δ on cosine similarities between unit embeddings and unit proxies."""
    return L.ProxyAnchorLoss(num_classes, embedding_size, margin=margin, alpha=alpha)


class _UnitAngularLoss(L.AngularLoss):
    """PML 2.9 normalises only x_a and x_p and uses the raw negatives; the paper (and the PML of
    the reality check) works on the unit sphere, so every embedding is normalised first."""

    def forward(self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None):
        return super().forward(
            F.normalize(embeddings, dim=1),
            labels,
            indices_tuple,
            None if ref_emb is None else F.normalize(ref_emb, dim=1),
            ref_labels,
        )


@register("angular", batch="pair", takes_tuples=True)
def angular(*, num_classes: int, embedding_size: int, alpha: Degrees = 40.0):
    """Angular loss (Wang et al. 2017), angular term only, on unit embeddings (all normalised); alpha in DEGREES (PML), no N-pair term or L2 penalty (unlike Roth et al.)."""
    return _UnitAngularLoss(alpha=alpha)


@register("lifted_structure", batch="pair", takes_tuples=True)
def lifted_structure(
    *, num_classes: int, embedding_size: int, pos_margin: float = 0.0, neg_margin: float = 1.0
):
    """Lifted structure (Song et al. 2016): ½[LSE_n(neg_margin − d_n) + d_ap − pos_margin]₊² per positive pair; L2 distances between unit embeddings."""
    return L.LiftedStructureLoss(neg_margin=neg_margin, pos_margin=pos_margin)


@register("generalized_lifted_structure", batch="pair", takes_tuples=True)
def generalized_lifted_structure(
    *, num_classes: int, embedding_size: int, pos_margin: float = 0.0, neg_margin: float = 1.0
):
    """Generalised lifted structure (Hermans et al. 2017): [LSE_p(d_ap − pos_margin) + LSE_n(neg_margin − d_an)]₊ per anchor; L2 distances between unit embeddings (no ν penalty)."""
    return L.GeneralizedLiftedStructureLoss(neg_margin=neg_margin, pos_margin=pos_margin)


@register("npairs", batch="pair", takes_tuples=True)
def npairs(*, num_classes: int, embedding_size: int):
    """N-pair (Sohn 2016): cross-entropy over dot products of *L2-normalised* embeddings (PML default; temperature 1, no L2 penalty), one pair per class."""
    return L.NPairsLoss()


class _HistogramLoss(L.HistogramLoss):
    """PML's HistogramLoss, with similarities clamped into [−1, 1): PML 2.9 indexes one bin past
    the end for a similarity of exactly 1 (e.g. a duplicate image) and raises IndexError."""

    def compute_density(self, distances):
        top = 1.0 - 1e-4 * self.delta  # < 1 even after PML's float32 cast; error ≤ 1e-4 bin
        return super().compute_density(distances.clamp(-1.0, top))


@register("histogram", batch="pair", takes_tuples=True)
def histogram(*, num_classes: int, embedding_size: int, n_bins: Count = 100):
    """Histogram loss (Ustinova & Lempitsky 2016): P(negative more similar than positive) from soft histograms of cosine similarities; n_bins intervals on [−1, 1] (Δ = 2/n_bins)."""
    return _HistogramLoss(n_bins=int(n_bins))
