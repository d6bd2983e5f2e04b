"""Memory-bank ("embedded") samplers of the Revisiting paper (§3.2; notes/000 §3.2).

Each keeps a bank with the embedding of every training item (``set_bank`` at the start of a fold,
``update`` after every iteration with the batch's embeddings), samples a big batch 𝓑* of
``big_batch`` items (paper b* = 1024, reference code default 512) and distils it into a batch of
``batch_size`` items with SPC-m structure: ``batch_size // m`` groups of ``m`` same-class items,
one group after another.

- ``greedy_coreset`` (GC): farthest-point class seeds on 𝓑*, each filled with m − 1 of its class.
- ``d2_coreset``: the same with D² (k-means++) seeding instead of farthest-point seeding.
- ``distance_histogram_matching`` (DDM): the SPC-m candidate whose pairwise-distance histogram
  best matches 𝓑*'s.
- ``fid_matching`` (FRD): the SPC-m candidate with the smallest Fréchet distance to 𝓑*.

Choices common to all four: embeddings are used as given (the trainer's are not normalised, and
neither does the reference code normalise the bank); all randomness comes from ``self.rng`` so
``state()``/``set_state()`` make a resumed fold draw the same batches from the same bank; the
batch is computed when asked for (the reference precomputes a whole epoch of batches from the
bank as it was at the epoch's start, in 16 parallel jobs); a ``big_batch`` at least the size of the
training set uses the whole set; a class with fewer than m items is filled with replacement;
fewer classes than ``batch_size // m`` uses every class (with ``ClassBalancedBatchSampler``'s
warning); ``next_batch`` before ``set_bank`` raises ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mlrc.methods.samplers.base import BatchSampler, register
from mlrc.methods.samplers.m_per_class import ClassBalancedBatchSampler


def _as_array(x, dtype=None) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def squared_distances(x: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``x`` (clipped at 0)."""
    x = np.asarray(x, dtype=np.float64)
    sq = np.einsum("ij,ij->i", x, x)
    return np.clip(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0, None)


def pairwise_distance_values(x: np.ndarray) -> np.ndarray:
    """Euclidean distances of the pairs i < j of the rows of ``x`` (the reference's ``get_distmat``
    upper triangle)."""
    return np.sqrt(squared_distances(x)[np.triu_indices(len(x), 1)])


def distance_histogram(
    values: np.ndarray, value_range: tuple[float, float], bins: int
) -> np.ndarray:
    """Histogram of ``values`` on ``bins`` equal bins over ``value_range``, normalised to sum 1.

    Values outside the range are clipped into it (a candidate can hold a repeated item, i.e. a
    distance 0, below 𝓑*'s smallest distance)."""
    lo, hi = value_range
    counts, _ = np.histogram(np.clip(values, lo, hi), bins=bins, range=(lo, hi))
    return counts / max(counts.sum(), 1)


def bin_centres(value_range: tuple[float, float], bins: int) -> np.ndarray:
    """The centres of ``np.histogram``'s bins for ``value_range`` (which widens an empty range)."""
    edges = np.histogram_bin_edges(np.asarray(value_range, dtype=np.float64), bins, value_range)
    return (edges[:-1] + edges[1:]) / 2


def disthist_cost(big: np.ndarray, candidate: np.ndarray, bins: int = 50) -> float:
    """DDM cost of a candidate batch against the big batch (both: embeddings, one per row).

    ‖μ_𝓑 − μ_𝓑*‖ + ‖σ_𝓑 − σ_𝓑*‖ + 75 · (W(h, h*) + W(h*, h)), where, as in the reference code,
    μ and σ are the per-dimension mean and (population, ddof = 0) standard deviation vectors of
    the *embeddings*, not of the pairwise distances; h and h* are the normalised histograms of the
    Euclidean pairwise distances (pairs i < j) on ``bins`` bins spanning 𝓑*'s smallest to largest
    distance; W is the Wasserstein-1 distance between the histograms as distributions on the bin
    centres (``scipy.stats.wasserstein_distance(centres, centres, h, h*)``). The reference passes
    the two histograms' bin heights themselves as samples to ``wasserstein_distance``, which
    compares the sets of heights, not the distance distributions; W is symmetric, so the sum is 2W.
    """
    big = np.asarray(big, dtype=np.float64)
    candidate = np.asarray(candidate, dtype=np.float64)
    big_d = pairwise_distance_values(big)
    value_range = (float(big_d.min()), float(big_d.max()))
    h_big = distance_histogram(big_d, value_range, bins)
    h = distance_histogram(pairwise_distance_values(candidate), value_range, bins)
    centres = bin_centres(value_range, bins)
    from scipy.stats import wasserstein_distance  # here: scipy.stats takes ~1 s to import

    w = wasserstein_distance(centres, centres, h, h_big) + wasserstein_distance(
        centres, centres, h_big, h
    )
    return float(
        np.linalg.norm(candidate.mean(0) - big.mean(0))
        + np.linalg.norm(candidate.std(0) - big.std(0))
        + 75.0 * w
    )


