"""Stored test embeddings and re-scoring without training (issue #26): a tiny study tested end
to end through the ``mlrc`` command stores one ``.npz`` per reproduction; ``mlrc study rescore``
and ``mlrc report --metrics`` score new metrics from it.

The references are independent of the code under test: the arrays loaded with ``numpy.load``
alone, MAP@R and the new metrics computed on them by naive float64 loops written here (one query
at a time, ties to the lower index), ``hashlib`` for the file's hash, ``os.stat`` for sizes, the
dataset's own labels, and the schema-3 fixture store written by a release from before embeddings
were kept."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_retention import cli, copy_store, rows, study_file

from mlrc import data
from mlrc.cli.gc import human_bytes
from mlrc.protocol import mlrc_split, retrieval_metrics
from mlrc.search.embeddings import load_checked, write_npz
from mlrc.store.schema import EmbeddingFile, FoldRun, Rescored, TestResult

FIXTURES = Path(__file__).parents[1] / "fixtures"


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def naive_ranking(emb: np.ndarray, q: int) -> list[int]:
    """The other rows by squared distance of the unit float64 rows to row ``q``, ties to the
    lower index."""
    e = unit(emb)
    d = ((e - e[q]) ** 2).sum(axis=1)
    order = np.argsort(d, kind="stable")  # stable: equal distances keep the lower index first
    return [int(r) for r in order if r != q]


def naive_map_at_r(emb: np.ndarray, labels: np.ndarray) -> float:
    """MAP@R by the paper's formula, one query at a time; queries with R = 0 left out."""
    values = []
    for q in range(len(emb)):
        r = int((labels == labels[q]).sum()) - 1
        if r == 0:
            continue
        hits = [labels[x] == labels[q] for x in naive_ranking(emb, q)[:r]]
        values.append(sum(h * (sum(hits[: i + 1]) / (i + 1)) for i, h in enumerate(hits)) / r)
    return float(np.mean(values))


def naive_mrr_recall(emb: np.ndarray, labels: np.ndarray, k: int) -> tuple[float, float]:
    """All vs all, lone queries left out: the mean reciprocal rank of the first same-class
    item, and Recall@k (1 when a same-class item is among the first k)."""
    rr, hit = [], []
    for q in range(len(emb)):
        if (labels == labels[q]).sum() < 2:
            continue
        same = [labels[x] == labels[q] for x in naive_ranking(emb, q)]
        rr.append(1.0 / (same.index(True) + 1))
        hit.append(float(any(same[:k])))
    return float(np.mean(rr)), float(np.mean(hit))


def naive_ndcg(emb: np.ndarray, labels: np.ndarray, k: int) -> float:
    """All vs all NDCG@k with linear 0/1 gains (Järvelin & Kekäläinen): Σ_{i≤k} rel/log₂(i+1)
    over the ideal order's (R relevant first); lone queries left out."""
    out = []
    for q in range(len(emb)):
        R = int((labels == labels[q]).sum()) - 1
        if R == 0:
            continue
        same = [labels[x] == labels[q] for x in naive_ranking(emb, q)[:k]]
        dcg = sum(float(h) / math.log2(i + 2) for i, h in enumerate(same))
        out.append(dcg / sum(1.0 / math.log2(i + 2) for i in range(min(k, R))))
    return float(np.mean(out))


def naive_concatenation(separated: np.ndarray) -> np.ndarray:
    """Each fold model's rows L2-normalised, concatenated, normalised again (float64)."""
    return unit(np.concatenate([unit(s) for s in separated], axis=1))


@pytest.fixture(scope="module")
def tested(tmp_path_factory):
    """A study with nothing to search (its loss parameters fixed), tested (2 reproductions),
    float16 embeddings (the default)."""
    tmp = tmp_path_factory.mktemp("rescore")
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    fixed = {"name": "contrastive", "params": {}, "search": {}}
    path = study_file(tmp, "e", trials=1, reps=2, loss=fixed)
    cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet")
    return url, art


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stored_files(url: str, art: Path) -> dict[int, tuple[Path, EmbeddingFile]]:
    return {f.reproduction: (art / "e" / f.path, f) for f in rows(url, EmbeddingFile)}


# --- stored embeddings -------------------------------------------------------------------------


