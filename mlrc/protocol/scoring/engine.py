"""Scoring a query set against a reference set with any registered metrics (:func:`score`).

Conventions (PML's ``AccuracyCalculator.get_accuracy``):

- ``reference=None``: the query set is its own reference and a query never retrieves its own
  row (all vs all; the exact search of :func:`mlrc.protocol.knn.exact_neighbours`, so MAP@R,
  P@1 and R-Precision equal :func:`mlrc.protocol.retrieval_metrics` bit for bit);
- ``ref_includes_query=True``: the first ``len(query)`` reference rows *are* the queries (same
  vectors and labels, checked) and query i never retrieves reference row i;
- neighbours are ranked by the squared Euclidean distance of the L2-normalised rows
  (``normalize=True``; the order of cosine similarity), exactly, ties to the lower reference
  index (:mod:`mlrc.protocol.knn`); the k-NN is searched once, to the largest depth any
  requested ranking metric reads, capped at the reference rows available;
- relevant = same class label; R = relevant reference items of a query (own row excluded). A
  query with R = 0 is left out of every ranking metric, and counted (``Scores.num_excluded``);
- a ranking metric's value is the plain mean over the kept queries, or with
  ``avg_of_avgs=True`` the mean over classes of each class's mean (PML's ``avg_of_avgs``);
- labels (and super labels) must be integers: anything else is refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from mlrc.protocol.knn import ArrayLike, exact_neighbours, is_finite, to_tensor
from mlrc.protocol.knn.cross import cross_neighbours
from mlrc.protocol.metrics import integer_labels
from mlrc.protocol.scoring.base import (
    Metric,
    Ranked,
    check_needs,
    depth_of,
    parse_metrics,
    reads_to_first_hit,
)
from mlrc.protocol.scoring.pairs import impostor_keep, pair_scores


@dataclass(frozen=True)
class Scores:
    """What :func:`score_details` measured. ``values``: metric key → mean over the kept queries
    (pair metrics: over all pairs); ``class_means``: key → {class label: mean over its kept
    queries} (ranking metrics only); ``mean_of_class_means``: key → mean of those (PML's
    ``avg_of_avgs``; a pair metric's plain value); ``num_queries``: queries kept (R ≥ 1);
    ``num_excluded``: queries left out (no relevant reference item); ``per_query``: key →
    value of each query (NaN for an excluded one), ranking metrics only."""

    values: dict[str, float]
    class_means: dict[str, dict[int, float]] = field(default_factory=dict)
    mean_of_class_means: dict[str, float] = field(default_factory=dict)
    num_queries: int = 0
    num_excluded: int = 0
    per_query: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class _Sets:
    """The prepared inputs: tensors, integer labels as class ids, super-class ids, ``own``."""

    query: torch.Tensor
    reference: torch.Tensor
    labels: np.ndarray  # query labels as given (int64)
    q_ids: np.ndarray
    r_ids: np.ndarray
    q_super: np.ndarray | None
    r_super: np.ndarray | None
    own: bool  # query i is reference row i
    all_vs_all: bool  # reference is None: exact_neighbours


def score(
    metrics: list[Metric] | str,
    query: ArrayLike,
    query_labels: ArrayLike,
    reference: ArrayLike | None = None,
    reference_labels: ArrayLike | None = None,
    *,
    ref_includes_query: bool = False,
    query_super_labels: ArrayLike | None = None,
    reference_super_labels: ArrayLike | None = None,
    normalize: bool = True,
    device: str | torch.device | None = None,
    avg_of_avgs: bool = False,
) -> dict[str, float]:
    """Metric key → value (a fraction in [0, 1]) of each of ``metrics`` (:func:`parse_metrics`'s
    list, or its text).

    ``query`` (m × d) with integer ``query_labels`` (m,), ``reference`` (n × d) with
    ``reference_labels`` (n,); conventions in the module docstring. ``avg_of_avgs``: each
    ranking metric as the mean of its class means. ``device``: where the search runs (default:
    the query's). How many queries were kept: :func:`score_details`.
    """
    s = score_details(
        metrics,
        query,
        query_labels,
        reference,
        reference_labels,
        ref_includes_query=ref_includes_query,
        query_super_labels=query_super_labels,
        reference_super_labels=reference_super_labels,
        normalize=normalize,
        device=device,
    )
    return dict(s.mean_of_class_means if avg_of_avgs else s.values)


def score_details(
    metrics: list[Metric] | str,
    query: ArrayLike,
    query_labels: ArrayLike,
    reference: ArrayLike | None = None,
    reference_labels: ArrayLike | None = None,
    *,
    ref_includes_query: bool = False,
    query_super_labels: ArrayLike | None = None,
    reference_super_labels: ArrayLike | None = None,
    normalize: bool = True,
    device: str | torch.device | None = None,
) -> Scores:
    """:func:`score` with the queries kept and left out, class means and per-query values."""
    if isinstance(metrics, str):
        metrics = parse_metrics(metrics)
    if not metrics:
        raise ValueError("score: no metric asked for")
    sets = _prepare(
        query,
        query_labels,
        reference,
        reference_labels,
        ref_includes_query,
        (query_super_labels, reference_super_labels),
        device,
    )
    check_needs(metrics, {"super_labels"} if sets.q_super is not None else set())
    R = _counts(sets.q_ids, sets.r_ids, sets.own)
    kept = R > 0
    if not kept.any():
        raise ValueError("score: no query has a reference item of its class; metrics undefined")
    ranking = [m for m in metrics if m.info.kind == "ranking"]
    values: dict[str, float] = {}
    class_means: dict[str, dict[int, float]] = {}
    per_query: dict[str, np.ndarray] = {}
    if ranking:
        per_query, values = _ranking_values(ranking, sets, R, normalize)
        for key, v in per_query.items():
            class_means[key] = _class_means(v[kept], sets.labels[kept])
    pair_metrics = [m for m in metrics if m.info.kind == "pairs"]
    if pair_metrics:
        values |= _pair_values(pair_metrics, sets, R, normalize)
    out = {m.key: values[m.key] for m in metrics}
    mocm = {
        m.key: float(np.mean(list(class_means[m.key].values())))
        if m.key in class_means
        else out[m.key]
        for m in metrics
    }
    num = int(kept.sum())
    return Scores(out, class_means, mocm, num, len(R) - num, per_query)


def _pair_values(
    metrics: list[Metric], sets: _Sets, R: np.ndarray, normalize: bool
) -> dict[str, float]:
    """Pair metrics from one pass over the pairs: each reads the largest impostor scores up
    to the fraction its ``depth`` parameter names (FNMR@FMR: ``fmr``)."""
    available = sets.reference.shape[0] - int(sets.own)
    num_impostor = int((available - R).sum())
    if num_impostor == 0 or R.sum() == 0:
        raise ValueError("score: verification metrics need genuine and impostor pairs")
    keep = max(impostor_keep(m.params[str(m.info.depth)], num_impostor) for m in metrics)
    pairs = pair_scores(
        sets.query,
        sets.reference,
        sets.q_ids,
        sets.r_ids,
        own=sets.own,
        keep=keep,
        normalize=normalize,
    )
    return {m.key: float(m.info.factory(pairs, **m.params)) for m in metrics}


def _prepare(
    query: ArrayLike,
    query_labels: ArrayLike,
    reference: ArrayLike | None,
    reference_labels: ArrayLike | None,
    ref_includes_query: bool,
    supers: tuple[ArrayLike | None, ArrayLike | None],
    device: str | torch.device | None,
) -> _Sets:
    """Inputs checked (shapes, finite, integer labels, ``ref_includes_query``) and converted."""
    all_vs_all = reference is None
    if all_vs_all:
        if reference_labels is not None or supers[1] is not None:
            raise ValueError("score: reference labels given without a reference set")
        reference, reference_labels, ref_includes_query = query, query_labels, True
        supers = (supers[0], supers[0])
    elif reference_labels is None:
        raise ValueError("score: a reference set needs reference_labels")
    q = _embeddings(query, device, "query")
    r = _embeddings(reference, q.device, "reference")
    if q.shape[1] != r.shape[1]:
        raise ValueError(f"score: query is {q.shape[1]}-D but reference is {r.shape[1]}-D")
    ql, rl = (
        integer_labels(query_labels, "query_labels"),
        integer_labels(reference_labels, "reference_labels"),
    )
    _same_length(q, ql, "query")
    _same_length(r, rl, "reference")
    if ref_includes_query and not all_vs_all:
        _check_included(q, r, ql, rl)
    _, ids = np.unique(np.concatenate([ql, rl]), return_inverse=True)
    qs, rs = _super_ids(supers, len(ql), len(rl))
    return _Sets(q, r, ql, ids[: len(ql)], ids[len(ql) :], qs, rs, ref_includes_query, all_vs_all)


def _embeddings(x: ArrayLike, device: str | torch.device | None, what: str) -> torch.Tensor:
    t = to_tensor(x, device)
    t = t if t.dtype in (torch.float32, torch.float64) else t.double()
    if t.ndim != 2 or t.shape[0] == 0:
        raise ValueError(f"score: {what} must be a non-empty (n, d) array, got {tuple(t.shape)}")
    if not is_finite(t):
        raise ValueError(f"score: {what} embeddings contain NaN or infinite values")
    return t


def _same_length(x: torch.Tensor, labels: np.ndarray, what: str) -> None:
    if len(labels) != x.shape[0]:
        raise ValueError(f"score: {what} has {x.shape[0]} rows but {len(labels)} {what}_labels")


# PML's get_accuracy compares the queries with the first reference rows after casting both to
# float32, with torch.allclose's default tolerances: a float32 copy of float64 queries passes
PML_RTOL, PML_ATOL = 1e-5, 1e-8


def _check_included(q: torch.Tensor, r: torch.Tensor, ql: np.ndarray, rl: np.ndarray) -> None:
    """ref_includes_query: the first len(query) reference rows and labels are the queries', as
    PML's ``get_accuracy`` checks it (both cast to float32, ``torch.allclose`` with rtol
    :data:`PML_RTOL` and atol :data:`PML_ATOL`; labels equal); the message says what differs."""
    m = q.shape[0]
    head = "score: ref_includes_query needs the first len(query) reference rows and labels to "
    head += "be the queries'"
    if r.shape[0] < m:
        raise ValueError(f"{head}: the reference has {r.shape[0]} rows, the query {m}")
    a, b = q.float(), r[:m].float()
    close = torch.isclose(a, b, rtol=PML_RTOL, atol=PML_ATOL).all(dim=1)
    if not bool(close.all()):
        i = int((~close).nonzero()[0, 0])
        diff = float((a[i] - b[i]).abs().max())
        raise ValueError(
            f"{head}: reference row {i} differs from query row {i} by up to {diff:.3g} (compared "
            f"as PML's get_accuracy: both cast to float32, torch.allclose rtol {PML_RTOL:g}, "
            f"atol {PML_ATOL:g})"
        )
    if not (rl[:m] == ql).all():
        i = int(np.flatnonzero(rl[:m] != ql)[0])
        raise ValueError(
            f"{head}: reference label {rl[i]} at row {i} is not the query's label {ql[i]}"
        )


def _super_ids(
    supers: tuple[ArrayLike | None, ArrayLike | None], m: int, n: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Super-class ids of queries and references (both or neither given)."""
    qs, rs = supers
    if (qs is None) != (rs is None):
        raise ValueError(
            "score: give both query_super_labels and reference_super_labels, or neither"
        )
    if qs is None:
        return None, None
    a = integer_labels(qs, "query_super_labels")
    b = integer_labels(rs, "reference_super_labels")
    if len(a) != m or len(b) != n:
        raise ValueError(f"score: super labels need {m} query and {n} reference entries")
    _, ids = np.unique(np.concatenate([a, b]), return_inverse=True)
    return ids[:m], ids[m:]


def _counts(q_ids: np.ndarray, r_ids: np.ndarray, own: bool) -> np.ndarray:
    """Reference items sharing each query's id, its own row excluded (int64)."""
    per_id = np.bincount(r_ids, minlength=int(max(q_ids.max(), r_ids.max())) + 1)
    return per_id[q_ids] - int(own)


def _ranking_values(
    metrics: list[Metric], sets: _Sets, R: np.ndarray, normalize: bool
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Per-query values (NaN where R = 0) and means of the ranking metrics; the means are summed
    block by block, as :func:`mlrc.protocol.retrieval_metrics` sums them. A metric that reads
    to the first relevant item (``mrr``) gets the queries without one searched again, deeper."""
    available = sets.reference.shape[0] - int(sets.own)
    depth = np.max([depth_of(m, R, available) for m in metrics], axis=0)
    depth[R == 0] = 0
    per_query = {m.key: np.full(len(R), np.nan) for m in metrics}
    sums = dict.fromkeys(per_query, np.float64(0.0))
    found = np.zeros(len(R), dtype=bool)  # a relevant item within the searched depth
    supers = _super_counts(sets)
    for queries, nbr in _neighbour_blocks(sets, depth, normalize, None):
        keep = queries[R[queries] > 0]
        ranked = _ranked(sets, R, supers, keep, nbr[R[queries] > 0], depth[keep])
        found[keep] = ranked.rel.any(1)
        for m in metrics:
            v = np.asarray(m.info.factory(ranked, **m.params), dtype=np.float64)
            per_query[m.key][keep] = v
            sums[m.key] += v.sum()
    n = int((R > 0).sum())
    means = {k: float(s / n) for k, s in sums.items()}
    deeper = [m for m in metrics if reads_to_first_hit(m)]
    if deeper:
        _search_deeper(deeper, sets, R, supers, depth, found, per_query, normalize)
        means |= {m.key: float(np.nansum(per_query[m.key]) / n) for m in deeper}
    return per_query, means


def _search_deeper(
    metrics: list[Metric],
    sets: _Sets,
    R: np.ndarray,
    supers: tuple[np.ndarray, np.ndarray] | None,
    depth: np.ndarray,
    found: np.ndarray,
    per_query: dict[str, np.ndarray],
    normalize: bool,
) -> None:
    """Search the queries without a relevant item in their top ``depth`` 4× deeper, until each
    has one (R ≥ 1 guarantees it within the reference), and rescore ``metrics`` for them."""
    available = sets.reference.shape[0] - int(sets.own)
    searched = depth.copy()
    while True:
        pending = (R > 0) & ~found & (searched < available)
        if not pending.any():
            return
        deeper = np.where(pending, np.minimum(4 * np.maximum(searched, 1), available), 0)
        for queries, nbr in _neighbour_blocks(sets, deeper, normalize, np.flatnonzero(pending)):
            keep = queries[pending[queries]]
            ranked = _ranked(sets, R, supers, keep, nbr[pending[queries]], deeper[keep])
            found[keep] = ranked.rel.any(1)
            for m in metrics:
                per_query[m.key][keep] = m.info.factory(ranked, **m.params)
        searched = np.where(pending, deeper, searched)


def _neighbour_blocks(
    sets: _Sets, depth: np.ndarray, normalize: bool, rows: np.ndarray | None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(queries, nbr) blocks: the all-vs-all search or the query → reference one (``rows``:
    only those queries; the all-vs-all search skips queries of depth 0 itself)."""
    if sets.all_vs_all:
        return exact_neighbours(sets.query, depth, normalize=normalize)
    return cross_neighbours(
        sets.query,
        sets.reference,
        int(depth.max()),
        normalize=normalize,
        own_rows=sets.own,
        rows=rows,
    )


def _super_counts(sets: _Sets) -> tuple[np.ndarray, np.ndarray] | None:
    """Per query: reference items of its super-class (S) and of its class and super-class
    (both), own row excluded; None without super labels."""
    if sets.q_super is None or sets.r_super is None:
        return None
    S = _counts(sets.q_super, sets.r_super, sets.own)
    width = int(max(sets.q_super.max(), sets.r_super.max())) + 1
    both = _counts(sets.q_ids * width + sets.q_super, sets.r_ids * width + sets.r_super, sets.own)
    return S, both


def _ranked(
    sets: _Sets,
    R: np.ndarray,
    supers: tuple[np.ndarray, np.ndarray] | None,
    queries: np.ndarray,
    nbr: np.ndarray,
    depth: np.ndarray,
) -> Ranked:
    """Relevance of each query's ranks 1..width (0 beyond its searched depth)."""
    valid = np.arange(nbr.shape[1])[None, :] < depth[:, None]
    safe = np.where(valid, nbr, 0)
    rel = (valid & (sets.r_ids[safe] == sets.q_ids[queries, None])).astype(np.float64)
    if supers is None or sets.q_super is None or sets.r_super is None:
        return Ranked(rel, R[queries].astype(np.float64))
    same_super = valid & (sets.r_super[safe] == sets.q_super[queries, None])
    S, both = (c[queries].astype(np.float64) for c in supers)
    return Ranked(rel, R[queries].astype(np.float64), same_super.astype(np.float64), S, both)


def _class_means(values: np.ndarray, labels: np.ndarray) -> dict[int, float]:
    """Mean of ``values`` per label (the kept queries'), labels ascending."""
    classes, inv = np.unique(labels, return_inverse=True)
    sums = np.bincount(inv, weights=values)
    counts = np.bincount(inv)
    return {int(c): float(s / k) for c, s, k in zip(classes, sums, counts, strict=True)}