def frechet_distance(big: np.ndarray, candidate: np.ndarray) -> float:
    """‖μ_𝓑 − μ_𝓑*‖² + Tr(Σ_𝓑 + Σ_𝓑* − 2 (Σ_𝓑* Σ_𝓑)^{1/2}) of two sets of embeddings (rows).

    As in the reference code: Σ = ``np.cov`` (ddof = 1); the square root is the real part of
    ``scipy.linalg.sqrtm`` of the product with 1e-8 added to both diagonals (the covariance of a
    batch smaller than the embedding dimension is singular)."""
    big = np.asarray(big, dtype=np.float64)
    candidate = np.asarray(candidate, dtype=np.float64)
    cov_big = np.atleast_2d(np.cov(big.T))
    cov = np.atleast_2d(np.cov(candidate.T))
    eps = np.eye(len(cov)) * 1e-8
    from scipy import linalg  # here, as scipy.stats above

    root = linalg.sqrtm((cov_big + eps) @ (cov + eps))
    diff = big.mean(0) - candidate.mean(0)
    return float(diff @ diff + np.trace(cov_big) + np.trace(cov) - 2.0 * np.trace(np.real(root)))


class MemoryBankSampler(ClassBalancedBatchSampler):
    """SPC-m batches distilled from a big batch of a memory bank of training-set embeddings."""

    needs_bank = True

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray,
        batch_size: int,
        m: int,
        iterations: int,
        seed: int,
        big_batch: int,
    ) -> None:
        super().__init__(labels, batch_size, m, iterations, seed)
        if big_batch < 2:
            raise ValueError(f"big_batch must be at least 2, got {big_batch}")
        self.big_batch = int(big_batch)
        self.class_of = np.unique(self.labels, return_inverse=True)[1]
        self.bank: np.ndarray | None = None

    def set_bank(self, embeddings) -> None:
        bank = np.array(_as_array(embeddings), dtype=np.float32)  # a copy
        if bank.ndim != 2 or len(bank) != len(self.labels):
            raise ValueError(
                f"the bank needs one embedding row per training item ({len(self.labels)}), "
                f"got shape {bank.shape}"
            )
        self.bank = bank

    def update(self, indices, embeddings) -> None:
        bank = self._require_bank()
        bank[_as_array(indices, np.int64)] = _as_array(embeddings, np.float32)

    def _require_bank(self) -> np.ndarray:
        if self.bank is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the memory bank: call set_bank(embeddings of every "
                "training item) before drawing batches"
            )
        return self.bank

    def _uniform_big_batch(self) -> np.ndarray:
        """``big_batch`` (at least ``batch_size // m``) distinct training items drawn uniformly,
        the whole set if it is smaller, as the reference GC sampler draws 𝓑*."""
        n, size = len(self.labels), max(self.big_batch, self.classes_per_batch)
        if size >= n:
            return np.arange(n)
        return self.rng.choice(n, size, replace=False)

    def _group(self, seed: int) -> list[int]:
        """The seed item and m − 1 other random items of its class (with replacement from the
        whole class when it has fewer than m items; the reference may also repeat the seed)."""
        pool = self.by_class[self.class_of[seed]]
        if self.m == 1:
            return [int(seed)]
        if len(pool) >= self.m:
            rest = self.rng.choice(pool[pool != seed], self.m - 1, replace=False)
        else:
            rest = self.rng.choice(pool, self.m - 1, replace=True)
        return [int(seed), *rest.tolist()]


