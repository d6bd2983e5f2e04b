"""Densely-Anchored Sampling, DAS (Liu et al., "Densely-Anchored Sampling for Deep Metric
Learning", ECCV 2022; notes/002-das.md §1), as its Algorithm 1 and reference code do it.

Every real embedding v (label c) of the batch is an anchor for T produced embeddings
v'_t = s_t ⊙ v + b_t, labelled c, built from two per-class statistics of the training run:

- DFS (Discriminative Feature Scaling). A Frequency Recorder Matrix P ∈ ℕ^{C×d} (zeros at the
  start, never decayed): for each real v of class c, P[c, k] += 1 for the K largest (signed)
  entries k of v (Eq. 7). The class mask M[c] marks the K largest entries of row P[c] (Eq. 8;
  ties broken by ``torch.topk``). Scale s = γ ⊙ M[c] + (1 − M[c]) with
  γ ~ U[1 − r_s, 1 + r_s]^d drawn afresh for every produced embedding (Eq. 9): only the class's
  K "discriminative" dimensions are rescaled, every other one is multiplied by exactly 1.
- MTS (Memorized Transformation Shifting). For each class c of the batch, the intra-class
  differences t = v_i − v_j over all ordered pairs i ≠ j (row-major order; all-zero rows dropped,
  as the reference code does) (Eq. 10) are pushed into a per-class FIFO bank of capacity Z, so
  the bank keeps the Z most recent ones (Eq. 11). Shift b = r_b · t with t drawn uniformly from
  the bank of c, a fresh draw for each produced embedding; b = 0 while the bank is empty (Eq. 12).

Per batch, as Algorithm 1: update P, then draw the scales; update the banks, then draw the shifts
(the current batch's statistics are already used); produce, pool, mine, loss:
``loss_fn(all, all_y, miner(all, all_y))`` over the (1 + T)·B rows
``[real; produced_1; …; produced_T]``, the labels repeated. Produced embeddings can be anchors,
positives or negatives; the loss and the miner are unchanged.

Choices, where the text leaves it open or the note, paper and code differ:

- Followed the paper, not the code defaults: γ ~ U[1 − r_s, 1 + r_s] with r_s = 0.01 (Eq. 9; the
  code's default range is [0.5, 2.0], the paper's CUB/CARS runs pass [0.99, 1.01]); K = 4 (the
  main-paper default; its Table 1 used K = 8); r_b = 0.01; T = 3; Z = 10.
- Produced embeddings carry no gradient (built from the detached batch under ``no_grad``), as
  every paper run script does (``--detach``; the paper text does not say). Gradients reach the
  model only through the real embeddings they are compared with. The code-only "aux loss" mode
  (loss on the real batch + loss on the pool) is not implemented.
- Normalisation (``normalize``, not searched). True (default): as the paper's §3 equations, DAS
  works on the unit sphere: P, the differences and the production use v/‖v‖ and each produced
  embedding is re-normalised (Algorithm 1, step 4). The real embeddings go to the loss as the
  model gives them (un-normalised); every mlrc loss normalises internally (PML distances), so
  this is the paper's set-up, and T = 0 is exactly the plain step. False: raw embeddings in and
  out, no normalisation (the code's ``--das_not_normalize``, used for GenLifted and N-pair).
- Batches need positive pairs: MTS fills a class's bank with the differences of two of its
  samples in one batch (Eq. 10), so with the "class" batch kind (32 classes × 1 image: proxy and
  classification losses) every bank stays empty, b = 0, and only DFS scaling would run under
  the name DAS. Validation refuses that combination (``positive_pairs``); it is accepted where
  the batch has m ≥ 2 images per class (or SPC-R).
- Labels index the state: the fold trainer remaps training classes to 0..C−1 and builds a fresh
  strategy per fold, so P and the banks are per fold; they grow to the largest label seen.
- Randomness (γ, bank draws) comes from torch's global CPU generator (drawn on the CPU, then
  moved), which the trainer seeds and checkpoints; the same draws on any device.
- State: P (``frm``), the banks (``bank``, ``bank_size``, ``bank_ptr``) are registered buffers,
  so ``state_dict()``/``load_state_dict()`` carry them (``load_state_dict`` resizes them); the
  fold trainer checkpoints the strategy's state with the model, so a resumed fold continues with
  the same P and banks.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
import torch.nn.functional as Fn
from torch import Tensor, nn

from mlrc.methods.strategies.base import Strategy, register
from mlrc.params import Count, NonNegative, Range

_BUFFERS = ("frm", "bank", "bank_size", "bank_ptr")


class DenselyAnchoredSampling(Strategy):
    uses_miner = True  # the study's miner (if any) mines the pooled real + produced batch
    positive_pairs = "its MTS banks hold differences of same-class samples, Eq. 10"

    frm: Tensor  # C × d counts (P)
    bank: Tensor  # C × Z × d differences
    bank_size: Tensor  # C: valid rows in each bank (≤ Z)
    bank_ptr: Tensor  # C: next row to overwrite

    def __init__(self, T: int, K: int, Z: int, r_s: float, r_b: float, normalize: bool) -> None:
        super().__init__()
        for name, v, lo in (("T", T, 0), ("K", K, 1), ("Z", Z, 1)):
            if int(v) != v or v < lo:
                raise ValueError(f"{name} must be an integer ≥ {lo}, got {v}")
        if not 0.0 <= r_s < 1.0:
            raise ValueError(f"r_s must be in [0, 1), got {r_s}")
        if r_b < 0.0:
            raise ValueError(f"r_b must be ≥ 0, got {r_b}")
        self.T, self.K, self.Z = int(T), int(K), int(Z)
        self.r_s, self.r_b, self.normalize = float(r_s), float(r_b), bool(normalize)
        self.register_buffer("frm", torch.zeros(0, 0, dtype=torch.long))
        self.register_buffer("bank", torch.zeros(0, self.Z, 0))
        self.register_buffer("bank_size", torch.zeros(0, dtype=torch.long))
        self.register_buffer("bank_ptr", torch.zeros(0, dtype=torch.long))

    def extra_repr(self) -> str:
        return (
            f"T={self.T}, K={self.K}, Z={self.Z}, r_s={self.r_s}, r_b={self.r_b}, "
            f"normalize={self.normalize}"
        )

    # ---- state ---------------------------------------------------------------------------------

    def _grow(self, num_classes: int, dim: int, device: torch.device) -> None:
        """Make room for labels 0..num_classes−1 of dimension ``dim`` (new rows are empty)."""
        c, d = self.frm.shape
        if c and d != dim:
            raise ValueError(f"DAS state has embedding size {d}, got embeddings of size {dim}")
        if dim < self.K:
            raise ValueError(f"K = {self.K} exceeds the embedding size {dim}")
        if c >= num_classes and d == dim:
            return
        n = num_classes - c

        def pad(t: Tensor, shape: tuple[int, ...]) -> Tensor:
            return torch.cat([t.to(device), torch.zeros(shape, dtype=t.dtype, device=device)])

        self.frm = pad(self.frm.reshape(c, dim), (n, dim))
        self.bank = pad(self.bank.reshape(c, self.Z, dim), (n, self.Z, dim))
        self.bank_size = pad(self.bank_size, (n,))
        self.bank_ptr = pad(self.bank_ptr, (n,))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for name in _BUFFERS:  # the state grows with the run: take the saved shapes
            if prefix + name in state_dict:
                saved = state_dict[prefix + name]
                setattr(self, name, torch.empty_like(saved, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    # ---- DFS -----------------------------------------------------------------------------------

    @torch.no_grad()
    def update_frm(self, v: Tensor, y: Tensor) -> None:
        """Eq. 7: P[y_i, k] += 1 for the K largest entries k of each v_i."""
        top = v.topk(self.K, dim=1).indices
        self.frm.index_put_((y[:, None].expand_as(top), top), torch.ones_like(top), accumulate=True)

    @torch.no_grad()
    def class_mask(self, y: Tensor) -> Tensor:
        """Eq. 8: M[y_i] (len(y) × d, 0/1), the K most frequent dimensions of each class row of P."""
        rows = self.frm[y]
        mask = torch.zeros(rows.shape, dtype=torch.float32, device=rows.device)
        return mask.scatter_(1, rows.topk(self.K, dim=1).indices, 1.0)

    @torch.no_grad()
    def scale_factors(self, y: Tensor) -> Tensor:
        """Eq. 9: T × len(y) × d scales, γ ~ U[1 − r_s, 1 + r_s] on M[y_i], exactly 1 elsewhere."""
        mask = self.class_mask(y)
        u = torch.rand(self.T, *mask.shape).to(mask.device)
        gamma = (1.0 - self.r_s) + 2.0 * self.r_s * u
        return mask * gamma + (1.0 - mask)

    # ---- MTS -----------------------------------------------------------------------------------

    @torch.no_grad()
    def enqueue(self, c: int, t: Tensor) -> None:
        """Eq. 11: push the rows of ``t`` (in order) into class c's FIFO bank of capacity Z."""
        t = t[-self.Z :]  # of more than Z new rows, only the last Z survive
        m = len(t)
        if m == 0:
            return
        ptr = int(self.bank_ptr[c])
        rows = (ptr + torch.arange(m, device=self.bank.device)) % self.Z
        self.bank[c, rows] = t.to(self.bank.dtype)
        self.bank_ptr[c] = (ptr + m) % self.Z
        self.bank_size[c] = min(int(self.bank_size[c]) + m, self.Z)

    @torch.no_grad()
    def update_banks(self, v: Tensor, y: Tensor) -> None:
        """Eq. 10–11: all ordered intra-class differences v_i − v_j (i ≠ j, non-zero) → banks."""
        for c in torch.unique(y).tolist():
            vc = v[y == c]
            t = (vc[:, None, :] - vc[None, :, :]).reshape(-1, vc.shape[1])
            self.enqueue(c, t[t.abs().sum(1) > 0])

    @torch.no_grad()
    def shift_factors(self, y: Tensor) -> Tensor:
        """Eq. 12: T × len(y) × d shifts r_b · t, t uniform from bank y_i (0 if that bank is empty)."""
        size = self.bank_size[y]
        u = torch.rand(self.T, len(y)).to(y.device)
        row = (u * size).long().clamp(max=self.Z - 1)
        t = self.bank[y[None, :].expand_as(row), row]
        return self.r_b * t * (size > 0)[None, :, None]

    # ---- production ----------------------------------------------------------------------------

    @torch.no_grad()
    def produce(self, emb: Tensor, y: Tensor) -> Tensor:
        """Update P and the banks with the batch, then T·B produced embeddings (no gradient),
        laid out [produced_1; …; produced_T] (each block in batch order)."""
        v = emb.detach().float()
        if self.normalize:
            v = Fn.normalize(v, dim=1)
        self._grow(int(y.max()) + 1, v.shape[1], v.device)
        self.update_frm(v, y)
        s = self.scale_factors(y)
        self.update_banks(v, y)
        b = self.shift_factors(y)
        out = s * v[None] + b
        if self.normalize:
            out = Fn.normalize(out, dim=2)
        return out.reshape(-1, v.shape[1]).to(emb.dtype)

    def pool(self, emb: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(1 + T)·B embeddings [real; produced] and their labels (produced: the anchor's)."""
        return torch.cat([emb, self.produce(emb, y)]), y.repeat(1 + self.T)

    def batch_loss(
        self, model: nn.Module, loss_fn: nn.Module, miner: nn.Module | None, x: Tensor, y: Tensor
    ) -> Tensor:
        emb = model(x)
        # T = 0: nothing produced (and no state kept): exactly the plain step
        all_emb, all_y = self.pool(emb, y) if self.T > 0 else (emb, y)
        if miner is not None:
            return loss_fn(all_emb, all_y, miner(all_emb, all_y))
        return loss_fn(all_emb, all_y)


@register("das")
def das(
    *,
    T: Annotated[int, Range(ge=0)] = 3,  # produced embeddings per real one (0: the plain step)
    K: Count = 4,  # DFS: discriminative dimensions per class (≤ embedding size)
    Z: Count = 10,  # MTS: bank capacity per class
    r_s: Annotated[float, Range(ge=0, lt=1)] = 0.01,  # γ ~ U[1 − r_s, 1 + r_s] (Eq. 9)
    r_b: NonNegative = 0.01,  # shift b = r_b · t (Eq. 12)
    normalize: bool = True,
) -> Strategy:
    """Densely-Anchored Sampling (Liu et al. 2022): T detached DFS-scaled, MTS-shifted copies per embedding, pooled before miner and loss."""
    return DenselyAnchoredSampling(T, K, Z, r_s, r_b, normalize)
