"""Retrieval views: the test stage's sample queries with their nearest test images and 2-D map of
the test embeddings (``mlrc_retrieval_view``), and their section of the dashboard, checked in a
real headless Chromium.

The references are independent of the code under test: a naive float64 loop over every item
(ties: lower index) for the neighbours, numpy's SVD for the PCA map, the dataset's own labels for
"same class", the embeddings recomputed from the exported best reproduction (``mlrc study
export-model``, preprocessed as its file documents, not by mlrc) for the stored neighbours, and
the browser's own rendering (``naturalWidth``, computed border colours, Plotly's ``gd.data``)."""

from __future__ import annotations

import importlib.util
import logging
import re

import numpy as np
import pytest
import torch
from sqlalchemy import select
from test_dashboard import browser, dash, load, severe  # noqa: F401 (browser: a fixture)
from test_retention import _test_images, cli, copy_store, rows, study_file

from mlrc import data, store
from mlrc.protocol import mlrc_split
from mlrc.protocol.retrieval import embedding_map, retrieval_view, sample_queries, sample_retrievals
from mlrc.store.engine import session
from mlrc.store.schema import RetrievalView, Study, TestResult

HAVE_UMAP = importlib.util.find_spec("umap") is not None
GREEN, RED = "rgb(26, 158, 58)", "rgb(214, 39, 40)"  # dashboard.css: img.same, img.different


def naive_top_k(emb: np.ndarray, q: int, k: int) -> list[int]:
    """The k nearest other rows of row q: squared distance of the L2-normalised float64 rows,
    one reference at a time, ties to the lower index."""
    e = np.asarray(emb, dtype=np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    d = [(float(((e[r] - e[q]) ** 2).sum()), r) for r in range(len(e)) if r != q]
    return [r for _, r in sorted(d)[:k]]


# --- the pure functions ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, [7, 2]])
def test_sample_retrievals_equal_a_naive_float64_loop(seed):
    rng = np.random.default_rng(12)
    emb = rng.normal(size=(240, 24)).astype(np.float32)
    emb[10] = emb[3]  # exact duplicates: equal distances, the lower index first
    emb[11] = emb[3]
    emb[50] = 2.5 * emb[40]  # collinear: the same unit vector
    labels = rng.integers(0, 30, size=240)
    labels[[3, 10, 11]] = [4, 4, 5]
    queries, nbr = sample_retrievals(emb, labels, n_queries=12, k=6, seed=seed)
    assert nbr.shape == (12, 6)
    for q, row in zip(queries.tolist(), nbr.tolist(), strict=True):
        assert row == naive_top_k(emb, q, 6)
    # the duplicates' ties, checked directly
    q3 = sample_retrievals(emb[[3, 10, 11, 0, 1]], np.arange(5), 5, 3, seed)
    by_query = dict(zip(q3[0].tolist(), q3[1].tolist(), strict=True))
    assert by_query[0][:2] == [1, 2] and by_query[2][:2] == [0, 1]


def test_sample_queries_are_spread_over_classes_and_seeded():
    labels = np.repeat(np.arange(10), 7)
    q = sample_queries(labels, 8, seed=3)
    assert len(set(labels[q].tolist())) == 8 and len(set(q.tolist())) == 8
    assert q.tolist() == sample_queries(labels, 8, seed=3).tolist()
    assert q.tolist() != sample_queries(labels, 8, seed=4).tolist()
    more = sample_queries(labels, 25, seed=3)  # more queries than classes: every class, again
    assert len(set(more.tolist())) == 25
    assert np.bincount(labels[more], minlength=10).min() >= 2
    assert len(sample_queries(labels[:3], 8, seed=0)) == 3  # no more queries than items


def test_embedding_map_is_pca_of_the_unit_rows_seeded_and_capped():
    rng = np.random.default_rng(5)
    emb = rng.normal(size=(300, 16)) + rng.normal(size=16)
    rows, xy, method = embedding_map(emb, seed=[0, 1], max_points=120, method="pca")
    assert method == "pca" and len(rows) == 120 and xy.shape == (120, 2)
    assert np.all(np.diff(rows) > 0) and rows.max() < 300
    again = embedding_map(emb, seed=[0, 1], max_points=120, method="pca")
    assert again[0].tolist() == rows.tolist() and np.array_equal(again[1], xy)
    # numpy's SVD of the centred unit rows (signs are arbitrary)
    u = emb[rows] / np.linalg.norm(emb[rows], axis=1, keepdims=True)
    u -= u.mean(axis=0)
    _, _, vt = np.linalg.svd(u, full_matrices=False)
    ref = u @ vt[:2].T
    for c in range(2):
        assert np.allclose(np.abs(xy[:, c]), np.abs(ref[:, c]), atol=1e-10)
    all_rows, _, auto = embedding_map(emb, seed=0, max_points=2000)
    assert all_rows.tolist() == list(range(300)) and auto == ("umap" if HAVE_UMAP else "pca")


def test_the_view_s_json_maps_rows_to_dataset_items():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(60, 8)).astype(np.float32)
    labels = np.repeat(np.arange(100, 112), 5)
    indices = np.arange(60) * 3 + 7
    names = {c: f"class-{c}" for c in range(100, 112)}
    v = retrieval_view(emb, labels, indices, names, n_queries=4, k=3, max_points=50, seed=[0, 1])
    assert v["k"] == 3 and v["n"] == 60 and len(v["queries"]) == 4
    row_of = {int(i): r for r, i in enumerate(indices)}
    for q in v["queries"]:
        r = row_of[q["index"]]
        assert q["label"] == labels[r] and q["name"] == f"class-{labels[r]}"
        assert [row_of[n["index"]] for n in q["neighbours"]] == naive_top_k(emb, r, 3)
        assert all(n["same"] == (n["label"] == q["label"]) for n in q["neighbours"])
    m = v["map"]
    assert len(m["x"]) == len(m["y"]) == len(m["label"]) == len(m["index"]) == 50
    assert all(round(x, 4) == x for x in m["x"] + m["y"])
    assert all(labels[row_of[i]] == c for i, c in zip(m["index"], m["label"], strict=True))


