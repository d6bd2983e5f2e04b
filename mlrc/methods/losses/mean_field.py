"""Losses of "Mean Field Theory in Deep Metric Learning" (Furusawa; notes/004-mean-field.md §2).

Conventions (issue #4, "batch form"): F_i = x_i/‖x_i‖, M_c = mean_fields[c]/‖mean_fields[c]‖,
d(a, b) = 1 − a·b (cosine distance, in [0, 2]); the margins m_P, m_N and δ are *distance*
margins (the authors' code uses a similarity threshold base = 1 − δ). B_c = batch items of class c,
K = classes present in the batch, C = num_classes (the fold's training classes).

Deviations from the printed paper, following the notes: Eq. 8's negative term uses M_{c'} (the
printed M_c is a typo; the authors' code does the same); sums over classes run over the classes
present in the batch, as in the code. Everything is in log-sum-exp/softplus form so that β = 80
cannot overflow in float32; memory and time are O(B·C·D) per batch for the mean-field losses
(plus O(C²·D) for the mean-field regulariser, computed only when λ_MF > 0).

The three losses of the paper share their distance and mean-field code, so they are one module
(grouped by source) rather than three.
"""

from __future__ import annotations

import torch
import torch.nn.functional as Fn
from torch import Tensor, nn

from mlrc.methods.losses.base import register
from mlrc.params import NonNegative, Positive


