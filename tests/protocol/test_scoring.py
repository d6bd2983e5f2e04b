"""The metric registry and score() vs naive loops over the definitions and scikit-learn.

Every reference here ranks by its own plain float64 loop (sorted by distance, then index); tie
cases use small integer embeddings without normalisation, where the float64 distances are exact
integers, so the tie order is the definition's (lower reference index first).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, ndcg_score

from mlrc.protocol import retrieval_metrics
from mlrc.protocol.scoring import (
    METRICS,
    Ranked,
    list_metrics,
    parse_metrics,
    register,
    score,
    score_details,
)

ALL = "map_at_r,precision_at_1,r_precision,recall_at_k@1,recall_at_k@4,recall_at_k@50,map_at_k@3,map_at_k@50,mrr,mrr@2,ndcg_at_k@5,ndcg_at_k@50"


# --- naive references -------------------------------------------------------------------------


def ranking(q: np.ndarray, r: np.ndarray, normalize: bool, own: bool) -> list[list[int]]:
    """Each query's reference indices, nearest first (float64 loop distance, then index)."""
    if normalize:
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    out = []
    for i in range(len(q)):
        dist = [float(((q[i] - r[j]) ** 2).sum()) for j in range(len(r))]
        order = sorted(range(len(r)), key=lambda j: (dist[j], j))
        out.append([j for j in order if not (own and j == i)])
    return out


def naive_values(key: str, rel: list[int], R: int, gains: list[int] | None = None) -> float:
    """One query's value of metric ``key`` from its full relevance list (nearest first)."""
    name, _, k = key.rpartition("_at_") if "_at_" in key and key[-1].isdigit() else (key, "", "")
    k = int(k) if k else None
    if key == "map_at_r":
        hits, s = 0, 0.0
        for i in range(R):
            if rel[i]:
                hits += 1
                s += hits / (i + 1)
        return s / R
    if key == "precision_at_1":
        return float(rel[0])
    if key == "r_precision":
        return sum(rel[:R]) / R
    if name == "recall":
        return float(any(rel[:k]))
    if name == "map":
        hits, s = 0, 0.0
        for i in range(min(k, len(rel))):
            if rel[i]:
                hits += 1
                s += hits / (i + 1)
        return s / min(k, R)
    if key.startswith("mrr"):
        limit = len(rel) if k is None else k
        for i in range(min(limit, len(rel))):
            if rel[i]:
                return 1.0 / (i + 1)
        return 0.0
    if name in ("ndcg", "hierarchical_ndcg"):
        g = rel if gains is None else gains
        dcg = sum(g[i] / math.log2(i + 2) for i in range(min(k, len(g))))
        ideal = sorted(g, reverse=True)
        return dcg / sum(ideal[i] / math.log2(i + 2) for i in range(min(k, len(ideal))))
    raise AssertionError(key)


def naive_score(keys, q, ql, r, rl, *, normalize, own, qs=None, rs=None, avg_of_avgs=False):
    """Mean (or mean of class means) of each key over queries with a relevant item; and the
    number of such queries."""
    per_query: dict[str, list[float]] = {k: [] for k in keys}
    kept_labels = []
    for i, order in enumerate(ranking(q, r, normalize, own)):
        rel = [int(rl[j] == ql[i]) for j in order]
        R = sum(rel)
        if R == 0:
            continue
        kept_labels.append(ql[i])
        gains = None if qs is None else [rel[n] + int(rs[j] == qs[i]) for n, j in enumerate(order)]
        for k in keys:
            per_query[k].append(naive_values(k, rel, R, gains if "hier" in k else None))
    if not avg_of_avgs:
        return {k: float(np.mean(v)) for k, v in per_query.items()}, len(kept_labels)
    labels = np.array(kept_labels)
    out = {}
    for k, v in per_query.items():
        v = np.array(v)
        out[k] = float(np.mean([v[labels == c].mean() for c in np.unique(labels)]))
    return out, len(kept_labels)


# --- data -----------------------------------------------------------------------------------