def test_each_reproduction_stores_its_test_embeddings_with_their_hash(tested):
    url, art = tested
    files = stored_files(url, art)
    assert sorted(files) == [1, 2]
    ds = data.build("glyphs")
    split = mlrc_split(ds.labels, scheme="mlrc")
    test_labels = ds.labels[np.isin(ds.labels, split.test_classes)]
    for rep, (path, row) in files.items():
        assert path.name == f"test-rep{rep}.npz" and path.parent.name == "embeddings"
        assert row.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert row.size == os.stat(path).st_size and row.dtype == "float16"
        with np.load(path, allow_pickle=False) as z:  # numpy alone reads it
            # no super-classes in glyphs
            assert sorted(z.files) == ["best_epochs", "labels", "roles", "separated"]
            sep, labels, roles = z["separated"], z["labels"], z["roles"]
            epochs = z["best_epochs"].tolist()
        folds = sorted(rows(url, FoldRun, kind="test", reproduction=rep), key=lambda f: f.fold)
        assert epochs == [f.best_epoch for f in folds]
        assert sep.dtype == np.float16 and sep.shape == (4, len(test_labels), row.dim)
        assert (row.folds, row.n) == (4, len(test_labels))
        assert sorted(labels.tolist()) == sorted(test_labels.tolist())
        assert set(roles.tolist()) == {"all"}
        assert not list(path.parent.glob(".*tmp"))  # written atomically: no temporary left
        assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as any file mlrc writes


def test_the_stored_embeddings_are_those_the_test_stage_scored(tested):
    """MAP@R of the stored float16 rows by a naive loop ≈ the test stage's stored MAP@R."""
    url, art = tested
    path, _ = stored_files(url, art)[2]
    with np.load(path) as z:
        sep, labels = z["separated"].astype(np.float32), z["labels"]
    results = {(r.mode, r.fold): r.map_at_r for r in rows(url, TestResult, reproduction=2)}
    for k in (0, 3):
        assert naive_map_at_r(sep[k], labels) == pytest.approx(results[("separated", k)], abs=2e-3)
    joined = naive_map_at_r(naive_concatenation(sep), labels)
    assert joined == pytest.approx(results[("concatenated", -1)], abs=2e-3)


def test_float32_is_kept_bit_for_bit_and_float16_within_its_rounding(tmp_path):
    rng = np.random.default_rng(0)
    sep = [rng.normal(size=(50, 8)).astype(np.float32) for _ in range(2)]
    labels, roles = rng.integers(0, 5, 50), np.array(["query", "gallery"] * 25)
    sup = labels // 2
    f32 = write_npz(tmp_path / "a.npz", sep, labels, roles, sup, dtype="float32")
    f16 = write_npz(tmp_path / "b.npz", sep, labels, roles, None)
    assert (f32["dtype"], f16["dtype"]) == ("float32", "float16")
    a = load_checked(tmp_path / "a.npz", f32["sha256"], "a")
    assert np.array_equal(a["separated"], np.stack(sep)) and a["roles"].tolist() == roles.tolist()
    assert a["super_labels"].tolist() == sup.tolist() and a["labels"].dtype == np.int64
    b = load_checked(tmp_path / "b.npz", f16["sha256"], "b")
    assert np.allclose(b["separated"], np.stack(sep), rtol=2**-11, atol=0)
    assert "super_labels" not in b
    # beyond float16's range: kept as float32, as the store records
    big = write_npz(tmp_path / "c.npz", [sep[0] * 1e5], labels, roles, None)
    assert big["dtype"] == "float32"


def test_float16_map_at_r_equals_float32_within_the_documented_tolerance():
    """A real-size set (10,000 × 128, 100 classes of clustered rows): MAP@R of the float16
    rows is within 0.0001 (0.01 points) of the float32 rows' (docs/guide/reports.md)."""
    rng = np.random.default_rng(26)
    centres = rng.normal(size=(100, 128)).astype(np.float32)
    labels = rng.integers(0, 100, 10_000)
    emb = centres[labels] + 2.0 * rng.normal(size=(10_000, 128)).astype(np.float32)
    full = retrieval_metrics(emb, labels)["map_at_r"]
    half = retrieval_metrics(emb.astype(np.float16).astype(np.float32), labels)["map_at_r"]
    assert 0.2 < full < 0.9  # neither trivial nor hopeless
    assert abs(half - full) <= 1e-4  # measured: 5e-6