# --- the test stage ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tested(tmp_path_factory):
    """A tiny real study (glyphs, 1 trial, 2 reproductions, the best reproduction's checkpoints
    kept for the export), searched and tested through the CLI; and a copy of its store taken
    after the search (for the test stage whose view fails)."""
    tmp = tmp_path_factory.mktemp("views")
    path = study_file(tmp, name="rv", trials=1, reps=2, artifacts={"keep": "best"})
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    cli("study", "run", path, "--storage", url, "--artifacts", art, "--quiet")
    searched = copy_store(url, tmp / "searched.sqlite")
    cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet")
    return {"url": url, "art": art, "path": path, "searched": searched, "tmp": tmp}


def _views(url: str) -> dict[int, dict]:
    return {v.reproduction: v.data for v in rows(url, RetrievalView)}


def _best_reproduction(url: str) -> TestResult:
    done = rows(url, TestResult, mode="concatenated", fold=-1)
    return max(done, key=lambda r: (r.map_at_r, -r.reproduction))


def test_each_reproduction_stores_a_view_of_its_test_embeddings(tested):
    ds = data.build("glyphs")
    test_items = np.flatnonzero(
        np.isin(ds.labels, mlrc_split(ds.labels, scheme="mlrc").test_classes)
    )
    views = _views(tested["url"])
    assert sorted(views) == [1, 2]
    for v in views.values():
        assert v["k"] == 5 and v["n"] == len(test_items) and len(v["queries"]) == 8
        assert len({q["label"] for q in v["queries"]}) == 8  # one query per class
        for q in v["queries"]:
            assert q["index"] in test_items and q["label"] == ds.labels[q["index"]]
            assert q["name"] == ds.class_names[q["label"]]
            nbrs = q["neighbours"]
            assert len(nbrs) == 5 and q["index"] not in [n["index"] for n in nbrs]
            assert len({n["index"] for n in nbrs}) == 5
            for n in nbrs:
                assert n["index"] in test_items and n["label"] == ds.labels[n["index"]]
                assert n["same"] == (ds.labels[n["index"]] == ds.labels[q["index"]])
        m = v["map"]
        assert m["method"] == ("umap" if HAVE_UMAP else "pca")
        assert m["index"] == test_items.tolist()  # 880 test images: under the 2,000 cap
        assert m["label"] == ds.labels[test_items].tolist()
        assert len(m["x"]) == len(m["y"]) == len(test_items)
        assert all(np.isfinite(m["x"])) and np.std(m["x"]) > 0 and np.std(m["y"]) > 0
    assert views[1]["queries"] != views[2]["queries"]  # seeded by (study seed, reproduction)


