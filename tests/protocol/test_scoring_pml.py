"""score() vs pytorch-metric-learning's AccuracyCalculator, and PML's own accuracy-calculator
test cases (tests/utils/test_calculate_accuracies*.py, v2.9) ported as a peer would.

Names: PML's ``mean_average_precision_at_r`` is our ``map_at_r``; its
``mean_average_precision`` (k = every reference item, divided by R) is our
``map_at_k@N`` with N ≥ the reference size; ``mean_reciprocal_rank`` (k = all) is ``mrr``.
PML's cases use 1-D integer embeddings ranked by plain L2 distance: ``normalize=False`` here.

Not expressible in mlrc, so not ported: a custom ``label_comparison_fn`` (tuple labels, float
labels compared with a tolerance — float labels are refused in one line instead, tested below),
the knn-label-level unit test of the private helpers, clustering (NMI/AMI: not ranking metrics)
and faiss/GPU index options.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from mlrc.protocol.scoring import parse_metrics, score

PML_NAMES = {
    "map_at_r": "mean_average_precision_at_r",
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "mrr": "mean_reciprocal_rank",
    "map_at_100000": "mean_average_precision",
}
OURS = parse_metrics("map_at_r,precision_at_1,r_precision,mrr,map_at_k@100000")


def pml(avg_of_avgs: bool = False, k=None) -> AccuracyCalculator:
    logging.getLogger("PML").setLevel(logging.ERROR)
    return AccuracyCalculator(
        include=tuple(PML_NAMES.values()), avg_of_avgs=avg_of_avgs, k=k, device=torch.device("cpu")
    )


def pml_scores(acc: dict) -> dict:
    return {ours: acc[theirs] for ours, theirs in PML_NAMES.items()}


def data(n: int, classes: int, seed: int, dim: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, dim)).astype(np.float32), rng.integers(0, classes, n)


# --- against the library, on random data (no ties) --------------------------------------------


@pytest.mark.parametrize("avg_of_avgs", [False, True])
@pytest.mark.parametrize("layout", ["all_vs_all", "query_vs_reference", "ref_includes_query"])
def test_matches_pml_accuracy_calculator(layout, avg_of_avgs):
    x, y = data(240, 13, seed=1)
    y[:2] = [100, 101]  # lone queries: PML leaves them out too
    args = {
        "all_vs_all": (x, y),
        "query_vs_reference": (x[:80], y[:80], x[80:], y[80:], False),
        "ref_includes_query": (x[:80], y[:80], x, y, True),
    }[layout]
    theirs = pml_scores(pml(avg_of_avgs).get_accuracy(*args))
    ref = () if len(args) == 2 else args[2:4]
    ours = score(
        OURS,
        *args[:2],
        *ref,
        ref_includes_query=len(args) == 5 and args[4],
        normalize=False,
        avg_of_avgs=avg_of_avgs,
    )
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_class_means_match_pml_return_per_class():
    from mlrc.protocol.scoring import score_details

    x, y = data(150, 6, seed=4)
    calc = AccuracyCalculator(
        include=("precision_at_1", "r_precision"), return_per_class=True, device=torch.device("cpu")
    )
    theirs = calc.get_accuracy(x, y)
    ours = score_details(parse_metrics("precision_at_1,r_precision"), x, y, normalize=False)
    for key in ("precision_at_1", "r_precision"):
        assert list(ours.class_means[key].values()) == pytest.approx(theirs[key], rel=1e-6)


# --- PML's own cases -----------------------------------------------------------------------


def col(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)[:, None]


def test_pml_case_identity_and_query_within_reference():
    """_test_accuracy_calculator_and_faiss (both halves)."""
    q, ql = col(np.arange(10)), np.arange(10)
    got = score(OURS, q, ql, q, ql, normalize=False)
    assert got == pytest.approx(dict.fromkeys(got, 1.0))
    ref = (np.arange(20) / 2.0)[:, None]
    ref = np.concatenate([ref[::2], ref[1::2]]).astype(np.float32)
    ref_labels = np.zeros(20, dtype=np.int64)
    ref_labels[:10], ref_labels[10:] = ql, 1
    got = score(OURS, q, ql, ref, ref_labels, ref_includes_query=True, normalize=False)
    assert got["precision_at_1"] == pytest.approx(1)
    assert got["r_precision"] == pytest.approx(0.5)
    assert got["map_at_r"] == pytest.approx((1 + 2 / 2 + 3 / 5 + 4 / 7 + 5 / 9) / 10)
    odd = [1, 2 / 2, 3 / 5, 4 / 7, 5 / 9, 6 / 11, 7 / 13, 8 / 15, 9 / 17, 10 / 19]
    assert got["map_at_100000"] == pytest.approx(sum(odd) / 10)


@pytest.mark.parametrize("avg_of_avgs", [False, True])
def test_pml_case_avg_of_avgs(avg_of_avgs):
    """_test_accuracy_calculator_and_faiss_avg_of_avgs."""
    ql = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
    rl = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    q, r = col(np.arange(10)), col(np.arange(10))
    q[-1], r[0] = 100, -100
    got = score(OURS, q, ql, r, rl, normalize=False, avg_of_avgs=avg_of_avgs)
    if not avg_of_avgs:
        want = {"precision_at_1": 0.9, "r_precision": 0.9, "map_at_r": 0.9, "map_at_100000": 0.91}
    else:
        want = {"precision_at_1": 0.5, "r_precision": 0.5, "map_at_r": 0.5, "map_at_100000": 0.55}
    assert {k: got[k] for k in want} == pytest.approx(want)


def test_pml_case_tied_distances():
    """TestEmbeddingsComeFromSameSource.test_tied_distances: the query's own row, not its
    duplicate, is the one left out."""
    emb, labels = col([10, 10, 20, 20]), np.array([1, 0, 1, 0])
    assert score(parse_metrics("precision_at_1"), emb, labels, normalize=False) == {
        "precision_at_1": 0
    }


def test_pml_case_many_tied_distances():
    """test_many_tied_distances: all rows equal, P@1 by index order (exact, not ≈ 0.5)."""
    labels = np.random.default_rng(0).integers(0, 2, 2000)
    got = score(parse_metrics("precision_at_1"), np.zeros((2000, 2), np.float32), labels)
    # ties to the lower index: each query's nearest other row is row 0 (row 1 for row 0)
    want = np.mean([labels[1 if i == 0 else 0] == labels[i] for i in range(2000)])
    assert got["precision_at_1"] == pytest.approx(want)


def test_pml_case_query_within_reference():
    """test_query_within_reference: ref_includes_query needs the queries first."""
    q, ql = col([0, 10, 20]), np.array([0, 1, 2])
    ref, rl = col([0, 5, 10, 15, 20]), np.array([0, 9, 1, 8, 2])
    metrics = parse_metrics("precision_at_1")
    score(metrics, q, ql, ref, rl, normalize=False)
    with pytest.raises(ValueError, match="ref_includes_query needs the first len"):
        score(metrics, q, ql, ref, rl, ref_includes_query=True, normalize=False)
    ref, rl = col([0, 10, 20, 5, 15]), np.array([0, 1, 2, 9, 8])
    # accepted; every query is then alone in its class: PML answers NaN, mlrc one line
    with pytest.raises(ValueError, match="no query has a reference item of its class"):
        score(metrics, q, ql, ref, rl, ref_includes_query=True, normalize=False)
    assert score(
        metrics, q, ql, ref, np.array([0, 1, 2, 0, 8]), ref_includes_query=True, normalize=False
    ) == {"precision_at_1": 1.0}  # 0's nearest other is 5 (label 0)


def test_pml_case_float_labels_are_refused():
    """_test_accuracy_calculator_float_custom_comparison_function: labels 0.01 … 0.04 compared
    with |x − y| < 1 — one class to PML's function; mlrc refuses non-integer labels."""
    with pytest.raises(ValueError, match="^query_labels must be integer class ids"):
        score(
            OURS,
            col([0, 3]),
            np.array([0.01, 0.02]),
            col([0, 3, 1, 2]),
            np.array([10.0, 0.03, 0.04, 0.05]),
        )