class _CoresetSampler(MemoryBankSampler):
    """``batch_size // m`` class seeds chosen in 𝓑* by ``_seeds``, each filled with its class.

    𝓑* is ``big_batch`` distinct items drawn uniformly from the bank; distances are squared
    Euclidean on the bank's embeddings as given. Seeds are distinct items but may share a class
    (as in the reference), in which case the batch holds two groups of that class."""

    def next_batch(self) -> list[int]:
        bank = self._require_bank()
        big = self._uniform_big_batch()
        seeds = self._seeds(squared_distances(bank[big]), self.classes_per_batch)
        return [i for s in big[seeds] for i in self._group(int(s))]

    def _seeds(self, d2: np.ndarray, k: int) -> list[int]:
        raise NotImplementedError


class GreedyCoresetSampler(_CoresetSampler):
    """Greedy coreset (GC), reference ``datasampler/greedy_coreset_sampler.py``.

    First seed uniform at random in 𝓑*; each next one the item of 𝓑* with the largest squared
    distance to its nearest seed so far (ties: the lowest position; a chosen item is never chosen
    again, even when all remaining distances are 0). The reference also samples 𝓑* without
    replacement and uses squared distances, but maps the seeds' positions through a second,
    independent draw of 𝓑*; here they index the 𝓑* the coreset was computed on. Its optional
    ``softened`` variant and low-dimensional random projection (off by default) are not offered.
    """

    def _seeds(self, d2: np.ndarray, k: int) -> list[int]:
        seeds = [int(self.rng.integers(len(d2)))]
        nearest = d2[seeds[0]].copy()
        nearest[seeds[0]] = -np.inf
        while len(seeds) < k:
            s = int(np.argmax(nearest))
            seeds.append(s)
            nearest = np.minimum(nearest, d2[s])
            nearest[seeds] = -np.inf
        return seeds


class D2CoresetSampler(_CoresetSampler):
    """D² coreset: k-means++ (D²) seeding on 𝓑*, then the same SPC-m fill as GC.

    No reference file is available for it; this is the standard D² sampling the name refers to
    (Arthur & Vassilvitskii 2007): the first seed uniform at random in 𝓑*, each next one drawn
    with probability proportional to its squared Euclidean distance to the nearest seed so far
    (chosen items have weight 0; uniform over the unchosen items if all weights are 0)."""

    def _seeds(self, d2: np.ndarray, k: int) -> list[int]:
        seeds = [int(self.rng.integers(len(d2)))]
        nearest = d2[seeds[0]].copy()
        while len(seeds) < k:
            w = nearest.copy()
            w[seeds] = 0.0
            if not w.sum() > 0:
                w = np.ones(len(d2))
                w[seeds] = 0.0
            s = int(self.rng.choice(len(d2), p=w / w.sum()))
            seeds.append(s)
            nearest = np.minimum(nearest, d2[s])
        return seeds