def test_the_stored_neighbours_are_those_of_the_exported_embeddings(tested, tmp_path):
    """The best reproduction's 512-D model, exported and run without mlrc's preprocessing: each
    stored query's neighbours equal a naive float64 top-5 over its embeddings."""
    from mlrc.train import load_exported

    out = tmp_path / "model.pt"
    cli("study", "export-model", "rv", "--storage", tested["url"], "--artifacts", tested["art"],
        "--out", out, "--dim", "512")  # fmt: skip
    module, meta = load_exported(out)
    best = _best_reproduction(tested["url"])
    assert meta["reproduction"] == best.reproduction
    x, labels = _test_images(meta)
    with torch.no_grad():
        emb = module(x).numpy()
    view = _views(tested["url"])[best.reproduction]
    items = view["map"]["index"]  # every test item, in the embeddings' order
    row_of = {i: r for r, i in enumerate(items)}
    for q in view["queries"]:
        expected = [items[r] for r in naive_top_k(emb, row_of[q["index"]], 5)]
        assert [n["index"] for n in q["neighbours"]] == expected


def test_a_failing_view_never_fails_the_reproduction(tested, monkeypatch, caplog):
    import mlrc.search.reproductions as reproductions

    def broken(*args, **kwargs):
        raise RuntimeError("no map today\nsecond line")

    monkeypatch.setattr(reproductions, "retrieval_view", broken)
    url, art = tested["searched"], tested["tmp"] / "art-failing"  # retrains from scratch
    with caplog.at_level(logging.WARNING, logger="mlrc"):
        cli("study", "test", tested["path"], "--storage", url, "--artifacts", art, "--quiet")
    assert {r.reproduction for r in rows(url, TestResult)} == {1, 2}
    assert _views(url) == {}
    said = [r.getMessage() for r in caplog.records if "retrieval view" in r.getMessage()]
    assert said == [
        f"reproduction {rep}: no retrieval view for the dashboard (no map today)" for rep in (1, 2)
    ]


# --- the dashboard -----------------------------------------------------------------------------

IMAGES_JS = """
return Array.from(document.querySelectorAll('.retrieval-view table.retrieval img')).map(i => ({
  cls: i.className, index: Number(i.dataset.index), same: i.dataset.same || null,
  complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, src: i.src.slice(0, 22),
  border: getComputedStyle(i).borderTopColor, shown: i.getBoundingClientRect().width}));
"""


