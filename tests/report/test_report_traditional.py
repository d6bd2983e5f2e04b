"""`mlrc report` with traditional studies (epoch chosen on the test classes: a leakage, §).

The store, filled through the store's own functions, holds on ``cub200`` two traditional studies
(``cub-trad-ms``, the better one in every column, and ``cub-trad-contrastive`` with a later epoch,
which must never be bold) and one reality-check study (``cub-ord``), with a pretrained baseline
linked to ``cub-trad-contrastive``; on ``sop`` one traditional study (its K are 1, 10, 100, 1000).
Every number is recomputed here from the seeded values with scipy.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from conftest import require
from scipy import stats
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.report.dashboard import Dashboard
from mlrc.report.tables import SECTION, TRADITIONAL_NOTE, TRADITIONAL_TITLE
from mlrc.store.engine import session
from mlrc.store.results import link_baseline, record_baseline, record_reproduction
from mlrc.store.schema import Study

runner = CliRunner()
TRADITIONAL = {"preset": {"split_scheme": "traditional", "folds": 1, "max_epochs": 30}}
ORDINARY = {"preset": {"split_scheme": "mlrc", "folds": 4, "max_epochs": 30}}
KS = {"cub200": (1, 2, 4, 8), "sop": (1, 10, 100, 1000)}
# name: dataset, loss, config, per reproduction (map_at_r, recall_at_1, best_epoch)
STUDIES = {
    "cub-trad-contrastive": (
        "cub200",
        "contrastive",
        TRADITIONAL,
        [(0.25, 0.60, 20), (0.26, 0.61, 25), (0.24, 0.59, 24)],
    ),
    "cub-trad-ms": (
        "cub200",
        "multi_similarity",
        TRADITIONAL,
        [(0.30, 0.66, 12), (0.31, 0.67, 15), (0.305, 0.665, 11)],
    ),
    "cub-ord": ("cub200", "contrastive", ORDINARY, [(0.22, 0.55, 9), (0.23, 0.56, 10)]),
    "sop-trad": ("sop", "contrastive", TRADITIONAL, [(0.45, 0.78, 40), (0.46, 0.79, 44)]),
}
BASELINE = {"map_at_r": 0.1, "precision_at_1": 0.4, "r_precision": 0.15, "recall_at_1": 0.4}


def recall(r1: float, k: int) -> float:
    """The seeded Recall@k (a fraction): Recall@1 rising with k, below 1."""
    return min(0.999, r1 + 0.02 * np.log2(k) + 0.001 * (k > 8))


def metrics(dataset: str, values: tuple[float, float, int]) -> dict[str, float]:
    """One reproduction's stored metrics (fractions; best_epoch in epochs)."""
    map_r, r1, epoch = values
    return {
        "map_at_r": map_r,
        "precision_at_1": r1,
        "r_precision": map_r + 0.1,
        **{f"recall_at_{k}": recall(r1, k) for k in sorted({*KS[dataset], 1, 2, 4, 8})},
        "best_epoch": epoch,
        "nmi": 0.5,
    }


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('trad-report') / 'store.db'}"
    engine = store.connect(url)
    ids = {}
    with session(engine) as s:
        for name, (dataset, loss, config, _) in STUDIES.items():
            st = Study(
                name=name,
                dataset=dataset,
                loss=loss,
                strategy=None,
                preset="traditional" if config is TRADITIONAL else "cpu",
                config=config,
                code_version="test",
            )
            s.add(st)
            s.flush()
            ids[name] = st.id
    for name, (dataset, _, config, reps) in STUDIES.items():
        for rep, values in enumerate(reps, start=1):
            m = metrics(dataset, values)
            if config is TRADITIONAL:  # one model: the three rows of the test stage, equal
                rows = [("separated", 0, m), ("separated", -1, m), ("concatenated", -1, m)]
            else:
                sep = {**m, "map_at_r": m["map_at_r"] - 0.05}
                rows = [("separated", -1, sep), ("concatenated", -1, m)]
            record_reproduction(engine, ids[name], rep, {}, rows)
    record_baseline(
        engine,
        "kb",
        BASELINE,
        dataset="cub200",
        kind="pretrained",
        label="Pretrained (bninception)",
        trunk="bninception",
        config={},
        device="cpu",
        code_version="test",
    )
    link_baseline(engine, ids["cub-trad-contrastive"], "kb")
    return url


