"""Retrieval metrics vs a naive loop over the definitions and vs PML's AccuracyCalculator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from mlrc.protocol import knn as K
from mlrc.protocol import metrics as M
from mlrc.protocol.metrics import concatenate_embeddings, retrieval_metrics


def clustered(
    n_classes: int,
    dim: int,
    seed: int,
    spread: float = 0.9,
    singletons: int = 3,
    sizes: tuple[int, int] = (2, 25),
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters with uneven class sizes (``sizes``, inclusive) plus a few one-item
    classes; float32 embeddings and int labels, rows shuffled."""
    rng = np.random.default_rng(seed)
    sizes = np.concatenate(
        [rng.integers(sizes[0], sizes[1] + 1, n_classes), np.ones(singletons, dtype=int)]
    )
    centres = rng.standard_normal((len(sizes), dim))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    x = centres[labels] + spread * rng.standard_normal((len(labels), dim))
    perm = rng.permutation(len(labels))
    return x[perm].astype(np.float32), labels[perm]


def plain_vectors(x: np.ndarray, normalize: bool = True) -> np.ndarray:
    """The ranked vectors by definition: float64 rows, divided by √(Σ_k x_k²) summed left to
    right (a plain float64 loop, vectorised over rows only); zero rows stay zero."""
    v = np.asarray(x, dtype=np.float64)
    if normalize:
        total = np.zeros(len(v))
        for k in range(v.shape[1]):
            total += v[:, k] * v[:, k]
        norm = np.sqrt(total)
        v = np.divide(v, norm[:, None], out=np.zeros_like(v), where=norm[:, None] > 0)
    return v


def plain_distances(v: np.ndarray) -> np.ndarray:
    """n × n squared distances Σ_k (v_ik − v_jk)², summed k = 0, 1, … in float64 (a plain
    loop, vectorised over pairs only)."""
    dist = np.zeros((len(v), len(v)))
    for k in range(v.shape[1]):
        diff = v[:, k, None] - v[None, :, k]
        dist += diff * diff
    return dist


def naive_metrics(
    x: np.ndarray,
    y: np.ndarray,
    normalize: bool = True,
    *,
    ties: str = "lower",
    dist: np.ndarray | None = None,
) -> dict[str, float]:
    """The MLRC definitions, one query at a time, ranked by ``plain_distances`` (ascending,
    stable: ties to the lower index; ``ties="higher"``: to the higher one). ``dist``: rank by
    these n × n values instead (to show what another ranking would give)."""
    if dist is None:
        dist = plain_distances(plain_vectors(x, normalize))
    maps, p1s, rps = [], [], []
    for i in range(len(x)):
        others = np.delete(np.arange(len(x)), i)
        if ties == "higher":
            others = others[::-1]
        R = int((y[others] == y[i]).sum())
        if R == 0:
            continue
        ranked = others[np.argsort(dist[i, others], kind="stable")]
        rel = [1.0 if y[j] == y[i] else 0.0 for j in ranked[:R]]
        precision_at = [sum(rel[: t + 1]) / (t + 1) for t in range(R)]
        maps.append(sum(p * r for p, r in zip(precision_at, rel, strict=True)) / R)
        p1s.append(rel[0])
        rps.append(sum(rel) / R)
    return {"map_at_r": np.mean(maps), "precision_at_1": np.mean(p1s), "r_precision": np.mean(rps)}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dim", [8, 128])
def test_against_naive_loop(seed, dim):
    x, y = clustered(30, dim, seed)
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-6)
    assert got["num_queries"] == int((np.bincount(y)[y] > 1).sum())