def continuous(n: int, classes: int, seed: int, dim: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 rows (ties have probability 0) and labels with a few lone classes."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    y[:3] = [classes + 1, classes + 2, classes + 3]  # lone items
    centres = rng.standard_normal((classes + 4, dim))
    return (centres[y] + rng.standard_normal((n, dim))).astype(np.float32), y


def tied(n: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer rows in {-1, 0, 1}³ (many exact ties and duplicates), a few lone labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    y[:3] = [classes + 1, classes + 2, classes + 3]  # lone items
    return rng.integers(-1, 2, (n, 3)).astype(np.float32), y


SETS = {
    "continuous": (continuous, True),
    "ties": (tied, False),
}


def layouts(x, y):
    """(query, query labels, reference, reference labels, own) of the three layouts."""
    m = len(x) // 3
    return {
        "all_vs_all": (x, y, None, None, True),
        "query_vs_reference": (x[:m], y[:m], x[m:], y[m:], False),
        "ref_includes_query": (x[:m], y[:m], x, y, True),
    }


# --- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["all_vs_all", "query_vs_reference", "ref_includes_query"])
@pytest.mark.parametrize("data", sorted(SETS))
def test_every_metric_matches_naive_loops(layout, data):
    make, normalize = SETS[data]
    x, y = make(48, 9, seed=3)
    q, ql, r, rl, own = layouts(x, y)[layout]
    metrics = parse_metrics(ALL)
    got = score_details(
        metrics,
        q,
        ql,
        r,
        rl,
        ref_includes_query=layout == "ref_includes_query",
        normalize=normalize,
    )
    ref_x, ref_y = (x, y) if r is None else (r, rl)
    keys = [m.key for m in metrics]
    want, kept = naive_score(keys, q, ql, ref_x, ref_y, normalize=normalize, own=own)
    assert got.values == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert (got.num_queries, got.num_excluded) == (kept, len(q) - kept)
    assert got.num_excluded > 0  # the lone queries were there, and left out
    mocm, _ = naive_score(keys, q, ql, ref_x, ref_y, normalize=normalize, own=own, avg_of_avgs=True)
    assert got.mean_of_class_means == pytest.approx(mocm, rel=1e-12, abs=1e-15)
    assert score(
        metrics,
        q,
        ql,
        r,
        rl,
        ref_includes_query=layout == "ref_includes_query",
        normalize=normalize,
        avg_of_avgs=True,
    ) == pytest.approx(mocm, rel=1e-12, abs=1e-15)


def test_k_larger_than_the_gallery():
    x, y = continuous(40, 4, seed=5)
    got = score(
        parse_metrics("recall_at_k@1000,map_at_k@1000,ndcg_at_k@1000,mrr"),
        x[:10],
        y[:10],
        x[10:20],
        y[10:20],
    )
    want, _ = naive_score(
        ["recall_at_1000", "map_at_1000", "ndcg_at_1000", "mrr"],
        x[:10],
        y[:10],
        x[10:20],
        y[10:20],
        normalize=True,
        own=False,
    )
    assert got == pytest.approx(want, rel=1e-12)
    assert got["recall_at_1000"] == 1.0  # every kept query finds its class somewhere


def test_hierarchical_ndcg_matches_naive_and_sklearn():
    x, y = continuous(60, 8, seed=11)
    sup = y % 3  # super-classes: classes nested in 3 groups
    q, ql, qs, r, rl, rs = x[:20], y[:20], sup[:20], x[20:], y[20:], sup[20:]
    got = score(
        parse_metrics("hierarchical_ndcg_at_k@5,hierarchical_ndcg_at_k@100"),
        q,
        ql,
        r,
        rl,
        query_super_labels=qs,
        reference_super_labels=rs,
    )
    keys = ["hierarchical_ndcg_at_5", "hierarchical_ndcg_at_100"]
    want, _ = naive_score(keys, q, ql, r, rl, normalize=True, own=False, qs=qs, rs=rs)
    assert got == pytest.approx(want, rel=1e-12)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    rn = r / np.linalg.norm(r, axis=1, keepdims=True)
    kept = [i for i in range(len(q)) if (rl == ql[i]).any()]
    gains = np.array([(rl == ql[i]).astype(float) + (rs == qs[i]) for i in kept])
    sims = (qn @ rn.T)[kept]
    for k, key in ((5, keys[0]), (100, keys[1])):
        assert got[key] == pytest.approx(ndcg_score(gains, sims, k=k), rel=1e-9)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_binary_ndcg_and_map_match_sklearn(k):
    x, y = continuous(70, 6, seed=7)
    q, ql, r, rl = x[:25], y[:25], x[25:], y[25:]
    got = score(parse_metrics(f"ndcg_at_k@{k},map_at_k@1000"), q, ql, r, rl)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    rn = r / np.linalg.norm(r, axis=1, keepdims=True)
    kept = [i for i in range(len(q)) if (rl == ql[i]).any()]
    truth = np.array([(rl == ql[i]).astype(float) for i in kept])
    sims = (qn @ rn.T)[kept]
    assert got[f"ndcg_at_{k}"] == pytest.approx(ndcg_score(truth, sims, k=k), rel=1e-9)
    # with k ≥ the gallery, mAP@k is the full-ranking average precision
    ap = np.mean([average_precision_score(t, s) for t, s in zip(truth, sims, strict=True)])
    assert got["map_at_1000"] == pytest.approx(ap, rel=1e-9)


def test_fnmr_at_fmr_matches_a_threshold_sweep():
    x, y = tied(40, 4, seed=2)  # tied scores: the threshold rule at ties matters
    for fmr in (0.0, 0.01, 0.1, 0.5, 1.0):
        got = score(parse_metrics(f"fnmr_at_fmr@{fmr}"), x, y, normalize=False)[
            f"fnmr_at_fmr_{fmr}"
        ]
        gen, imp = [], []
        for i in range(len(x)):
            for j in range(len(x)):
                if i != j:
                    s = -float(((x[i].astype(float) - x[j]) ** 2).sum())
                    (gen if y[i] == y[j] else imp).append(s)
        gen, imp = np.array(gen), np.array(imp)
        feasible = [
            np.mean(gen <= t)  # accept s > t
            for t in np.concatenate([[-np.inf], gen, imp])
            if np.mean(imp > t) <= fmr
        ]
        assert got == pytest.approx(min(feasible), abs=1e-15), fmr


def test_retrieval_metrics_equal_score_exactly():
    rng = np.random.default_rng(0)
    for n, d, c in ((300, 8, 40), (257, 3, 7)):
        x = rng.standard_normal((n, d)).astype(np.float32)
        y = rng.integers(0, c, n)
        old = retrieval_metrics(x, y)
        new = score(parse_metrics("map_at_r,precision_at_1,r_precision"), x, y)
        assert new == {k: old[k] for k in new}  # bit for bit
        assert score_details(parse_metrics("map_at_r"), x, y).num_queries == old["num_queries"]


@pytest.mark.parametrize("data", sorted(SETS))
def test_query_vs_itself_equals_all_vs_all_exactly(data):
    make, normalize = SETS[data]
    x, y = make(60, 7, seed=9)
    metrics = parse_metrics(ALL)
    assert score(metrics, x, y, x, y, ref_includes_query=True, normalize=normalize) == score(
        metrics, x, y, normalize=normalize
    )


def test_class_means_are_per_label():
    x, y = continuous(50, 5, seed=4)
    s = score_details(parse_metrics("precision_at_1"), x, y)
    per_query = s.per_query["precision_at_1"]
    for c, v in s.class_means["precision_at_1"].items():
        vals = per_query[(y == c) & ~np.isnan(per_query)]
        assert v == pytest.approx(vals.mean())
    assert np.isnan(per_query[:3]).all()  # the lone items


def test_parse_metrics_keys_and_list():
    got = parse_metrics("map_at_r, recall_at_k@10,ndcg_at_k@5,mrr,mrr@10,fnmr_at_fmr@0.001")
    assert [m.key for m in got] == [
        "map_at_r",
        "recall_at_10",
        "ndcg_at_5",
        "mrr",
        "mrr_at_10",
        "fnmr_at_fmr_0.001",
    ]
    assert got[1].params == {"k": 10} and got[-1].higher_is_better is False
    assert parse_metrics("hierarchical_ndcg_at_k@10")[0].needs == {"super_labels"}
    assert {"map_at_r", "mrr", "ndcg_at_k", "fnmr_at_fmr"} <= set(list_metrics())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("recal_at_k@10", "unknown metric 'recal_at_k'; did you mean 'recall_at_k'?"),
        ("recall_at_k", "recall_at_k needs its k, e.g. recall_at_k@10"),
        ("recall_at_k@0", "expected an integer ≥ 1, got 0"),
        ("recall_at_k@2.5", "expected an integer ≥ 1, got 2.5"),
        ("fnmr_at_fmr@2", "expected a number in [0, 1], got 2"),
        ("map_at_r@3", "map_at_r takes no @ parameter"),
        ("map_at_r,,mrr", "expected a comma-separated list"),
        ("mrr,mrr", "mrr asked for twice"),
    ],
)
def test_bad_metric_lists_are_one_line(text, message):
    with pytest.raises(ValueError) as e:
        parse_metrics(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_inputs_are_one_line():
    x, y = continuous(30, 3, seed=1)
    cases = [
        (
            lambda: score(parse_metrics("map_at_r"), x, y * 0.01 + 0.01),
            "query_labels must be integer class ids, got 0.0",
        ),
        (
            lambda: retrieval_metrics(x, np.linspace(0.01, 0.04, 30)),
            "labels must be integer class ids",
        ),
        (
            lambda: retrieval_metrics(torch.from_numpy(x), torch.linspace(0.01, 0.04, 30)),
            "labels must be integer class ids",
        ),
        (lambda: score(parse_metrics("hierarchical_ndcg_at_k@5"), x, y), "needs super_labels"),
        (
            lambda: score(
                parse_metrics("map_at_r"), x[:5], y[:5], x[1:], y[1:], ref_includes_query=True
            ),
            "ref_includes_query needs the first len(query) reference rows",
        ),
        (lambda: score(parse_metrics("map_at_r"), x, y, x), "needs reference_labels"),
        (lambda: score(parse_metrics("map_at_r"), x, y[:-1]), "30 rows but 29 query_labels"),
        (
            lambda: score(parse_metrics("map_at_r"), x, np.arange(30)),
            "no query has a reference item of its class",
        ),
        (
            lambda: score(
                parse_metrics("map_at_r"), x, y, query_super_labels=y, reference_super_labels=y
            ),
            "reference labels given without a reference set",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    # integral floats are class ids, not refused
    assert score(parse_metrics("map_at_r"), x, y.astype(float)) == score(
        parse_metrics("map_at_r"), x, y
    )


def test_a_plugin_metric_registers_and_scores():
    @register("hits_at_k", depth="k", param="k", key="hits_at_{k}")
    def hits_at_k(ranked: Ranked, *, k: int) -> np.ndarray:
        """Relevant items among the k nearest."""
        return ranked.rel[:, :k].sum(1)

    try:
        x, y = continuous(30, 3, seed=8)
        got = score(parse_metrics("hits_at_k@3,recall_at_k@3"), x, y)
        assert 0 < got["recall_at_3"] <= got["hits_at_3"] <= 3
        assert "hits_at_k" in list_metrics()
    finally:
        METRICS.unregister("hits_at_k")


@pytest.mark.parametrize("layout", ["all_vs_all", "query_vs_reference", "ref_includes_query"])
def test_mrr_searches_deeper_until_the_first_relevant_item(layout):
    rng = np.random.default_rng(12)
    x, y = rng.standard_normal((150, 4)).astype(np.float32), rng.integers(0, 50, 150)
    q, ql, r, rl, own = layouts(x, y)[layout]
    ref_x, ref_y = (x, y) if r is None else (r, rl)
    got = score_details(
        parse_metrics("mrr,recall_at_k@3"),
        q,
        ql,
        r,
        rl,
        ref_includes_query=layout == "ref_includes_query",
    )
    want, _ = naive_score(["mrr", "recall_at_3"], q, ql, ref_x, ref_y, normalize=True, own=own)
    assert got.values == pytest.approx(want, rel=1e-12)
    rr = got.per_query["mrr"]
    assert (rr[~np.isnan(rr)] < 1 / 16).sum() >= 3  # first hits beyond the first search depth


def test_hierarchical_ndcg_all_vs_all_and_with_classes_across_super_classes():
    x, y = tied(50, 6, seed=13)
    sup = np.random.default_rng(13).integers(0, 3, 50)  # not nested: a class spans groups
    got = score(
        "hierarchical_ndcg_at_k@4,hierarchical_ndcg_at_k@60",
        x,
        y,
        query_super_labels=sup,
        normalize=False,
    )
    keys = ["hierarchical_ndcg_at_4", "hierarchical_ndcg_at_60"]
    want, _ = naive_score(keys, x, y, x, y, normalize=False, own=True, qs=sup, rs=sup)
    assert got == pytest.approx(want, rel=1e-12)


def test_metrics_are_hashable_and_equal_by_value():
    a, b = parse_metrics("recall_at_k@10,recall_at_k@5")
    assert a == parse_metrics("recall_at_k@10")[0] and a != b
    assert len({a, b, parse_metrics("recall_at_k@10")[0]}) == 2


@pytest.mark.parametrize("layout", ["all_vs_all", "query_vs_reference", "ref_includes_query"])
@pytest.mark.parametrize("data", sorted(SETS))
def test_cuda_gives_the_cpu_numbers_exactly(layout, data):
    """Every metric, ties included, the same on a GPU as on the CPU (the search ranks float64
    distances on both); runs where a CUDA device is (GPU-only: skipped elsewhere)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine; the CPU path is tested against naive loops")
    make, normalize = SETS[data]
    x, y = make(300, 12, seed=5)
    q, ql, r, rl, _ = layouts(x, y)[layout]
    kw = {"ref_includes_query": layout == "ref_includes_query", "normalize": normalize}
    cpu = score(ALL, q, ql, r, rl, **kw)
    assert score(ALL, q, ql, r, rl, device="cuda", **kw) == cpu
