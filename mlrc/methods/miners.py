"""Miner registry: PML miners by name. A study names at most one (``miner: {name, params, search}``).

A miner picks the pairs/triplets of a batch that a PML loss then uses (``loss(emb, labels,
miner(emb, labels))``); losses of our own (the mean-field losses) take no miner. Margins are
distances between L2-normalised embeddings unless stated otherwise. Default search spaces live in
``studies/spaces/miners/<name>.yaml``; in a study their parameters are named ``miner.<param>``.
"""

from __future__ import annotations

from typing import Literal

from pytorch_metric_learning import miners as M
from torch import nn

from mlrc.registry import Registry

MINERS: Registry[nn.Module] = Registry("miner", group="mlrc.miners")
PREFIX = "miner."

available = MINERS.available
params = MINERS.params  # accepted parameters of a miner and their defaults
param_types = MINERS.param_types  # their declared types (mlrc.params)
build = MINERS.build  # build(name, **params); an unknown parameter is a TypeError naming them


@MINERS.register("multi_similarity")
def multi_similarity(*, epsilon: float = 0.1) -> nn.Module:
    """MultiSimilarityMiner (Wang et al. 2019): cosine-similarity pairs within ε of the hardest."""
    return M.MultiSimilarityMiner(epsilon=epsilon)


@MINERS.register("triplet_margin")
def triplet_margin(
    *,
    margin: float = 0.2,
    type_of_triplets: Literal["all", "hard", "semihard", "easy"] = "semihard",
) -> nn.Module:
    """TripletMarginMiner: triplets violating the L2 margin; type all | hard | semihard | easy."""
    return M.TripletMarginMiner(margin=margin, type_of_triplets=type_of_triplets)


@MINERS.register("distance_weighted")
def distance_weighted(*, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4) -> nn.Module:
    """DistanceWeightedMiner (Wu et al. 2017): negatives sampled ∝ 1/q(d), L2 distance cutoffs."""
    return M.DistanceWeightedMiner(cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff)


@MINERS.register("batch_hard")
def batch_hard() -> nn.Module:
    """BatchHardMiner (Hermans et al. 2017): hardest positive and negative per anchor."""
    return M.BatchHardMiner()


@MINERS.register("pair_margin")
def pair_margin(*, pos_margin: float = 0.2, neg_margin: float = 0.8) -> nn.Module:
    """PairMarginMiner: positives farther than pos_margin, negatives closer than neg_margin (L2)."""
    return M.PairMarginMiner(pos_margin=pos_margin, neg_margin=neg_margin)