def cli(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def report(url: str, fmt: str = "md", *args: str) -> str:
    return cli("report", "--storage", url, "--format", fmt, *args)


def ci(values: list[float]) -> tuple[float, float]:
    """Mean and 95% Student-t half-width."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def text(values: list[float]) -> str:
    mean, hw = ci(values)
    return f"{mean:.2f} ± {hw:.2f}"


def expected_cells(name: str) -> list[str]:
    """The traditional row's cells: Recall@K and MAP@R in %, then the epoch."""
    dataset, _, _, reps = STUDIES[name]
    cells = [text([100 * recall(r1, k) for _, r1, _ in reps]) for k in KS[dataset]]
    cells.append(text([100 * m for m, _, _ in reps]))
    cells.append(text([e for _, _, e in reps]))
    return cells


def md_row(md: str, label: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_markdown_blocks_columns_values_and_marks(url):
    md = report(url)
    assert f"### cub200 — {TRADITIONAL_TITLE} (%, Epoch in epochs," in md
    assert f"### sop — {TRADITIONAL_TITLE} (%, Epoch in epochs," in md
    assert "| Loss | n | R@1 | R@2 | R@4 | R@8 | MAP@R | Epoch |" in md
    assert "| Loss | n | R@1 | R@10 | R@100 | R@1000 | MAP@R | Epoch |" in md
    assert TRADITIONAL_NOTE in md
    # the better traditional study: bold everywhere but the epoch, underlined (best MAP@R)
    ms = md_row(md, f"<ins>multi_similarity {SECTION}</ins>")
    want = expected_cells("cub-trad-ms")
    assert ms[1] == "3"
    assert ms[2:-1] == [f"**{c}**" for c in want[:-1]] and ms[-1] == want[-1]
    # the other: far worse (no †), its later epoch is not bold
    con = md_row(md, f"contrastive {SECTION}")
    assert con[2:] == expected_cells("cub-trad-contrastive")
    # the baseline row of the traditional block: Recall@1 and MAP@R, nothing else stored
    base = md_row(md, "Pretrained (bninception)")
    assert base[1:] == ["1", "40.00", "–", "–", "–", "10.00", "–"]
    # SOP's K; a single study in its block: no marks
    sop = md_row(md.split("### sop")[1], f"contrastive {SECTION}")
    assert sop[1:] == ["2", *expected_cells("sop-trad")]


def test_the_ordinary_block_is_as_without_the_traditional_studies(url):
    md = report(url)
    alone = report(url, "md", "--study", "cub-ord")
    block = alone.split("\n\n")[0:2]  # its heading and its table
    assert "\n\n".join(block) in md
    assert "### cub200 (%, mean ± 95% CI half-width over n reproductions)" in md
    assert "protocol" not in md.split("\n\n")[0]  # no protocol header from the traditional
    row = md_row(md, "contrastive")
    assert row[1] == "2" and SECTION not in row[0]
    csv = pd.read_csv(io.StringIO(report(url, "csv")))
    only = pd.read_csv(io.StringIO(report(url, "csv", "--study", "cub-ord")))
    assert not only["test_set_selection"].any()  # the column is always there
    mine = csv[csv["study"] == "cub-ord"].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, only, check_dtype=False)


def test_csv_flags_and_values(url):
    csv = pd.read_csv(io.StringIO(report(url, "csv")))
    flags = csv[~csv["study"].str.startswith("Pretrained")].groupby("study")["test_set_selection"]
    assert flags.unique().to_dict() == {
        "cub-ord": [False],
        "cub-trad-contrastive": [True],
        "cub-trad-ms": [True],
        "sop-trad": [True],
    }
    sop = csv[csv["study"] == "sop-trad"].set_index("metric")
    assert list(sop.index) == [f"recall_at_{k}" for k in KS["sop"]] + ["map_at_r", "best_epoch"]
    assert (sop["mode"] == "concatenated").all()
    reps = STUDIES["sop-trad"][3]
    for k in KS["sop"]:
        mean, hw = ci([100 * recall(r1, k) for _, r1, _ in reps])
        assert sop.loc[f"recall_at_{k}", "mean"] == pytest.approx(mean)
        assert sop.loc[f"recall_at_{k}", "half_width"] == pytest.approx(hw)
    mean, hw = ci([e for _, _, e in reps])  # in epochs, not in percent
    assert sop.loc["best_epoch", ["mean", "half_width"]].tolist() == pytest.approx([mean, hw])
    epochs = csv[csv["metric"] == "best_epoch"]
    assert not epochs["best"].any() and epochs["p_value"].isna().all()


def test_latex_escapes_the_mark_and_compiles(url, tmp_path):
    tex = report(url, "latex")
    assert SECTION not in tex and r"multi\_similarity \S{}" in tex
    assert r"\textit{cub200} --- traditional protocol: epoch chosen on the test set" in tex
    assert r" & & R@1 & R@2 & R@4 & R@8 & MAP@R & Epoch \\" in tex
    assert r"\S{} traditional protocol (the seed papers' own tables)" in tex
    require(shutil.which("pdflatex") is not None, "pdflatex (texlive) is not installed")
    (tmp_path / "t.tex").write_text(report(url, "latex", "--standalone"), encoding="utf-8")
    r = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-3000:]


