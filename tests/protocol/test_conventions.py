"""Metric conventions as documented (#37, finding 9), each against an independent naive loop:
``map_at_k`` divides by min(k, R) (OpenMetricLearning ≤ 0.3.10), ``map_at_k_hits`` by the hits
in the top k (OML ≥ 0.3.11); hierarchical NDCG with the linear gain (the default, stored
names unchanged) and the exponential gain 2^level − 1 (HAPPIER); queries inside the reference
accepted as PML's ``get_accuracy`` accepts them (float32 copies of float64 queries), and
refused with a message that says what was compared."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from sklearn.metrics import ndcg_score

from mlrc.protocol.scoring import parse_metrics, score


def data(n: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = rng.standard_normal((classes, 5))
    return centres[y] + rng.standard_normal((n, 5)), y


def order(q: np.ndarray, r: np.ndarray) -> list[list[int]]:
    """Each query's reference rows, nearest first (unit rows, float64 loop, ties by index)."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    r = r / np.linalg.norm(r, axis=1, keepdims=True)
    out = []
    for i in range(len(q)):
        d = [float(((q[i] - r[j]) ** 2).sum()) for j in range(len(r))]
        out.append(sorted(range(len(r)), key=lambda j: (d[j], j)))
    return out


def naive_ap_at_k(rel: list[int], k: int, R: int, over: str) -> float:
    hits, s = 0, 0.0
    for i in range(min(k, len(rel))):
        if rel[i]:
            hits += 1
            s += hits / (i + 1)
    if over == "min(k, R)":
        return s / min(k, R)
    return s / hits if hits else 0.0  # OML ≥ 0.3.11: over the hits in the top k


def test_the_two_map_at_k_conventions_by_hand():
    q, r = np.array([[1.0, 0.0]]), np.array([[1.0, 0.1], [0.0, 1.0], [0.1, 1.0], [-1, 0], [1, 1]])
    ql, rl = np.array([0]), np.array([0, 1, 1, 1, 0])  # R = 2
    got = score(parse_metrics("map_at_k@3,map_at_k_hits@3"), q, ql, r, rl)
    rel = [int(rl[j] == 0) for j in order(q, r)[0]]
    assert rel[:3] == [1, 1, 0]  # rows 0 and 4 nearest: both of class 0, then a miss
    assert got == {"map_at_3": 1.0, "map_at_k_hits_3": 1.0}
    rl = np.array([0, 1, 1, 0, 1])  # now one hit, then misses; R = 2
    got = score(parse_metrics("map_at_k@3,map_at_k_hits@3"), q, ql, r, rl)
    assert [int(rl[j] == 0) for j in order(q, r)[0]][:3] == [1, 0, 0]
    assert got["map_at_3"] == pytest.approx(1 / 2)  # min(3, R = 2)
    assert got["map_at_k_hits_3"] == 1.0  # 1 hit in the top 3: OML's current map@3


@pytest.mark.parametrize("k", [1, 3, 10, 200])
def test_map_at_k_conventions_match_naive_loops(k):
    x, y = data(90, 7, seed=3)
    q, ql, r, rl = x[:30], y[:30], x[30:], y[30:]
    got = score(parse_metrics(f"map_at_k@{k},map_at_k_hits@{k}"), q, ql, r, rl)
    want = {f"map_at_{k}": [], f"map_at_k_hits_{k}": []}
    for i, ranked in enumerate(order(q, r)):
        rel = [int(rl[j] == ql[i]) for j in ranked]
        if sum(rel) == 0:
            continue
        want[f"map_at_{k}"].append(naive_ap_at_k(rel, k, sum(rel), "min(k, R)"))
        want[f"map_at_k_hits_{k}"].append(naive_ap_at_k(rel, k, sum(rel), "hits"))
    assert got == pytest.approx({key: float(np.mean(v)) for key, v in want.items()}, rel=1e-12)


def test_stored_metric_names_keep_their_keys():
    keys = [m.key for m in parse_metrics("map_at_k@10,hierarchical_ndcg_at_k@5,ndcg_at_k@5")]
    assert keys == ["map_at_10", "hierarchical_ndcg_at_5", "ndcg_at_5"]
    new = [m.key for m in parse_metrics("map_at_k_hits@10,hierarchical_ndcg_exp_at_k@5")]
    assert new == ["map_at_k_hits_10", "hierarchical_ndcg_exp_at_5"]


