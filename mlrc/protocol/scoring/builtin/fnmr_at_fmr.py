"""FNMR@FMR: false non-match rate at a false match rate (ISO/IEC 19795-1, verification)."""

from __future__ import annotations

import numpy as np

from mlrc.params import Probability
from mlrc.protocol.scoring.base import PairScores, register
from mlrc.protocol.scoring.pairs import allowed_false_matches


@register(
    "fnmr_at_fmr",
    kind="pairs",
    depth="fmr",
    param="fmr",
    key="fnmr_at_fmr_{fmr}",
    higher_is_better=False,
)
def fnmr_at_fmr(pairs: PairScores, *, fmr: Probability) -> float:
    """FNMR at the threshold τ where at most a fraction ``fmr`` of impostor pairs match.

    A pair matches if its similarity s > τ, τ = the (⌊fmr·N⌋+1)-th largest impostor score
    (N impostor pairs), so FMR(τ) ≤ fmr; FNMR = genuine pairs with s ≤ τ / genuine pairs
    (a genuine pair tied with τ is a non-match). fmr·N ≥ N: every pair matches, FNMR = 0.
    """
    allowed = allowed_false_matches(fmr, pairs.num_impostor)
    if allowed >= pairs.num_impostor:
        return 0.0
    tau = pairs.impostor_top[allowed]
    return float(np.mean(pairs.genuine <= tau))  # FNMR(τ) = |{genuine: s ≤ τ}| / |genuine|