def test_html_and_json_carry_the_mark_and_the_note(url):
    page = report(url, "html")
    assert f"<h3>cub200 — {TRADITIONAL_TITLE}</h3>" in page
    assert 'data-test-set-selection="true"' in page
    assert f"multi_similarity {SECTION}</u>" in page and "<th>R@1000</th>" in page
    assert TRADITIONAL_NOTE.replace("'", "&#x27;") in page
    doc = json.loads(report(url, "json"))
    assert TRADITIONAL_NOTE in doc["legend"]
    trad = [b for b in doc["blocks"] if b.get("test_set_selection")]
    assert [b["dataset"] for b in trad] == ["cub200", "sop"]
    ms = next(r for r in trad[0]["rows"] if r["study"] == "cub-trad-ms")
    assert ms["label"] == f"multi_similarity {SECTION}" and ms["underline"]
    assert ms["cells"]["concatenated/best_epoch"] == {
        "text": expected_cells("cub-trad-ms")[-1],
        "bold": False,
        "not_worse_mark": False,
    }
    lines = pd.DataFrame(doc["lines"])
    assert set(lines.loc[lines["study"] == "cub-ord", "test_set_selection"]) == {False}


def test_dashboard_marks_the_traditional_studies(url):
    page = Dashboard(url).page(plotly_js="cdn")
    assert f"multi_similarity {SECTION}" in page  # the figure's labels and the table
    assert f"<b>{SECTION} {TRADITIONAL_TITLE}</b>" in page  # the study's facts
    assert TRADITIONAL_NOTE.replace("'", "&#x27;") in page


def test_a_report_of_traditional_studies_only_explains_one_model(url):
    md = report(url, "md", "--study", "cub-trad-ms", "--study", "sop-trad")
    assert "one model each" in md and "highest MAP@R" in md
    assert "separated: mean of" not in md  # no reality-check block to explain
    both = report(url, "md")
    assert "separated: mean of" in both and "one model each" not in both