def test_the_dashboard_shows_the_best_reproduction_s_view(browser, tested, tmp_path):  # noqa: F811
    url = tested["url"]
    out = tmp_path / "report.html"
    dash("build", "--out", str(out), "--storage", url)
    page = out.read_text(encoding="utf-8")
    best = _best_reproduction(url)
    view = _views(url)[best.reproduction]
    assert f'data-reproduction="{best.reproduction}"' in page
    assert f"test MAP@R {best.map_at_r:.4f}" in page
    # every image embedded as a data: URI, none fetched
    srcs = re.findall(r'<img class="(?:query|same|different)" src="([^"]*)"', page)
    assert len(srcs) == 8 * (1 + 5)
    assert all(re.fullmatch(r"data:image/(png|jpeg);base64,[A-Za-z0-9+/=]+", s) for s in srcs)

    n_charts = page.count("Plotly.newPlot(")  # test, the study's charts, the embedding map
    charts = load(browser, out.as_uri(), n_charts)
    assert [c["kind"] for c in charts][-1] == "retrieval-map"
    assert severe(browser) == []
    images = browser.execute_script(IMAGES_JS)
    expected = [
        (q["index"], None, "query") if j == 0 else (n["index"], n["same"], None)
        for q in view["queries"]
        for j, n in enumerate([None, *q["neighbours"]])
    ]
    assert len(images) == len(expected) == 48
    for img, (index, same, _) in zip(images, expected, strict=True):
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img  # drawn, not broken
        assert img["shown"] > 0 and img["index"] == index and img["src"].startswith("data:image/")
        if same is None:
            assert img["cls"] == "query"
        else:
            assert img["same"] == str(same).lower()
            assert img["border"] == (GREEN if same else RED), img
    ds = data.build("glyphs")
    assert {i["w"] for i in images} == {min(64, ds.load_image(0).width)}

    # the map: every stored point drawn, coloured by class, the queries starred
    (m,) = [c for c in charts if c["kind"] == "retrieval-map"]
    assert m["study"] == "rv" and m["svg"] >= 1
    points = [t for t in m["data"] if (t["meta"] or {}).get("role") in ("class", "points")]
    xs = sorted(x for t in points for x in t["x"])
    assert xs == sorted(view["map"]["x"])
    (stars,) = [t for t in m["data"] if (t["meta"] or {}).get("role") == "queries"]
    assert len(stars["x"]) == 8
    drawn = browser.execute_script(
        'return document.querySelectorAll(\'figure[data-kind="retrieval-map"] .scatterlayer '
        ".point').length"
    )
    assert drawn == len(view["map"]["x"]) + 8


def test_a_dataset_that_cannot_be_read_is_one_line_not_a_crash(browser, tested, tmp_path):  # noqa: F811
    url = copy_store(tested["url"], tmp_path / "moved.sqlite")
    with session(store.connect(url)) as s:
        st = s.execute(select(Study).filter_by(name="rv")).scalar_one()
        config = dict(st.config)
        config["study"] = {
            **config["study"],
            "dataset": {"name": "cub200", "root": str(tmp_path / "nowhere"), "params": {}},
        }
        st.config = config
    out = tmp_path / "report.html"
    dash("build", "--out", str(out), "--storage", url)
    page = out.read_text(encoding="utf-8")
    (note,) = re.findall(r'<p class="note" data-kind="retrieval">([^<]*)</p>', page)
    assert note.startswith("No thumbnails: dataset &#x27;cub200&#x27; cannot be read on this")
    assert "\n" not in note and "<img" not in page.split('class="retrieval-view"')[1]
    charts = load(browser, out.as_uri(), page.count("Plotly.newPlot("))
    assert "retrieval-map" in [c["kind"] for c in charts]  # the map needs no dataset
    assert severe(browser) == []


def test_stores_without_views_show_no_retrieval_section(tmp_path):
    from mlrc.report.dashboard import Dashboard

    url = f"sqlite:///{tmp_path / 'none.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        s.add(
            Study(
                name="plain",
                dataset="glyphs",
                loss="contrastive",
                strategy=None,
                preset="cpu",
                config={},
                code_version="test",
            )
        )
    page = Dashboard(url).page()
    assert "retrieval-view" not in page.split("</style>")[1]