# --- retention and gc --------------------------------------------------------------------------


def test_retention_keeps_the_embeddings_and_gc_counts_them(tested, tmp_path):
    url0, art0 = tested
    url, art = copy_store(url0, tmp_path / "db.sqlite"), tmp_path / "art"
    shutil.copytree(art0, art)
    npz = sorted(art.rglob("*.npz"))
    kept = sorted(art.rglob("*.pt"))  # keep resume: one reproduction's fold models (#37)
    assert len(npz) == 2 and kept and {p.name for p in kept} == {"best.pt"}
    assert len({p.parts[-3] for p in kept}) == 1  # of one reproduction
    size = sum(os.stat(p).st_size for p in npz)
    both = size + sum(os.stat(p).st_size for p in kept)
    out = cli("gc", "--storage", url, "--artifacts", art, "--keep", "resume").output
    assert f"kept {human_bytes(size)} of stored test embeddings in 2 files" in out
    assert sorted(art.rglob("*.npz")) == npz
    # an archived study's embeddings go with its folder, counted as freed
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        c.execute("UPDATE mlrc_study SET name = 'e.old-1' WHERE name = 'e'")
    os.replace(art / "e", art / "e.old-1")
    out = cli("gc", "--storage", url, "--artifacts", art).output
    assert f"freed {human_bytes(both)} in {2 + len(kept)} files" in out
    assert not list(art.rglob("*.npz"))


def test_an_upgraded_release_store_has_the_new_tables_and_no_files(tmp_path):
    path = tmp_path / "legacy3.db"
    shutil.copyfile(FIXTURES / "store-schema3.db", path)
    url = f"sqlite:///{path}"
    assert rows(url, EmbeddingFile) == [] and rows(url, Rescored) == []
    assert rows(url, TestResult)  # tested before embeddings were stored


# --- re-scoring ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rescored(tested, tmp_path_factory):
    """``mlrc study rescore e --metrics mrr,recall_at_k@2`` on a copy of the tested store."""
    url0, art = tested
    url = copy_store(url0, tmp_path_factory.mktemp("rescored") / "db.sqlite")
    out = cli("study", "rescore", "e", "--metrics", "mrr,recall_at_k@2", "--storage", url,
              "--artifacts", art).output  # fmt: skip
    return url, art, out


def test_rescore_equals_naive_loops_on_the_loaded_arrays(rescored):
    url, art, out = rescored
    assert "computed after the fact from stored embeddings" in out and "all vs all" in out
    path, row = stored_files(url, art)[1]
    with np.load(path) as z:
        sep, labels = z["separated"].astype(np.float32), z["labels"]
    want = {("separated", k): naive_mrr_recall(sep[k], labels, 2) for k in range(4)}
    # the separated mean leaves out a fold kept at epoch 0 (the reference's), unless all are
    epochs = {f.fold: f.best_epoch for f in rows(url, FoldRun, kind="test", reproduction=1)}
    kept = [k for k in range(4) if epochs[k] != 0] or list(range(4))
    want[("separated", -1)] = tuple(np.mean([want[("separated", k)] for k in kept], axis=0))
    want[("concatenated", -1)] = naive_mrr_recall(naive_concatenation(sep), labels, 2)
    got = {}
    for r in rows(url, Rescored, reproduction=1):
        got.setdefault((r.mode, r.fold), {})[r.metric] = r.value
        assert r.sha256 == row.sha256
    assert sorted(got) == sorted(want)
    for key, (mrr, recall) in want.items():
        assert math.isclose(got[key]["mrr"], mrr, abs_tol=1e-9), key
        assert math.isclose(got[key]["recall_at_2"], recall, abs_tol=1e-9), key
    assert {r.reproduction for r in rows(url, Rescored)} == {1, 2}


