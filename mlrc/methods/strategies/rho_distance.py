"""ρ-regularisation (Roth et al., "Revisiting Training Strategies ... in DML", ICML 2020, §5.1;
notes/000-revisiting.md §4), as its reference code's ``rho_distance`` tuple miner does it.

For every anchor a of the batch that has another same-class sample (others are skipped): with
probability p_switch the tuple is *switched*: positive := a itself (d(a, p) = 0) and negative :=
a random other sample of a's class, so the loss's "push the negative away" term pushes a
same-class sample away; otherwise positive := a random other same-class sample and negative :=
a distance-weighted negative (Wu et al. 2017): sampled ∝ 1/q(d), with
q(d) ∝ d^{n−2} (1 − d²/4)^{(n−3)/2} the density of distances between uniform points on the unit
sphere S^{n−1}, d clamped below at ``lower_cutoff`` (0.5) and no upper cutoff (the reference code
found one slightly worse). Distances are L2 between L2-normalised embeddings; n = embedding size.
The tuples are passed to the loss as (anchor, positive, negative) indices, so the strategy works
with tuple losses (contrastive, triplet, margin, snr, ...). Randomness comes from torch's global
generator, which the fold trainer seeds and checkpoints.

Batches need positive pairs: an anchor without another sample of its class is skipped, so with
the "class" batch kind (32 classes × 1 image: proxy and classification losses) no tuple would be
mined and the plain loss would run under the name ρ. Validation refuses that combination
(``positive_pairs``); it is accepted where the batch has m ≥ 2 images per class (or SPC-R).
"""

from __future__ import annotations

import torch
import torch.nn.functional as Fn
from torch import Tensor, nn

from mlrc.methods.strategies.base import Strategy, register
from mlrc.params import Positive, Probability


def distance_weights(d: Tensor, dim: int, lower_cutoff: float = 0.5) -> Tensor:
    """Unnormalised sampling weights 1/q(d) of Wu et al., computed in log space (max → 1)."""
    d = d.clamp(min=lower_cutoff, max=2.0 - 1e-4)
    log_inv_q = (2.0 - dim) * torch.log(d) - (dim - 3) / 2.0 * torch.log(1.0 - 0.25 * d * d)
    return torch.exp(log_inv_q - log_inv_q.max())


class RhoDistance(Strategy):
    uses_miner = False
    positive_pairs = "its tuples pair each anchor with another sample of its class"

    def __init__(self, p_switch: float, lower_cutoff: float) -> None:
        super().__init__()
        if not 0.0 <= p_switch <= 1.0:
            raise ValueError(f"p_switch must be in [0, 1], got {p_switch}")
        self.p_switch, self.lower_cutoff = p_switch, lower_cutoff

    @torch.no_grad()
    def mine(self, emb: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(anchors, positives, negatives) index tensors, one tuple per eligible anchor."""
        x = Fn.normalize(emb.float(), dim=1)
        d = torch.cdist(x, x)
        same = y[:, None] == y[None, :]
        eye = torch.eye(len(y), dtype=torch.bool, device=y.device)
        other_same = same & ~eye
        anchors = torch.nonzero(other_same.any(1)).flatten()
        a_list, p_list, n_list = [], [], []
        for a in anchors.tolist():
            mates = torch.nonzero(other_same[a]).flatten()
            mate = mates[torch.randint(len(mates), (1,), device=y.device)]
            if torch.rand(1).item() < self.p_switch:  # switched tuple: push a same-class sample
                a_list.append(a), p_list.append(a), n_list.append(int(mate))
                continue
            negatives = torch.nonzero(~same[a]).flatten()
            if len(negatives) == 0:
                continue
            w = distance_weights(d[a, negatives], x.shape[1], self.lower_cutoff)
            n = negatives[torch.multinomial(w, 1)]
            a_list.append(a), p_list.append(int(mate)), n_list.append(int(n))
        dev = y.device
        return (
            torch.tensor(a_list, dtype=torch.long, device=dev),
            torch.tensor(p_list, dtype=torch.long, device=dev),
            torch.tensor(n_list, dtype=torch.long, device=dev),
        )

    def batch_loss(
        self, model: nn.Module, loss_fn: nn.Module, miner: nn.Module | None, x: Tensor, y: Tensor
    ) -> Tensor:
        emb = model(x)
        return loss_fn(emb, y, self.mine(emb.detach(), y))


@register("rho_distance")
def rho_distance(*, p_switch: Probability = 0.2, lower_cutoff: Positive = 0.5) -> Strategy:
    """ρ-regularisation (Revisiting DML §5.1): distance-weighted tuples, switched with p_switch."""
    # lower_cutoff > 0: the weights take log d, d (L2, unit sphere) clamped below at lower_cutoff
    return RhoDistance(p_switch, lower_cutoff)
