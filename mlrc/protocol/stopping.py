"""Stopping a fold early when its trial can no longer beat the incumbent (``search.stop: gain``).

A trial's value is the mean of its fold values, v̄ = (1/n) Σ_j v_j (MLRC §1.6). While fold k
trains, its best validation value so far b(e) (trained epochs ≤ e, the objective's rule) is a
lower bound of its final value v_k; an upper bound is b(e) + G(e) + ε, where G(e) is the later
gain seen at epoch e in the study's complete folds: G(e) = quantile_q over curves of
(final value − best value up to e), and ε (``fold_slack``) how far a fold may end above that.
The trial can still beat the incumbent I (the best complete trial, fold values I_j) only if

    Σ_{j done} (v_j − I_j) + (b(e) + G(e) + ε − I_k) + Σ_{j not started} (A_j − I_j) ≥ 0,

with A_j, what a fold not started may reach, the incumbent's I_j + ``slack`` (``future:
incumbent``) or the best value any complete trial reached on fold j + ``slack`` (``future:
best``, never below I_j + ``slack``). When the
left-hand side is negative the fold stops: the trial is pruned, its partial best counting only
for that decision (never as a reported value). Pure: the search layer builds a
:class:`FoldStop` from the store (or a replay from recorded curves) and the fold trainer asks it
after each validation. Values are validation MAP@R as fractions (similarity-free: a ranking
metric), epochs are the preset's epochs (1 = the first trained one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Curve", "FoldStop", "Incumbent", "later_gains"]

Curve = Sequence[tuple[int, float]]  # (epoch ≥ 1, validation value), epochs ascending


@dataclass(frozen=True)
class Incumbent:
    """The best complete trial when a fold starts: its number, value and fold values."""

    number: int
    value: float
    folds: Mapping[int, float]  # fold index → fold value (the objective of that fold)


def later_gains(
    curves: Sequence[Curve], epochs: Sequence[int], quantile: float
) -> dict[int, float]:
    """G(e) for each epoch e of ``epochs``: the ``quantile`` (1.0: the largest) over ``curves`` of
    (final best − best up to e); a curve that ended before e has gained all it will (0); a curve
    with no validation up to e is left out of G(e). Empty ``curves``: no entry."""
    out: dict[int, float] = {}
    for e in epochs:
        g = [
            max(v for _, v in c) - max(v for t, v in c if t <= e)
            for c in curves
            if c and c[0][0] <= e
        ]
        if g:
            out[e] = float(np.quantile(g, quantile))
    return out


@dataclass(frozen=True)
class FoldStop:
    """What fold ``fold`` of a trial needs to decide, fixed when the fold starts: the values of
    the trial's folds already done, the incumbent, the later gains G(e) and what the folds not
    yet started may add (:mod:`module docs <mlrc.protocol.stopping>`)."""

    fold: int
    ahead: float  # Σ over the folds not started of (A_j − I_j), see the module docstring
    done: Mapping[int, float]  # fold index → value, folds of this trial already complete
    incumbent: Incumbent
    gains: Mapping[int, float]  # epoch → G(e)
    fold_slack: float = 0.0  # ε: how far the fold may end above b(e) + G(e)

    def margin(self, epoch: int, best: float) -> float | None:
        """The left-hand side of the rule at ``epoch`` with best value so far ``best``; None
        where G(e) is unknown (no curve reached that epoch: no decision)."""
        if epoch not in self.gains:
            return None
        inc = self.incumbent.folds
        done = sum(v - inc[j] for j, v in self.done.items())
        return done + best + self.gains[epoch] + self.fold_slack - inc[self.fold] + self.ahead

    def reason(self, epoch: int, best: float) -> str | None:
        """Why the fold stops at ``epoch`` (one line), or None to go on."""
        m = self.margin(epoch, best)
        if m is None or m >= 0:
            return None
        i = self.incumbent
        return (
            f"stopped at epoch {epoch} of fold {self.fold}: best {best:.4f} + later gain "
            f"{self.gains[epoch]:.4f}{f' + slack {self.fold_slack:g}' if self.fold_slack else ''}"
            f" cannot lift the trial to trial {i.number}'s "
            f"{i.value:.4f} (search.stop)"
        )
