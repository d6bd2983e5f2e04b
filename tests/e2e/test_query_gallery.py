"""A study on a small In-Shop-layout folder is tested query→gallery, as In-Shop's benchmark:
its test rows (MAP@R, P@1, R-Precision, Recall@K for K = 1, 10, …, 50) equal a naive loop in
which each query ranks the gallery images only, on the embeddings the test stage stored; the
report names the protocol and keeps such a study out of an all-vs-all block.

The folder is written here file by file (noise JPEGs, ``list_eval_partition.txt``); the
expected numbers are computed from the stored float32 arrays, never from mlrc's metrics."""

from __future__ import annotations

import io
import math
import shutil
import sqlite3
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.protocol import retrieval_metrics
from mlrc.store.engine import session
from mlrc.store.schema import EmbeddingFile, TestResult

TINY = {"iterations_per_epoch": 3, "max_epochs": 2, "validate_every": {"default": 1}}

KS = (1, 10, 20, 30, 40, 50)  # In-Shop's Recall@K (mlrc.protocol.analysis.RECALL_KS)


def cli(*args: object):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def rows(url: str, model, **where) -> list:
    with session(store.connect(url)) as s:
        return list(s.execute(select(model).filter_by(**where)).scalars())


def inshop_folder(root: Path) -> Path:
    """16 training items × 3 images; 8 test items with 2 queries and 3 gallery images each; one
    gallery-only item (a distractor, as In-Shop's gallery has)."""
    rows = []
    for i in range(16):
        rows += [(f"img/train{i:02d}/{k}.jpg", f"id_{i:08d}", "train") for k in range(3)]
    for i in range(16, 24):
        rows += [(f"img/test{i:02d}/q{k}.jpg", f"id_{i:08d}", "query") for k in range(2)]
        rows += [(f"img/test{i:02d}/g{k}.jpg", f"id_{i:08d}", "gallery") for k in range(3)]
    rows += [(f"img/extra/g{k}.jpg", "id_00000099", "gallery") for k in range(2)]
    for path, *_ in rows:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(zlib.crc32(path.encode()))
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(root / path)
    lines = [str(len(rows)), "image_name item_id evaluation_status"] + [" ".join(r) for r in rows]
    (root / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return root


def naive_query_gallery(emb: np.ndarray, labels: np.ndarray, roles: np.ndarray) -> dict:
    """Each query ranks the gallery by the squared distance of unit float64 rows (ties to the
    lower gallery index); R = its class's gallery images; MAP@R, P@1, R-Prec, Recall@K."""
    e = emb.astype(np.float64)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    gallery = np.flatnonzero(roles == "gallery")
    out: dict[str, list[float]] = {}
    for q in np.flatnonzero(roles == "query"):
        d = ((e[gallery] - e[q]) ** 2).sum(axis=1)
        ranked = gallery[np.argsort(d, kind="stable")]
        rel = [labels[g] == labels[q] for g in ranked]
        R = sum(rel)
        ap = sum(rel[i] * sum(rel[: i + 1]) / (i + 1) for i in range(R)) / R
        out.setdefault("map_at_r", []).append(ap)
        out.setdefault("precision_at_1", []).append(float(rel[0]))
        out.setdefault("r_precision", []).append(sum(rel[:R]) / R)
        for k in KS:
            out.setdefault(f"recall_at_{k}", []).append(float(any(rel[:k])))
    return {k: float(np.mean(v)) for k, v in out.items()}


def naive_concatenation(separated: np.ndarray) -> np.ndarray:
    unit = [s / np.linalg.norm(s, axis=1, keepdims=True) for s in separated.astype(np.float64)]
    joined = np.concatenate(unit, axis=1)
    return joined / np.linalg.norm(joined, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def tested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inshop")
    doc = {
        "name": "shop",
        "dataset": {"name": "inshop", "root": str(inshop_folder(tmp / "inshop"))},
        "preset": "cpu",
        "loss": {"name": "contrastive", "params": {}, "search": {}},  # nothing to search
        "search": {"trials": 1},
        "test": {"reproductions": 2},
        "overrides": TINY,
        "artifacts": {"embeddings": "float32"},  # the arrays the metrics saw, bit for bit
    }
    path = tmp / "shop.yaml"
    path.write_text(yaml.safe_dump(doc))
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    cli("study", "test", path, "--storage", url, "--artifacts", art, "--quiet")
    return url, art


def test_inshop_is_tested_query_to_gallery_as_its_benchmark(tested):
    url, art = tested
    files = {f.reproduction: f for f in rows(url, EmbeddingFile)}
    assert sorted(files) == [1, 2] and {f.retrieval for f in files.values()} == {"query→gallery"}
    for rep, f in files.items():
        with np.load(art / "shop" / f.path) as z:
            sep, labels, roles = z["separated"], z["labels"], z["roles"]
        assert sorted(set(roles.tolist())) == ["gallery", "query"]
        assert (roles == "query").sum() == 16 and (roles == "gallery").sum() == 26
        results = {(r.mode, r.fold): r for r in rows(url, TestResult, reproduction=rep)}
        cases = [(("separated", k), sep[k]) for k in range(len(sep))]
        cases.append((("concatenated", -1), naive_concatenation(sep)))
        for key, emb in cases:
            want, got = naive_query_gallery(emb, labels, roles), results[key]
            for m in ("map_at_r", "precision_at_1", "r_precision"):
                assert math.isclose(getattr(got, m), want[m], abs_tol=1e-12), (key, m)
            for k in KS:
                assert math.isclose(got.extra[f"recall_at_{k}"], want[f"recall_at_{k}"]), key
        # scored all vs all, the same rows give another MAP@R: the protocol was applied
        joined = naive_concatenation(sep)
        other = retrieval_metrics(joined, labels)["map_at_r"]
        assert abs(results[("concatenated", -1)].map_at_r - other) > 1e-6


def test_the_report_names_the_protocol(tested):
    url, _ = tested
    table = pd.read_csv(io.StringIO(cli("report", "--storage", url, "--format", "csv").stdout))
    assert set(table["retrieval"]) == {"query→gallery"}  # the study and its baseline row
    md = cli("report", "--storage", url).stdout
    assert "Retrieval query→gallery (inshop): each query image ranks the gallery images" in md
    assert "Retrieval all vs all" not in md


def test_data_summary_counts_the_roles(tmp_path):
    root = inshop_folder(tmp_path / "inshop")
    out = cli("data", "summary", "inshop", "--root", root, "--preset", "cpu").stdout
    # 16 items × 3 train images; 8 × (2 query + 3 gallery) and a distractor's 2 gallery images
    assert "roles: 48 train, 16 query, 26 gallery images (tested query→gallery)" in out


def test_reproductions_tested_all_vs_all_are_not_mixed_with_query_to_gallery(tested, tmp_path):
    """A study whose reproduction 1 was tested before roles (no embedding file: all vs all)
    refuses to test more query→gallery, in one line, before any training."""
    url0, art = tested
    src = url0.removeprefix("sqlite:///")
    for suffix in ("", "-wal", "-shm"):  # the store is in WAL mode
        if Path(src + suffix).exists():
            shutil.copy(src + suffix, f"{tmp_path / 'db.sqlite'}{suffix}")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with sqlite3.connect(tmp_path / "db.sqlite") as c:
        c.execute("DELETE FROM mlrc_embedding_file WHERE reproduction = 1")
    path = next(Path(src).parent.glob("shop.yaml"))
    r = CliRunner().invoke(
        app, ["study", "test", str(path), "--storage", url, "--artifacts", str(art),
              "--reproductions", "3", "--quiet"],
    )  # fmt: skip
    assert r.exit_code != 0
    line = r.output.strip()
    assert len(line.splitlines()) == 1, line
    assert "reproductions 1 were tested all vs all" in line and "query→gallery" in line
    assert len(rows(url, TestResult, reproduction=3)) == 0