@pytest.mark.parametrize("k", [4, 100])
def test_hierarchical_ndcg_gains_match_naive_loops_and_sklearn(k):
    x, y = data(80, 9, seed=5)
    sup = y % 3
    q, ql, qs, r, rl, rs = x[:25], y[:25], sup[:25], x[25:], y[25:], sup[25:]
    got = score(
        parse_metrics(f"hierarchical_ndcg_at_k@{k},hierarchical_ndcg_exp_at_k@{k}"),
        q, ql, r, rl, query_super_labels=qs, reference_super_labels=rs,
    )  # fmt: skip
    want: dict[str, list[float]] = {"linear": [], "exp": []}
    levels_all, sims = [], []
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    rn = r / np.linalg.norm(r, axis=1, keepdims=True)
    for i, ranked in enumerate(order(q, r)):
        if not (rl == ql[i]).any():
            continue
        level = [int(rl[j] == ql[i]) + int(rs[j] == qs[i]) for j in ranked]
        for name, gain in (("linear", lambda v: v), ("exp", lambda v: 2**v - 1)):
            g = [gain(v) for v in level]
            dcg = sum(g[n] / math.log2(n + 2) for n in range(min(k, len(g))))
            best = sorted(g, reverse=True)
            want[name].append(dcg / sum(best[n] / math.log2(n + 2) for n in range(min(k, len(g)))))
        levels_all.append((rl == ql[i]).astype(float) + (rs == qs[i]))
        sims.append(qn[i] @ rn.T)
    assert got[f"hierarchical_ndcg_at_{k}"] == pytest.approx(np.mean(want["linear"]), rel=1e-12)
    assert got[f"hierarchical_ndcg_exp_at_{k}"] == pytest.approx(np.mean(want["exp"]), rel=1e-12)
    levels, s = np.array(levels_all), np.array(sims)
    assert got[f"hierarchical_ndcg_exp_at_{k}"] == pytest.approx(
        ndcg_score(2.0**levels - 1, s, k=k), rel=1e-9
    )
    assert got[f"hierarchical_ndcg_at_{k}"] != pytest.approx(
        got[f"hierarchical_ndcg_exp_at_{k}"], rel=1e-6
    )  # the two gains differ on this data


def pml_p1(q, ql, r, rl) -> float:
    calc = AccuracyCalculator(
        include=("precision_at_1",), k="max_bin_count", device=torch.device("cpu")
    )
    return calc.get_accuracy(q, ql, r, rl, ref_includes_query=True)["precision_at_1"]


def test_a_float32_copy_of_float64_queries_is_accepted_as_pml_accepts_it():
    x, y = data(60, 5, seed=9)
    q, ql = x[:20], y[:20]  # float64
    r = np.concatenate([x[:20].astype(np.float32), x[20:].astype(np.float32)])
    p1 = pml_p1(q, ql, r, y)  # PML accepts the float32 copy
    got = score(parse_metrics("precision_at_1"), q, ql, r, y, ref_includes_query=True)
    assert got["precision_at_1"] == pytest.approx(p1, abs=1e-6)


def test_a_reference_that_is_not_the_queries_says_what_was_compared():
    x, y = data(60, 5, seed=9)
    q, ql = x[:20], y[:20]
    r = x.copy()
    r[3] += 1e-3
    with pytest.raises(ValueError, match="must be equal to query"):
        pml_p1(q, ql, r, y)  # PML refuses it too
    with pytest.raises(ValueError) as e:
        score(parse_metrics("precision_at_1"), q, ql, r, y, ref_includes_query=True)
    assert str(e.value) == (
        "score: ref_includes_query needs the first len(query) reference rows and labels to be "
        "the queries': reference row 3 differs from query row 3 by up to 0.001 (compared as "
        "PML's get_accuracy: both cast to float32, torch.allclose rtol 1e-05, atol 1e-08)"
    )
    labels = y.copy()
    labels[5] = (labels[5] + 1) % 5
    with pytest.raises(ValueError, match="reference label .* at row 5 is not the query's label"):
        score(parse_metrics("precision_at_1"), q, ql, x, labels, ref_includes_query=True)