@pytest.mark.parametrize("ecfss", [False, True])
@pytest.mark.parametrize("classes", [2, 11, 103])
def test_pml_case_large_k(ecfss, classes):
    """TestCalculateAccuraciesLargeK (sizes reduced): P@1, mAP over every reference item and
    MAP@R vs the test's own simple loop over a full ranking."""
    rng = np.random.default_rng(493)
    encs = rng.random((200, 5)).astype(np.float32)
    labels = rng.integers(0, classes, 200)
    q = np.argsort(
        ((encs[:, None, :].astype(np.float64) - encs[None, :, :]) ** 2).sum(-1),
        axis=1,
        kind="stable",
    )
    p1, maps, mapr = [], [], []
    for i in range(200):
        order = [j for j in q[i] if not (ecfss and j == i)]
        rel = labels[order] == labels[i]
        all_rel = int(rel.sum())
        hits, precisions, at_r = 0, [], []
        for k, r in enumerate(rel):
            if r:
                hits += 1
                precisions.append(hits / (k + 1))
                if k < all_rel:
                    at_r.append(hits / (k + 1))
        if all_rel:  # mlrc (like PML's calculator) leaves queries without a relevant item out
            p1.append(float(rel[0]))
            maps.append(sum(precisions) / all_rel)
            mapr.append(sum(at_r) / all_rel)
    got = score(
        parse_metrics("precision_at_1,map_at_k@1000,map_at_r"),
        encs,
        labels,
        encs,
        labels,
        ref_includes_query=ecfss,
        normalize=False,
    )
    assert got == pytest.approx(
        {"precision_at_1": np.mean(p1), "map_at_1000": np.mean(maps), "map_at_r": np.mean(mapr)},
        rel=1e-9,
    )