def test_the_report_shows_the_rescored_metrics_with_intervals_and_the_mark(rescored):
    url, _, _ = rescored
    md = cli("report", "--storage", url, "--metrics", "mrr,recall_at_k@2").output
    assert "Concat. MRR*" in md and "Sep. R@2*" in md
    assert "computed after the fact from stored embeddings" in md
    csv = cli("report", "--storage", url, "--metrics", "mrr", "--format", "csv").output
    lines = list(__import__("csv").DictReader(csv.splitlines()))
    mrr = [x for x in lines if x["metric"] == "mrr" and x["mode"] == "concatenated"]
    assert len(mrr) == 1 and mrr[0]["after_the_fact"] == "True" and mrr[0]["n"] == "2"
    values = [r.value for r in rows(url, Rescored, mode="concatenated", fold=-1, metric="mrr")]
    mean = 100 * float(np.mean(values))
    half = 100 * stats.t.ppf(0.975, 1) * float(np.std(values, ddof=1)) / math.sqrt(2)
    assert math.isclose(float(mrr[0]["mean"]), mean, abs_tol=1e-6)
    assert math.isclose(float(mrr[0]["half_width"]), half, abs_tol=1e-6)
    html = cli("report", "--storage", url, "--metrics", "mrr", "--format", "html").output
    assert "<th>MRR*</th>" in html and '<th colspan="4">' in html  # 3 + 1 per mode
    tex = cli("report", "--storage", url, "--metrics", "mrr", "--format", "latex").output
    assert "MAP@R & P@1 & R-Prec & MRR* & MAP@R" in tex
    plain = cli("report", "--storage", url).output  # without --metrics: as before
    assert "MRR" not in plain and "after the fact" not in plain


def test_the_report_computes_a_new_metric_from_the_stored_embeddings(rescored, tmp_path):
    """``report --metrics`` scores what the store lacks from the files, stores it, shows it."""
    url, art = copy_store(rescored[0], tmp_path / "db.sqlite"), rescored[1]
    lost = cli("report", "--storage", url, "--artifacts", tmp_path / "elsewhere", "--metrics",
               "ndcg_at_k@5").output  # fmt: skip
    assert "are missing (moved or deleted)" in lost  # the files are not where it looks
    # the note says why (not a rescore that would fail the same way, #37)
    assert "ndcg_at_5 not computed: study 'e', reproduction 1: stored embeddings" in lost
    md = cli("report", "--storage", url, "--artifacts", art, "--metrics", "ndcg_at_k@5").output
    assert "computed from stored embeddings: ndcg_at_5 of e" in md and "NDCG@5*" in md
    assert "not computed yet" not in md
    stored = rows(url, Rescored, metric="ndcg_at_5", mode="concatenated", fold=-1)
    for r in stored:  # the value equals a naive NDCG@5 on the loaded arrays
        path = {rep: p for rep, (p, _) in stored_files(url, art).items()}[r.reproduction]
        with np.load(path) as z:
            joined = naive_concatenation(z["separated"].astype(np.float32))
            assert math.isclose(r.value, naive_ndcg(joined, z["labels"], 5), abs_tol=1e-9)
    assert len(stored) == 2


def test_values_of_another_file_than_the_current_one_are_not_shown(rescored, tmp_path):
    url = copy_store(rescored[0], tmp_path / "db.sqlite")
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:  # reproduction 2 tested again
        c.execute("UPDATE mlrc_embedding_file SET sha256 = 'f00d' WHERE reproduction = 2")
    csv = cli("report", "--storage", url, "--metrics", "mrr", "--format", "csv").stdout
    lines = [x for x in __import__("csv").DictReader(csv.splitlines()) if x["metric"] == "mrr"]
    assert lines and {x["n"] for x in lines} == {"1"}
    md = cli("report", "--storage", url, "--metrics", "mrr").output.replace("\n", " ")
    # found where the store recorded them; the changed file is refused and the note says so
    assert "mrr not computed: study 'e', reproduction 2: " in md and "refused" in md


def test_a_file_whose_hash_differs_is_refused_in_one_line(tested, tmp_path):
    url0, art0 = tested
    url, art = copy_store(url0, tmp_path / "db.sqlite"), tmp_path / "art"
    shutil.copytree(art0, art)
    path, _ = stored_files(url, art)[2]
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 1  # one bit of the arrays
    path.write_bytes(bytes(raw))
    r = cli("study", "rescore", "e", "--metrics", "mrr", "--storage", url, "--artifacts", art,
            code=2)  # fmt: skip
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "study 'e', reproduction 2" in line
    assert "sha256" in line and "refused" in line
    assert rows(url, Rescored) == []  # nothing scored, not even the sound reproduction 1