@pytest.mark.parametrize("normalize", [True, False])
def test_collapsed_embeddings_are_ranked_exactly(normalize):
    """Nearly collinear embeddings: float32 distances tie or misorder; the float64 re-ranking
    must still agree with the float64 naive loop."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 40, 600)
    x = (np.ones(64) + 1e-4 * rng.standard_normal((600, 64))).astype(np.float32)
    got, want = retrieval_metrics(x, y, normalize=normalize), naive_metrics(x, y, normalize)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def tie_heavy(name: str) -> tuple[np.ndarray, np.ndarray]:
    """~300 float32 embeddings whose ranking is decided by exact ties or by the last bits of
    float64, and labels of 12 classes (rows in random order)."""
    rng = np.random.default_rng(7)
    n = 300
    base = rng.standard_normal((40, 16)).astype(np.float32)
    if name == "collinear, integer":  # exact multiples of 5 integer directions
        directions = rng.integers(-3, 4, (5, 8))
        x = directions[rng.integers(0, 5, n)] * rng.integers(1, 20, n)[:, None]
    elif name == "collinear, float":  # 5 directions at random positive scales (rounded)
        directions = rng.standard_normal((5, 8))
        x = directions[rng.integers(0, 5, n)] * rng.uniform(0.1, 10.0, (n, 1))
    elif name == "duplicates":  # 40 vectors, each repeated ~7 times
        x = base[rng.integers(0, 40, n)]
    elif name == "integer-valued":  # {-2..2}^6: duplicates, collinear pairs, equal distances
        x = rng.integers(-2, 3, (n, 6))
    elif name == "identical":
        x = np.repeat(base[:1], n, axis=0)
    elif name == "collapsed":  # one vector + 1e-6 noise
        x = base[:1] + 1e-6 * rng.standard_normal((n, 16))
    elif name == "with zero rows":
        x = rng.standard_normal((n, 8)) * (rng.random((n, 1)) > 0.2)
    else:
        raise ValueError(name)
    return np.asarray(x, dtype=np.float32), rng.integers(0, 12, n)


TIE_HEAVY = (
    "collinear, integer",
    "collinear, float",
    "duplicates",
    "integer-valued",
    "identical",
    "collapsed",
    "with zero rows",
)


def metrics_on_both_paths(x, y, normalize):
    """retrieval_metrics on the CPU (numpy) path and on the torch path (the one CUDA uses)."""
    with K.tuned(cpu_backend="numpy"):
        cpu = retrieval_metrics(x, y, normalize=normalize)
    with K.tuned(cpu_backend="torch"):
        return cpu, retrieval_metrics(x, y, normalize=normalize)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("name", TIE_HEAVY)
def test_tie_heavy_sets_equal_the_plain_loop_on_both_paths(name, normalize):
    """Collinear vectors of different norms, duplicates, integer embeddings, identical and
    collapsed sets, zero rows: both paths give the plain float64 loop's values (ties to the
    lower index) to 1e-12, and exactly the same numbers as each other."""
    x, y = tie_heavy(name)
    cpu, torch_path = metrics_on_both_paths(x, y, normalize)
    want = naive_metrics(x, y, normalize)
    for k in M.METRICS:
        assert cpu[k] == pytest.approx(want[k], abs=1e-12)
    assert torch_path == cpu


@pytest.mark.parametrize(
    ("name", "normalize", "wrong"),
    [
        ("collinear, integer", True, "ties to the higher index"),
        ("collinear, integer", False, "ties to the higher index"),
        ("duplicates", True, "ties to the higher index"),
        ("integer-valued", True, "ties to the higher index"),
        ("integer-valued", False, "ties to the higher index"),
        ("identical", True, "ties to the higher index"),
        ("with zero rows", True, "ties to the higher index"),
        ("collinear, integer", True, "float64 dot products"),
        ("collinear, float", True, "float64 dot products"),
        ("collapsed", True, "float64 dot products"),
    ],
)
def test_tie_heavy_sets_tell_a_wrong_ranking_apart(name, normalize, wrong):
    """The test above can fail: on these sets a ranking that breaks ties the other way, or
    that ranks by BLAS dot products of the same float64 vectors (equal order in exact
    arithmetic), changes the values by far more than 1e-12."""
    x, y = tie_heavy(name)
    want = naive_metrics(x, y, normalize)
    if wrong == "ties to the higher index":
        other = naive_metrics(x, y, normalize, ties="higher")
    else:
        v = plain_vectors(x, normalize)
        other = naive_metrics(x, y, dist=-(v @ v.T))
    assert max(abs(other[k] - want[k]) for k in M.METRICS) > 1e-6


def test_another_summation_order_is_caught():
    """The comparison with the plain loop sees the last bits: summing norms and distances in
    another order (right to left here, as the search sums the same rows with their columns
    reversed; BLAS, numpy's pairwise sum and GPU reductions each have their own) reorders
    near-ties of integer embeddings, and the values move."""
    x, y = tie_heavy("integer-valued")
    got, want = retrieval_metrics(np.flip(x, 1), y), naive_metrics(x, y)
    assert max(abs(got[k] - want[k]) for k in M.METRICS) > 1e-6


def test_the_plain_loop_is_a_plain_loop():
    """The vectorised reference above equals a pure-Python float loop bit for bit."""
    x, _ = tie_heavy("collinear, integer")
    x = x[:25]
    rows = []
    for row in x.astype(np.float64).tolist():
        total = 0.0
        for value in row:
            total += value * value
        norm = math.sqrt(total)
        rows.append([value / norm if norm > 0 else 0.0 for value in row])
    dist = np.zeros((len(rows), len(rows)))
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            total = 0.0
            for p, q in zip(a, b, strict=True):
                total += (p - q) * (p - q)
            dist[i, j] = total
    np.testing.assert_array_equal(plain_vectors(x), np.array(rows))
    np.testing.assert_array_equal(plain_distances(plain_vectors(x)), dist)


@pytest.mark.parametrize("torch_path", [False, True])
def test_zero_rows_stay_zero_and_tie_by_index(torch_path):
    """A zero row stays zero: squared distance 1 from every unit row, 0 from other zero rows.
    Items 0, 2 zero; 1, 3 along e1; 4 along e2; labels A B B A B. By hand (ties to the lower
    index): q0 → 2 (R = 1, miss); q1 → 3, 0 (R = 2, none); q2 → 0, 1 (R = 2, rank 2 hit:
    AP 1/4); q3 → 1 (R = 1, miss); q4 → 0, 2 (tie at distance 1; R = 2, rank 2 hit: AP 1/4;
    ties to the higher index would give 2, 0: AP 1/2, P@1 1)."""
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [2.0, 0.0], [0.0, 3.0]], np.float32)
    y = np.array([0, 1, 1, 0, 1])
    with K.tuned(cpu_backend="torch" if torch_path else "numpy"):
        got = retrieval_metrics(x, y)
    assert got == {"map_at_r": 0.1, "precision_at_1": 0.0, "r_precision": 0.2, "num_queries": 5}
    assert K.ranked_vectors(torch.from_numpy(x))[[0, 2]].abs().sum() == 0


def test_normalisation_is_exact_for_any_scale():
    """Rows scaled by 2^±600 (float64: plain squares would overflow or underflow) normalise
    to the very same bits, and give the same metrics."""
    x, y = tie_heavy("collinear, float")
    x64 = torch.from_numpy(x.astype(np.float64))
    unit = K.ranked_vectors(x64)
    assert torch.equal(unit, torch.from_numpy(plain_vectors(x)))
    assert torch.equal(x64, torch.from_numpy(x.astype(np.float64)))  # the input is untouched
    for scale in (2.0**600, 2.0**-600):
        assert torch.equal(K.ranked_vectors(x64 * scale), unit)
        assert retrieval_metrics(x64 * scale, y) == retrieval_metrics(x, y)


@pytest.mark.parametrize("torch_path", [False, True])
@pytest.mark.parametrize("kind", ["identical", "collapsed"])
def test_tie_heavy_sets_cost_about_n_exact_distances(torch_path, kind):
    """3,000 identical or collapsed (1e-6) embeddings in 60 classes (k ≈ 70 neighbours a
    query): identical rows are scored once per distinct vector, collapsed ones separated in
    float32, so the exact distances number O(n·k) at most (the torch path scores its k + 8
    candidates), far from the n² = 9,000,000 of a per-query fallback."""
    rng = np.random.default_rng(3)
    x = np.repeat(rng.standard_normal((1, 32)), 3000, axis=0)
    if kind == "collapsed":
        x = x + 1e-6 * rng.standard_normal(x.shape)
    x, y = x.astype(np.float32), rng.integers(0, 60, 3000)
    backend = "torch" if torch_path else "numpy"
    with K.tuned(cpu_backend=backend), K.count_work() as work:
        got = retrieval_metrics(x, y)
    want = naive_metrics(x, y)
    assert work.exact_pairs < 100 * len(x)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


@pytest.fixture
def torch_path():
    """Run retrieval_metrics's torch path (the one used on CUDA) on CPU."""
    with K.tuned(cpu_backend="torch"):
        yield


@pytest.fixture
def small_tiles():
    """Several tiles, strips and pool prunings even on a few hundred items."""
    with K.tuned(dense_per_candidate=0, tile=64, strip=16, pool_slack=8):
        yield


def test_collapsed_embeddings_are_certified_in_float32():
    """Nearly collinear embeddings: float32 scores relative to the mean vector still separate
    them, so no query needs the exact fallback and few pairs need an exact distance."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 40, 600)
    x = (np.ones(64) + 1e-4 * rng.standard_normal((600, 64))).astype(np.float32)
    with K.count_work() as work:
        got = retrieval_metrics(x, y)
    want = naive_metrics(x, y)
    assert work.ranked_exactly == 0
    assert work.exact_pairs < 2 * len(x)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_nearly_collapsed_embeddings_use_every_certificate():
    """Two antipodal clusters of near-copies (the mean is ~0, so float32 scores are not
    centred) tie at the float32 resolution: some queries are certified from float32 alone,
    some after exact distances of their candidates, some only with 4× more candidates."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 40, 600)
    sign = np.where(rng.random(600) < 0.5, 1.0, -1.0)[:, None]
    x = (sign * np.ones(8) + 1e-2 * rng.standard_normal((600, 8))).astype(np.float32)
    with K.count_work() as work:
        got = retrieval_metrics(x, y)
    want = naive_metrics(x, y)
    retried = work.widened
    rescored = work.rescored - retried  # the retries are rescored too
    assert 0 < retried < rescored < int((np.bincount(y)[y] > 1).sum())
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def exact_copies(
    copies: int = 60, labels: int = 10, groups: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    """Groups of identical vectors under random labels: exact ties everywhere."""
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((groups, 16))
    x = np.repeat(centres, copies, axis=0).astype(np.float32)
    return x, rng.integers(0, labels, len(x))


def clustered_with_copies(copies: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """~400 distinct clustered items plus ``groups`` of them repeated ``copies`` times under
    random labels: most rows distinct, a few queries with more exact ties than candidates."""
    x, y = clustered(30, 16, 1, spread=0.5, singletons=0)
    rng = np.random.default_rng(1)
    pick = rng.choice(len(x), groups, replace=False)
    cx, cy = np.repeat(x[pick], copies, axis=0), rng.integers(0, 30, copies * groups)
    return np.concatenate([x, cx]), np.concatenate([y, cy])


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    ("copies", "groups", "path"),
    [(20, 4, "widened"), (250, 2, "ranked_exactly")],
)
def test_exact_ties_go_to_the_lower_index(normalize, copies, groups, path):
    """More exact copies than R + 4 candidates: ties at the boundary cannot be certified; those
    queries get 4× more candidates, or (more copies still) are ranked exactly, and every tie
    goes to the lower index."""
    x, y = clustered_with_copies(copies, groups)
    with K.count_work() as work:
        got = retrieval_metrics(x, y, normalize=normalize)
    want = naive_metrics(x, y, normalize)
    assert 0 < getattr(work, path) < len(x)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


@pytest.mark.parametrize("torch_path", [False, True])
def test_mostly_duplicated_rows_are_ranked_exactly_at_once(torch_path):
    """At most a quarter of the rows distinct: no float32 search, every query ranked exactly
    at once, each distinct vector scored once against each distinct vector."""
    x, y = exact_copies(120, 60, 4)
    backend = "torch" if torch_path else "numpy"
    with K.tuned(cpu_backend=backend), K.count_work() as work:
        got = retrieval_metrics(x, y)
    want = naive_metrics(x, y)
    assert work.ranked_exactly == len(x)
    assert work.exact_pairs <= 4 * 4
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_near_ties_inside_the_top_r_are_resorted_in_float64():
    """Duplicated items tie in float32 inside the top R while the boundary is clear: the fast
    certificate re-scores just those runs in float64 (ties by index), no full ranking needed."""
    x, y = clustered(40, 32, 4, spread=0.3, singletons=0)
    x, y = np.concatenate([x, x[::3]]), np.concatenate([y, y[::3]])  # a copy of every third
    with K.count_work() as work:
        got = retrieval_metrics(x, y)
    want = naive_metrics(x, y)
    assert work.exact_pairs > 0
    assert work.ranked_exactly == 0
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_many_tiles_strips_and_prunings_give_the_naive_values(small_tiles, normalize):
    """Upper-triangle tiles (each feeding its rows and its columns), a short last block, pools
    pruned all the time: the same values as the naive loop."""
    x, y = clustered(25, 24, 9, spread=1.2)  # ~350 items: 6 blocks of 64, the last one short
    x *= np.random.default_rng(1).uniform(0.5, 2.0, (len(x), 1)).astype(np.float32)
    with K.count_work() as work:
        got = retrieval_metrics(x, y, normalize=normalize)
    want = naive_metrics(x, y, normalize)
    assert work.certified_blocks == -(-len(x) // 64)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_float32_overflow_ranks_everything_in_float64():
    """Unnormalised embeddings too large for float32 scores: the exact float64 ranking alone."""
    x, y = clustered(10, 8, 2)
    x = x.astype(np.float64) * 1e30
    got, want = retrieval_metrics(x, y, normalize=False), naive_metrics(x, y, normalize=False)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_torch_path_ties_at_the_candidate_boundary_fall_back_to_the_exact_ranking(torch_path):
    """The torch path (CUDA): ties at the boundary of the float32 candidates cannot be
    certified, even with 4× more, so those queries are ranked exactly (ties by index)."""
    x, y = clustered_with_copies(250, 2)
    with K.count_work() as work:
        got = retrieval_metrics(x, y)
    want = naive_metrics(x, y)
    assert 0 < work.ranked_exactly < len(x)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_torch_path_equals_the_numpy_path(torch_path, normalize):
    x, y = clustered(30, 48, 6)
    got = retrieval_metrics(x, y, normalize=normalize)
    with K.tuned(cpu_backend="numpy"):
        assert got == pytest.approx(retrieval_metrics(x, y, normalize=normalize), abs=1e-12)


def test_unnormalised_ranks_by_euclidean_distance():
    x, y = clustered(20, 16, 7)
    x *= np.random.default_rng(0).uniform(0.2, 5.0, (len(x), 1)).astype(np.float32)
    got, want = retrieval_metrics(x, y, normalize=False), naive_metrics(x, y, normalize=False)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-6)
    assert got["map_at_r"] != pytest.approx(retrieval_metrics(x, y)["map_at_r"], abs=1e-4)


@pytest.mark.parametrize(
    ("n_classes", "dim", "spread"), [(100, 128, 2.0), (60, 512, 2.5), (200, 64, 1.5)]
)
@pytest.mark.parametrize("normalize", [True, False])
def test_against_pml_accuracy_calculator(n_classes, dim, spread, normalize):
    """PML's tester L2-normalises before AccuracyCalculator, which itself ranks by raw L2."""
    x, y = clustered(n_classes, dim, seed=n_classes, spread=spread)
    calc = AccuracyCalculator(
        include=("mean_average_precision_at_r", "precision_at_1", "r_precision"), k="max_bin_count"
    )
    q = torch.from_numpy(x)
    ref = calc.get_accuracy(
        torch.nn.functional.normalize(q) if normalize else q, torch.from_numpy(y)
    )
    got = retrieval_metrics(x, y, normalize=normalize)
    assert 0.05 < got["map_at_r"] < 0.95  # a regime where a wrong ranking would show
    assert got["map_at_r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)
    assert got["precision_at_1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert got["r_precision"] == pytest.approx(ref["r_precision"], abs=1e-6)


def test_against_pml_on_several_tiles():
    """~3,000 items in 128-D: two 2,048-row blocks, the off-diagonal tile read both ways."""
    x, y = clustered(200, 128, seed=5, spread=2.0, sizes=(2, 28))
    calc = AccuracyCalculator(
        include=("mean_average_precision_at_r", "precision_at_1", "r_precision"), k="max_bin_count"
    )
    ref = calc.get_accuracy(torch.nn.functional.normalize(torch.from_numpy(x)), torch.from_numpy(y))
    got = retrieval_metrics(x, y)
    assert len(x) > K.current_tuning().tile and 0.05 < got["map_at_r"] < 0.95
    assert got["map_at_r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)
    assert got["precision_at_1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert got["r_precision"] == pytest.approx(ref["r_precision"], abs=1e-6)


def test_torch_path_blocked_computation_equals_one_block(torch_path):
    x, y = clustered(40, 32, 3)
    whole = retrieval_metrics(x, y)
    with K.tuned(block_bytes=4 * len(x) * 37):  # 37 queries per block
        assert retrieval_metrics(x, y) == pytest.approx(whole, abs=1e-12)


def test_lone_queries_are_excluded_and_duplicates_of_self_count():
    x = np.repeat(np.eye(4, dtype=np.float32), [3, 1, 4, 2], axis=0)
    y = np.repeat(np.arange(4), [3, 1, 4, 2])
    got = retrieval_metrics(x, y)
    assert got["num_queries"] == 9
    assert got["map_at_r"] == got["precision_at_1"] == got["r_precision"] == 1.0


def test_torch_input_and_device_argument_give_the_same_numbers():
    x, y = clustered(25, 16, 5)
    a = retrieval_metrics(x, y)
    b = retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y), device="cpu")
    assert a == b


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("name", ["clustered", *TIE_HEAVY])
def test_cuda_matches_cpu_exactly(name, normalize):
    """The same numbers on a GPU as on the CPU, ties included (the issue this ranking fixes)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine; the CPU path is tested above")
    x, y = clustered(50, 128, 11) if name == "clustered" else tie_heavy(name)
    cpu = retrieval_metrics(x, y, normalize=normalize)
    assert retrieval_metrics(x, y, normalize=normalize, device="cuda") == cpu


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((3, 2)), np.zeros(4), "need embeddings"),
        (np.array([[np.nan, 1.0], [1.0, 1.0]]), np.array([0, 0]), "NaN"),
        (np.eye(3), np.arange(3), "no query has another item"),
    ],
)
def test_bad_input_is_a_clear_error(x, y, message):
    with pytest.raises(ValueError, match=message):
        retrieval_metrics(x, y)


def test_concatenate_embeddings_normalises_each_part_then_the_whole():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((10, 128)) * s for s in (0.1, 1.0, 10.0, 3.0)]
    got = concatenate_embeddings(parts)
    unit = [p / np.linalg.norm(p, axis=1, keepdims=True) for p in parts]
    want = np.concatenate(unit, axis=1) / 2.0  # four unit parts → norm 2
    assert isinstance(got, np.ndarray) and got.shape == (10, 512)
    np.testing.assert_allclose(got, want, atol=1e-6)
    t = concatenate_embeddings([torch.from_numpy(p) for p in parts])
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), want, atol=1e-6)
    with pytest.raises(ValueError, match="different numbers of rows"):
        concatenate_embeddings([parts[0], parts[1][:5]])
