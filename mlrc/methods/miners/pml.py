"""Miners of pytorch-metric-learning, registered by name.

They are thin wrappers of that one library (one factory each, converting arguments only), so
they live together in this module; a miner with code of its own gets a module of its own.
Margins are distances between L2-normalised embeddings unless stated otherwise.
"""

from __future__ import annotations

from typing import Literal

from pytorch_metric_learning import miners as M

from mlrc.methods.miners.base import Miner, register


@register("multi_similarity")
def multi_similarity(*, epsilon: float = 0.1) -> Miner:
    """MultiSimilarityMiner (Wang et al. 2019): cosine-similarity pairs within ε of the hardest."""
    return M.MultiSimilarityMiner(epsilon=epsilon)


@register("triplet_margin")
def triplet_margin(
    *,
    margin: float = 0.2,
    type_of_triplets: Literal["all", "hard", "semihard", "easy"] = "semihard",
) -> Miner:
    """TripletMarginMiner: triplets violating the L2 margin; type all | hard | semihard | easy."""
    return M.TripletMarginMiner(margin=margin, type_of_triplets=type_of_triplets)


@register("distance_weighted")
def distance_weighted(*, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4) -> Miner:
    """DistanceWeightedMiner (Wu et al. 2017): negatives sampled ∝ 1/q(d), L2 distance cutoffs."""
    return M.DistanceWeightedMiner(cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff)


@register("batch_hard")
def batch_hard() -> Miner:
    """BatchHardMiner (Hermans et al. 2017): hardest positive and negative per anchor."""
    return M.BatchHardMiner()


@register("pair_margin")
def pair_margin(*, pos_margin: float = 0.2, neg_margin: float = 0.8) -> Miner:
    """PairMarginMiner: positives farther than pos_margin, negatives closer than neg_margin (L2)."""
    return M.PairMarginMiner(pos_margin=pos_margin, neg_margin=neg_margin)