def segment_logsumexp(values: Tensor, segment: Tensor, n_segments: int) -> Tensor:
    """log Σ_{i: segment[i] = s} exp(values[i]) along dim 0, for s in 0..n_segments−1.

    ``values`` is (N, ...) and ``segment`` (N,) holds segment ids. Empty segments give −inf.
    Stable: each segment is shifted by its own (detached) maximum.
    """
    shape = (n_segments, *values.shape[1:])
    index = segment.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    m = torch.full(shape, -torch.inf, dtype=values.dtype, device=values.device)
    m = m.scatter_reduce(0, index, values.detach(), reduce="amax", include_self=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.zeros(shape, dtype=values.dtype, device=values.device)
    s = s.scatter_add(0, index, torch.exp(values - m_safe.gather(0, index)))
    return torch.log(s) + m_safe


def _present(labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(classes K present, position of each item's class in K, |B_c| for c in K)."""
    K, pos, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return K, pos, counts


class _MeanFields(nn.Module):
    """Holds ``mean_fields`` (num_classes × embedding_size), N(0, 1) initialised."""

    def __init__(self, num_classes: int, embedding_size: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.mean_fields = nn.Parameter(torch.randn(num_classes, embedding_size))

    def unit_fields(self) -> Tensor:
        return Fn.normalize(self.mean_fields, dim=1)

    def field_distances(self) -> Tensor:
        """d(M_c, M_c') for all classes (C × C)."""
        M = self.unit_fields()
        return 1.0 - M @ M.T


class MeanFieldContrastive(_MeanFields):
    """MFCont, Eq. 8:
    1/|K| Σ_{c∈K} 1/|B_c| Σ_{i∈B_c} ([d(F_i,M_c) − m_P]_+ + Σ_{c'≠c} [m_N − d(F_i,M_{c'})]_+)
    + λ_MF/C Σ_{c≠c'} [m_N − d(M_c,M_{c'})]_+²."""

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        pos_margin: float,
        neg_margin: float,
        lambda_mf: float,
    ) -> None:
        super().__init__(num_classes, embedding_size)
        self.m_P, self.m_N, self.lambda_mf = pos_margin, neg_margin, lambda_mf

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        F = Fn.normalize(embeddings, dim=1)
        d = 1.0 - F @ self.unit_fields().T  # (B, C)
        target = Fn.one_hot(labels, self.num_classes).bool()
        pos = torch.relu(d[target] - self.m_P)  # (B,)
        neg = torch.relu(self.m_N - d).masked_fill(target, 0.0).sum(1)  # (B,)
        K, pos_in_K, counts = _present(labels)
        weight = 1.0 / (len(K) * counts[pos_in_K].to(d.dtype))  # 1/(|K|·|B_{y_i}|)
        loss = (weight * (pos + neg)).sum()
        if self.lambda_mf > 0:
            off = ~torch.eye(self.num_classes, dtype=torch.bool, device=d.device)
            hinge = torch.relu(self.m_N - self.field_distances())[off]
            loss = loss + self.lambda_mf / self.num_classes * (hinge**2).sum()
        return loss


class ClassWiseMultiSimilarity(nn.Module):
    """CWMS, Eq. 9 (pairs i = j included in the positive sum):
    1/(α|K|) Σ_{c∈K} log(1 + Σ_{i,j∈B_c} e^{α(d_ij−δ)} / (2|B_c|²))
    + 1/(2β|K|) Σ_{c≠c'∈K} log(1 + Σ_{i∈B_c,j∈B_c'} e^{−β(d_ij−δ)} / (|B_c||B_c'|))."""

    def __init__(self, alpha: float, beta: float, delta: float) -> None:
        super().__init__()
        self.alpha, self.beta, self.delta = alpha, beta, delta

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        F = Fn.normalize(embeddings, dim=1)
        d = 1.0 - F @ F.T  # (B, B)
        K, pos_in_K, counts = _present(labels)
        k = len(K)
        pair = (pos_in_K[:, None] * k + pos_in_K[None, :]).reshape(-1)  # class-pair id of (i, j)
        n = counts.to(d.dtype)
        size = (n[:, None] * n[None, :]).reshape(-1)  # |B_c||B_c'|
        lse_pos = segment_logsumexp((self.alpha * (d - self.delta)).reshape(-1), pair, k * k)
        lse_neg = segment_logsumexp((-self.beta * (d - self.delta)).reshape(-1), pair, k * k)
        diag = torch.eye(k, dtype=torch.bool, device=d.device).reshape(-1)
        pos = Fn.softplus(lse_pos[diag] - torch.log(2.0 * size[diag])).sum()
        neg = Fn.softplus(lse_neg[~diag] - torch.log(size[~diag])).sum()
        return pos / (self.alpha * k) + neg / (2.0 * self.beta * k)


class MeanFieldClassWiseMultiSimilarity(_MeanFields):
    """MFCWMS, Eq. 10, with A[c,c'] = 1/|B_c| Σ_{i∈B_c} e^{−β(d(F_i,M_{c'})−δ)} for c ∈ K, else 0:
    1/(α|K|) Σ_{c∈K} log(1 + 1/|B_c| Σ_{i∈B_c} e^{α(d(F_i,M_c)−δ)})
    + 1/(2β|K|) Σ_{c≠c'} log(1 + A[c,c'] + A[c',c])
    + λ_MF/C Σ_{c≠c'} (log(1 + e^{−β(d(M_c,M_{c'})−δ)}))²."""

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        alpha: float,
        beta: float,
        delta: float,
        lambda_mf: float,
    ) -> None:
        super().__init__(num_classes, embedding_size)
        self.alpha, self.beta, self.delta, self.lambda_mf = alpha, beta, delta, lambda_mf

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        F = Fn.normalize(embeddings, dim=1)
        d = 1.0 - F @ self.unit_fields().T  # (B, C): d(F_i, M_c)
        K, pos_in_K, counts = _present(labels)
        k, C = len(K), self.num_classes
        log_n = torch.log(counts.to(d.dtype))
        # positive: per c ∈ K, log-mean over i ∈ B_c of e^{α(d(F_i, M_c) − δ)}
        own = d.gather(1, labels[:, None]).squeeze(1)
        lse_pos = segment_logsumexp(self.alpha * (own - self.delta), pos_in_K, k) - log_n
        pos = Fn.softplus(lse_pos).sum()
        # negative: log A[c, c'] for c ∈ K (rows), all c' (columns); −inf rows for absent c
        log_A = segment_logsumexp(-self.beta * (d - self.delta), pos_in_K, k) - log_n[:, None]
        in_K = torch.zeros(C, dtype=torch.bool, device=d.device)
        in_K[K] = True
        # pairs with c ∈ K, c' ∉ K (and their mirror images, equal by symmetry): log(1 + A[c,c'])
        neg = 2.0 * Fn.softplus(log_A[:, ~in_K]).sum()
        # pairs with both in K, c ≠ c': log(1 + A[c,c'] + A[c',c])
        block = log_A[:, K]  # (k, k): A[c, c'] for c, c' ∈ K
        zeros = torch.zeros_like(block)
        both = torch.logsumexp(torch.stack([zeros, block, block.T]), dim=0)
        off = ~torch.eye(k, dtype=torch.bool, device=d.device)
        neg = neg + both[off].sum()
        loss = pos / (self.alpha * k) + neg / (2.0 * self.beta * k)
        if self.lambda_mf > 0:
            off_C = ~torch.eye(C, dtype=torch.bool, device=d.device)
            reg = Fn.softplus(-self.beta * (self.field_distances() - self.delta))[off_C]
            loss = loss + self.lambda_mf / C * (reg**2).sum()
        return loss


@register("mean_field_contrastive", batch="class", takes_tuples=False, has_parameters=True)
def mean_field_contrastive(
    *,
    num_classes: int,
    embedding_size: int,
    pos_margin: float = 0.02,
    neg_margin: float = 0.3,
    lambda_mf: NonNegative = 0.0,  # the regulariser is skipped (not negated) when λ_MF ≤ 0
) -> nn.Module:
    """MFCont (mean-field paper Eq. 8); margins are cosine distances; defaults as in the paper."""
    return MeanFieldContrastive(num_classes, embedding_size, pos_margin, neg_margin, lambda_mf)


@register("class_wise_multi_similarity", batch="pair", takes_tuples=False)
def class_wise_multi_similarity(
    *,
    num_classes: int,
    embedding_size: int,
    alpha: Positive = 0.01,  # 1/α and 1/(2β) scale the two terms (Eq. 9)
    beta: Positive = 80.0,
    delta: float = 0.8,
) -> nn.Module:
    """CWMS (mean-field paper Eq. 9); δ is a cosine-distance margin (code's base = 1 − δ)."""
    return ClassWiseMultiSimilarity(alpha, beta, delta)


@register(
    "mean_field_class_wise_multi_similarity", batch="class", takes_tuples=False, has_parameters=True
)
def mean_field_class_wise_multi_similarity(
    *,
    num_classes: int,
    embedding_size: int,
    alpha: Positive = 0.01,  # 1/α and 1/(2β) scale the two terms (Eq. 10)
    beta: Positive = 80.0,
    delta: float = 0.8,
    lambda_mf: NonNegative = 0.0,  # the regulariser is skipped (not negated) when λ_MF ≤ 0
) -> nn.Module:
    """MFCWMS (mean-field paper Eq. 10); δ is a cosine-distance margin; paper defaults."""
    return MeanFieldClassWiseMultiSimilarity(
        num_classes, embedding_size, alpha, beta, delta, lambda_mf
    )