def test_a_study_tested_before_this_release_says_what_to_run(tmp_path):
    path = tmp_path / "legacy3.db"
    shutil.copyfile(FIXTURES / "store-schema3.db", path)
    url = f"sqlite:///{path}"
    with sqlite3.connect(path) as c:
        (name,) = c.execute("SELECT name FROM mlrc_study ORDER BY id LIMIT 1").fetchone()
        tested = c.execute(
            "SELECT DISTINCT reproduction FROM mlrc_test_result WHERE study_id = 1"
        ).fetchall()
    n = max(r for (r,) in tested) + len(tested)
    r = cli("study", "rescore", name, "--metrics", "mrr", "--storage", url, "--artifacts",
            tmp_path, code=2)  # fmt: skip
    assert r.output.strip() == (
        f"error: study {name!r}: no stored embeddings; run `study test --reproductions {n}` again"
    )
    md = cli("report", "--storage", url, "--metrics", "mrr").output
    assert f"no stored embeddings; run `study test --reproductions {n}` again" in md


@pytest.mark.parametrize(
    ("metrics", "words"),
    [("mrrr", "did you mean"), ("recall_at_k@x", "recall_at_k"), ("mrr,,map_at_r", "metrics")],
)
def test_an_unknown_metric_is_one_line(tmp_path, metrics, words):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    for args in (["report"], ["study", "rescore", "e"]):
        r = cli(*args, "--metrics", metrics, "--storage", url, code=2)
        line = r.output.strip()
        assert len(line.splitlines()) == 1 and line.startswith("error: --metrics") and words in line


def test_a_bad_embeddings_dtype_is_one_line(tmp_path):
    bad = study_file(tmp_path, "b", artifacts={"embeddings": "float8"})
    r = cli("study", "test", bad, "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--artifacts", tmp_path, code=2)  # fmt: skip
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "artifacts.embeddings" in line and "float8" in line


def naive_query_gallery(emb: np.ndarray, labels: np.ndarray, roles: np.ndarray, k: int):
    """MRR and Recall@k of each query against the gallery alone (unit float64 rows, ties to the
    lower gallery index); a query without a same-class gallery item is left out."""
    e = unit(emb)
    gallery = np.flatnonzero(roles == "gallery")
    rr, hit = [], []
    for q in np.flatnonzero(roles == "query"):
        d = ((e[gallery] - e[q]) ** 2).sum(axis=1)
        same = [labels[gallery[i]] == labels[q] for i in np.argsort(d, kind="stable")]
        if not any(same):
            continue
        rr.append(1.0 / (same.index(True) + 1))
        hit.append(float(any(same[:k])))
    return float(np.mean(rr)), float(np.mean(hit))


def test_query_gallery_roles_rank_the_gallery_and_an_untrained_fold_leaves_the_mean():
    from mlrc.protocol.scoring import parse_metrics
    from mlrc.search.rescore import score_arrays
    from mlrc.store.embeddings import retrieval_of

    rng = np.random.default_rng(3)
    sep = rng.normal(size=(2, 90, 8)).astype(np.float16)
    labels = rng.integers(0, 9, 90)
    roles = np.array(["query"] * 30 + ["gallery"] * 60)
    arrays = {"separated": sep, "labels": labels, "roles": roles, "best_epochs": np.array([0, 4])}
    assert retrieval_of(roles) == "query→gallery"
    got = {(m, f): v for m, f, v in score_arrays(parse_metrics("mrr,recall_at_k@2"), arrays)}
    sep32 = sep.astype(np.float32)
    for k in range(2):
        mrr, recall = naive_query_gallery(sep32[k], labels, roles, 2)
        assert math.isclose(got[("separated", k)]["mrr"], mrr, abs_tol=1e-9)
        assert math.isclose(got[("separated", k)]["recall_at_2"], recall, abs_tol=1e-9)
    assert got[("separated", -1)] == got[("separated", 1)]  # fold 0 kept epoch 0: left out
    mrr, recall = naive_query_gallery(naive_concatenation(sep32), labels, roles, 2)
    assert math.isclose(got[("concatenated", -1)]["mrr"], mrr, abs_tol=1e-9)
    assert math.isclose(got[("concatenated", -1)]["recall_at_2"], recall, abs_tol=1e-9)
