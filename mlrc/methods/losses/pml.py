"""Losses of pytorch-metric-learning, with the reality check's conventions.

Distances are PML defaults: L2 distance on L2-normalised embeddings for the pair losses
(Contrastive, Triplet margins are distances), cosine similarity for NTXent/MultiSimilarity.
"""

from __future__ import annotations

from pytorch_metric_learning import losses as L

from mlrc.methods.losses import register


@register("contrastive", batch="pair")
def contrastive(
    *, num_classes: int, embedding_size: int, pos_margin: float = 0.0, neg_margin: float = 1.0
):
    """Contrastive loss (Hadsell et al.); margins are L2 distances between unit embeddings."""
    return L.ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin)


@register("triplet", batch="pair")
def triplet(*, num_classes: int, embedding_size: int, margin: float = 0.05):
    """Triplet margin loss over all triplets of the batch; margin is an L2 distance."""
    return L.TripletMarginLoss(margin=margin)


@register("ntxent", batch="pair")
def ntxent(*, num_classes: int, embedding_size: int, temperature: float = 0.07):
    """NT-Xent (InfoNCE) over cosine similarities."""
    return L.NTXentLoss(temperature=temperature)


@register("multi_similarity", batch="pair")
def multi_similarity(
    *,
    num_classes: int,
    embedding_size: int,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
):
    """Multi-Similarity loss (Wang et al. 2019) over cosine similarities."""
    return L.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)


@register("normalized_softmax", batch="class", has_parameters=True)
def normalized_softmax(*, num_classes: int, embedding_size: int, temperature: float = 0.05):
    """Normalized softmax (NormFace) with one learnt weight vector per training class."""
    return L.NormalizedSoftmaxLoss(num_classes, embedding_size, temperature=temperature)
