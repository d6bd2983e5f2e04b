"""Marks follow each metric's direction (issue #37, finding 1): an error rate such as FNMR@FMR
is best when lowest — bold, †, the Welch comparison and the ranking-stability signs all read it
so. Expectations are computed here with numpy and scipy from the values put in."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mlrc.protocol.scoring import METRICS, higher_is_better, parse_metrics
from mlrc.report.formats import render
from mlrc.report.layout import table_blocks
from mlrc.report.stability import stability_lines
from mlrc.report.summary import summarize

FNMR = "fnmr_at_fmr_0.1"
SPREAD = np.array([-0.3, -0.1, 0.0, 0.1, 0.3])
# study: (MAP@R values, FNMR values) in %; a better model has a higher MAP@R and a lower FNMR
STUDIES = {
    "good": (60 + SPREAD, 10 + SPREAD),
    "close": (59.8 + 3 * SPREAD, 10.2 + 3 * SPREAD),  # not significantly worse on either
    "bad": (40 + SPREAD, 30 + SPREAD),  # significantly worse on both
}


def _values() -> pd.DataFrame:
    rows = []
    for study, (map_r, fnmr) in STUDIES.items():
        for mode in ("separated", "concatenated"):
            for metric, values in (("map_at_r", map_r), (FNMR, fnmr)):
                for rep, v in enumerate(values, 1):
                    rows.append(
                        {
                            "study": study,
                            "dataset": "glyphs",
                            "protocol": "p",
                            "loss": study,
                            "strategy": None,
                            "pruner": "none",
                            "reproduction": rep,
                            "mode": mode,
                            "metric": metric,
                            "value": float(v),
                            "fold_models": 2,
                            "embedding_size": 64,
                            # as `report --metrics` adds it: computed from stored embeddings
                            "after_the_fact": metric == FNMR,
                        }
                    )
    return pd.DataFrame(rows)


def test_the_direction_of_a_column_is_its_registered_metrics():
    for name in METRICS.available():
        info = METRICS.info(name)
        asked = f"{name}@0.1" if info.param == "fmr" else (f"{name}@5" if info.param else name)
        (metric,) = parse_metrics(asked)
        assert higher_is_better(metric.key) is info.higher_is_better, name
    assert higher_is_better(FNMR) is False and higher_is_better("fnmr_at_fmr_0.001") is False
    assert higher_is_better("map_at_r") and higher_is_better("recall_at_10")
    assert higher_is_better("nmi")  # no registered metric names it: higher-better


@pytest.fixture(scope="module")
def summary() -> pd.DataFrame:
    return summarize(_values())


@pytest.mark.parametrize("metric", ["map_at_r", FNMR])
def test_bold_and_dagger_follow_the_direction(summary, metric):
    col = summary[(summary["mode"] == "concatenated") & (summary["metric"] == metric)]
    col = col.set_index("study")
    means = {s: float(np.mean(v[0 if metric == "map_at_r" else 1])) for s, v in STUDIES.items()}
    best = (max if metric == "map_at_r" else min)(means, key=means.get)
    assert best == "good"
    assert col["best"].to_dict() == {s: s == best for s in STUDIES}
    for s, v in STUDIES.items():
        if s == best:
            continue
        i = 0 if metric == "map_at_r" else 1
        p = stats.ttest_ind(v[i], STUDIES[best][i], equal_var=False).pvalue
        assert col.at[s, "p_value"] == pytest.approx(p)
        assert bool(col.at[s, "not_worse"]) is bool(p >= 0.05)
    assert bool(col.at["close", "not_worse"]) and not bool(col.at["bad", "not_worse"])
    (block,) = table_blocks(summary)
    j = block.columns.index(("concatenated", metric))
    cells = {r.study: r.cells[j] for r in block.rows}
    assert cells["good"].bold and not cells["good"].dagger
    assert cells["close"].dagger and not cells["close"].bold
    assert not cells["bad"].dagger and not cells["bad"].bold


def test_stability_reads_an_error_rate_as_lower_is_better(summary):
    lines = [r for r in stability_lines(summary) if r["kind"] == "tau"]
    tau = next(
        r
        for r in lines
        if r["mode"] == "concatenated" and {r["metric"], r["other_metric"]} == {"map_at_r", FNMR}
    )
    # the two metrics rank the studies the same way once FNMR is read lower-is-better
    map_means = [np.mean(v[0]) for v in STUDIES.values()]
    fnmr_means = [-np.mean(v[1]) for v in STUDIES.values()]
    expected = stats.kendalltau(map_means, fnmr_means, variant="b").statistic
    assert tau["value"] == pytest.approx(expected) == pytest.approx(1.0)
    kept = {
        r["metric"]: r
        for r in stability_lines(summary)
        if r["kind"] == "best_kept" and r["mode"] == "concatenated"
    }
    assert kept[FNMR]["row"] == kept["map_at_r"]["row"] == "good"
    text = "\n".join(render(summary, "md").splitlines())
    assert "FNMR@FMR=0.1 1.00" in text  # the stability line names the column as the table does
    assert "Concat. FNMR@FMR=0.1*" in text


def test_sizes_come_from_the_studies(summary):
    (block,) = table_blocks(summary)
    assert block.mode_label("separated") == "Separated (64-D)"
    assert block.mode_label("concatenated") == "Concatenated (128-D)"
    for fmt in ("md", "latex", "html"):
        text = render(summary, fmt)
        assert "128-D" in text and "512-D" not in text and "four" not in text, fmt


def test_pairs_of_rows_stay_consistent():  # the data above is what the tests assume
    for (a, va), (b, vb) in itertools.combinations(STUDIES.items(), 2):
        assert (np.mean(va[0]) > np.mean(vb[0])) == (np.mean(va[1]) < np.mean(vb[1])), (a, b)


def test_a_query_gallery_report_compiles_with_pdflatex(summary, tmp_path):
    """#37, finding 4: the query→gallery legend names ρ and π (and the arrow); the standalone
    LaTeX document must compile with pdflatex, as users paste it."""
    import shutil
    import subprocess

    from conftest import require

    from mlrc.report.latex import latex_text

    qg = summary.assign(retrieval="query→gallery")
    tex = render(qg, "latex", standalone=True)
    assert "ρ" not in tex and "π" not in tex and "→" not in tex
    assert r"$\rho$" in tex and r"$\pi$" in tex and r"$\rightarrow$" in tex
    # every character beyond Latin-1 becomes LaTeX, whatever a study name holds
    assert (
        latex_text("Σ ς ά ✓ 4×128 ≤")
        == r"$\Sigma$ $\sigma$ $\alpha$ [check mark] 4$\times$128 $\leq$"
    )
    require(shutil.which("pdflatex") is not None, "pdflatex (texlive) is not installed")
    (tmp_path / "t.tex").write_text(tex, encoding="utf-8")
    r = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]


def test_metrics_the_test_stage_stored_are_reused_not_recomputed(capsys):
    """#37, finding 6: `report --metrics recall_at_k@1` showed R@1* from float16 embeddings
    beside the stored P@1 (the same metric); asking for a stored column recomputed it and
    named it in "computed from stored embeddings". Those are the stored values, said once."""
    from mlrc.cli.report import metric_keys

    assert metric_keys("recall_at_k@1,mrr,map_at_r,recall_at_k@2") == {
        "mrr": "mrr",
        "recall_at_2": "recall_at_k@2",
    }
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "note: --metrics recall_at_k@1: Recall@1 is P@1 (a query's nearest item relevant or "
        "not), which the test stage stored: shown as P@1, not computed again",
        "note: --metrics map_at_r: a column of every table, which the test stage stored: shown "
        "as MAP@R, not computed again",
    ]