class _MatchingSampler(MemoryBankSampler):
    """The best of ``candidates`` SPC-m candidate batches drawn from an SPC-structured 𝓑*.

    As in the reference DDM and FRD samplers, 𝓑* is itself SPC-structured: ``big_batch // m``
    (at least ``batch_size // m``) class draws of m items each. Here the classes are distinct
    random classes while there are enough (each class then gets the same number of draws, plus
    one for some random classes) and a class drawn j times contributes j·m distinct items while it
    has that many (the reference draws classes and items with replacement); a ``big_batch`` at
    least the training-set size makes 𝓑* the whole set. Each candidate is ``batch_size // m``
    distinct classes of 𝓑* with m of their 𝓑* items each (with replacement where 𝓑* holds fewer),
    so candidates are subsets of 𝓑* as in the reference (which draws candidate classes with
    replacement)."""

    def __init__(self, labels, batch_size, m, iterations, seed, big_batch, candidates) -> None:
        super().__init__(labels, batch_size, m, iterations, seed, big_batch)
        if candidates < 1:
            raise ValueError(f"candidates must be at least 1, got {candidates}")
        self.candidates = int(candidates)

    def _spc_big_batch(self) -> np.ndarray:
        n, n_classes = len(self.labels), len(self.by_class)
        if self.big_batch >= n:
            return np.arange(n)
        groups = max(self.big_batch // self.m, self.classes_per_batch)
        draws = np.full(n_classes, groups // n_classes)
        draws[self.rng.choice(n_classes, groups % n_classes, replace=False)] += 1
        big = []
        for c in np.flatnonzero(draws):
            pool, want = self.by_class[c], int(draws[c]) * self.m
            big.append(self.rng.choice(pool, want, replace=len(pool) < want))
        return np.concatenate(big)

    def draw(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """𝓑* and the candidate batches, as training-set indices."""
        big = self._spc_big_batch()
        classes = self.class_of[big]
        present = np.unique(classes)
        positions = {int(c): np.flatnonzero(classes == c) for c in present}
        k = min(self.classes_per_batch, len(present))
        cands = []
        for _ in range(self.candidates):
            chosen = self.rng.choice(present, k, replace=False)
            picked = [
                self.rng.choice(positions[int(c)], self.m, replace=len(positions[int(c)]) < self.m)
                for c in chosen
            ]
            cands.append(big[np.concatenate(picked)])
        return big, cands

    def next_batch(self) -> list[int]:
        bank = self._require_bank()
        big, cands = self.draw()
        big_emb = bank[big]
        costs = [self.cost(big_emb, bank[c]) for c in cands]
        return cands[int(np.argmin(costs))].tolist()

    def cost(self, big: np.ndarray, candidate: np.ndarray) -> float:
        raise NotImplementedError


class DistanceHistogramMatchingSampler(_MatchingSampler):
    """Distance-distribution matching (DDM), reference
    ``datasampler/disthist_batchmatch_sampler.py``: the candidate with the smallest
    ``disthist_cost`` (see there for the exact cost)."""

    def __init__(self, labels, batch_size, m, iterations, seed, big_batch, candidates, bins):
        super().__init__(labels, batch_size, m, iterations, seed, big_batch, candidates)
        if bins < 1:
            raise ValueError(f"bins must be at least 1, got {bins}")
        self.bins = int(bins)

    def cost(self, big: np.ndarray, candidate: np.ndarray) -> float:
        return disthist_cost(big, candidate, self.bins)


class FIDMatchingSampler(_MatchingSampler):
    """Fréchet-distance matching (FRD), reference ``datasampler/fid_batchmatch_sampler.py``: the
    candidate with the smallest ``frechet_distance`` to 𝓑* on the bank's embeddings."""

    def cost(self, big: np.ndarray, candidate: np.ndarray) -> float:
        return frechet_distance(big, candidate)


@register("greedy_coreset")
def greedy_coreset(
    labels, batch_size, m, iterations, seed, *, big_batch: int = 1024
) -> BatchSampler:
    """GC (Revisiting DML): farthest-point class seeds in a random big batch of the bank."""
    return GreedyCoresetSampler(labels, batch_size, m, iterations, seed, big_batch)


@register("d2_coreset")
def d2_coreset(labels, batch_size, m, iterations, seed, *, big_batch: int = 1024) -> BatchSampler:
    """D² (k-means++) class seeds in a random big batch of the bank."""
    return D2CoresetSampler(labels, batch_size, m, iterations, seed, big_batch)


@register("distance_histogram_matching")
def distance_histogram_matching(
    labels,
    batch_size,
    m,
    iterations,
    seed,
    *,
    big_batch: int = 1024,
    candidates: int = 10,
    bins: int = 50,
) -> BatchSampler:
    """DDM (Revisiting DML): the SPC-m candidate best matching the big batch's distances."""
    return DistanceHistogramMatchingSampler(
        labels, batch_size, m, iterations, seed, big_batch, candidates, bins
    )


@register("fid_matching")
def fid_matching(
    labels, batch_size, m, iterations, seed, *, big_batch: int = 1024, candidates: int = 10
) -> BatchSampler:
    """FRD (Revisiting DML): the SPC-m candidate closest to the big batch in Fréchet distance."""
    return FIDMatchingSampler(labels, batch_size, m, iterations, seed, big_batch, candidates)
