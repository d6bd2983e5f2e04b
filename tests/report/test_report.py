"""`mlrc report`: tables from a store filled by hand, every number recomputed here with scipy.

The store holds two campaigns. In ``grid``, dataset ``cub`` has three studies: ``contrastive``
(the best row: highest concatenated MAP@R), ``contrastive + metrix`` (0.2 points below it, well
within the noise: not significantly worse, p > 0.05) and ``triplet`` (20 points below: p < 0.05).
In the separated P@1 column ``contrastive + metrix`` is the best instead, so the bold cells are
not all on one row. Dataset ``cars_196`` has ``multi_similarity`` (5 reproductions) and
``ntxent`` (a single reproduction: no interval, no p-value, no mark). Campaign ``other`` holds
one study that would beat everything, so it must stay out of ``--campaign grid``.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from conftest import require
from scipy import stats
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.report.tables import collect, summarize
from mlrc.store.engine import session
from mlrc.store.schema import CampaignStudy, Study, TestResult

runner = CliRunner()
MODES = ("separated", "concatenated")
METRICS = ("map_at_r", "precision_at_1", "r_precision")
COLUMNS = [(mode, m) for mode in MODES for m in METRICS]
REPS = 5

# name: dataset, loss, strategy, reproductions, base value per column (fractions)
STUDIES = {
    "cub-contrastive": ("cub", "contrastive", None, REPS, {"sep": 0.55, "cat": 0.60, "p1": 0.50}),
    "cub-contrastive-metrix": (
        "cub",
        "contrastive",
        "metrix",
        REPS,
        {"sep": 0.548, "cat": 0.598, "p1": 0.60},
    ),
    "cub-triplet": ("cub", "triplet", None, REPS, {"sep": 0.35, "cat": 0.40, "p1": 0.30}),
    "cars-ms": ("cars_196", "multi_similarity", None, REPS, {"sep": 0.3, "cat": 0.35, "p1": 0.4}),
    "cars-ntxent": ("cars_196", "ntxent", None, 1, {"sep": 0.2, "cat": 0.25, "p1": 0.3}),
    "cub-arcface": ("cub", "arcface", None, REPS, {"sep": 0.9, "cat": 0.95, "p1": 0.9}),
}
# campaign: studies in campaign-file order (deliberately not alphabetical)
CAMPAIGNS = {
    "grid": ["cub-triplet", "cub-contrastive-metrix", "cub-contrastive", "cars-ms", "cars-ntxent"],
    "other": ["cub-arcface"],
}


def _values() -> dict[str, dict[tuple[str, str], np.ndarray]]:
    """Per study and column: the per-reproduction values in percent (what the store holds)."""
    rng = np.random.default_rng(7)
    out = {}
    for k, (name, (_, _, _, n, base)) in enumerate(STUDIES.items()):
        out[name] = {}
        for mode, metric in COLUMNS:
            if mode == "separated" and metric == "precision_at_1":
                b = base["p1"]
            else:
                b = base["sep" if mode == "separated" else "cat"] + (metric != "map_at_r") * 0.05
            # zero-mean spread (0.4 to 0.9 points), shuffled: the mean is the base value
            spread = (0.004 + 0.001 * k) * rng.permutation([-2.0, -1.0, 0.0, 1.0, 2.0])[:n]
            out[name][(mode, metric)] = b + spread
    return out


VALUES = _values()


def _pct(name: str, col: tuple[str, str]) -> np.ndarray:
    return 100.0 * VALUES[name][col]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'store.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        ids = {}
        for name, (dataset, loss, strategy, n, _) in STUDIES.items():
            st = Study(
                name=name,
                dataset=dataset,
                loss=loss,
                strategy=strategy,
                preset="cpu",
                config={},
                code_version="test",
            )
            s.add(st)
            s.flush()
            ids[name] = st.id
            for rep in range(1, n + 1):
                for mode in MODES:
                    v = {m: float(VALUES[name][(mode, m)][rep - 1]) for m in METRICS}
                    s.add(
                        TestResult(
                            study_id=st.id, reproduction=rep, mode=mode, fold=-1, params={}, **v
                        )
                    )
                    # a per-fold row the table must ignore (only fold −1 is the aggregate)
                    s.add(
                        TestResult(
                            study_id=st.id,
                            reproduction=rep,
                            mode=mode,
                            fold=0,
                            params={},
                            **{m: 0.999 for m in METRICS},
                        )
                    )
        for campaign, members in CAMPAIGNS.items():
            for position, name in enumerate(members):
                s.add(
                    CampaignStudy(
                        campaign=campaign,
                        study_id=ids[name],
                        position=position,
                        campaign_config={"name": campaign},
                    )
                )
    return url


def cli(*args: str, ok: bool = True):
    r = runner.invoke(app, list(args))
    if ok:
        assert r.exit_code == 0, r.output
    return r


def expected(names: list[str]) -> dict[tuple[str, str, str], dict]:
    """Independent recomputation: per (study, mode, metric) mean, interval, best, p, not_worse."""
    out = {}
    for dataset in {STUDIES[n][0] for n in names}:
        rows = [n for n in names if STUDIES[n][0] == dataset]
        for col in COLUMNS:
            means = {n: _pct(n, col).mean() for n in rows}
            top = max(means.values())
            ref = next(n for n in rows if means[n] == top)
            for n in rows:
                v = _pct(n, col)
                e = {"mean": v.mean(), "n": len(v), "best": means[n] == top}
                if len(v) >= 2:
                    e["low"], e["high"] = stats.t.interval(
                        0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v)
                    )
                if n == ref or len(v) < 2 or len(_pct(ref, col)) < 2:
                    e["p"] = math.nan
                else:
                    e["p"] = stats.ttest_ind(v, _pct(ref, col), equal_var=False).pvalue
                e["ref"] = n == ref
                out[(n, *col)] = e
    return out


def test_the_data_is_built_as_described():
    """The construction the other tests rely on: close row p > 0.05, far row p < 0.05."""
    col = ("concatenated", "map_at_r")
    best = _pct("cub-contrastive", col)
    close = stats.ttest_ind(_pct("cub-contrastive-metrix", col), best, equal_var=False).pvalue
    far = stats.ttest_ind(_pct("cub-triplet", col), best, equal_var=False).pvalue
    assert close > 0.05 and far < 1e-6
    assert best.mean() > _pct("cub-contrastive-metrix", col).mean()
    p1 = ("separated", "precision_at_1")
    assert _pct("cub-contrastive-metrix", p1).mean() > _pct("cub-contrastive", p1).mean()


def test_summary_means_intervals_and_welch_p_against_scipy(url):
    names = CAMPAIGNS["grid"]
    summary = summarize(collect(store.connect(url), campaigns=["grid"]))
    assert len(summary) == len(names) * 6
    want = expected(names)
    for _, r in summary.iterrows():
        e = want[(r["study"], r["mode"], r["metric"])]
        assert r["mean"] == pytest.approx(e["mean"], abs=1e-9)
        assert r["n"] == e["n"]
        assert bool(r["best"]) == e["best"]
        if e["n"] >= 2:
            assert r["low"] == pytest.approx(e["low"], abs=1e-9)
            assert r["high"] == pytest.approx(e["high"], abs=1e-9)
            assert r["half_width"] == pytest.approx((e["high"] - e["low"]) / 2, abs=1e-9)
        else:
            assert math.isnan(r["half_width"]) and math.isnan(r["low"])
        if math.isnan(e["p"]):
            assert math.isnan(r["p_value"])
            assert r["not_worse"] is True if e["ref"] else pd.isna(r["not_worse"])
        else:
            assert r["p_value"] == pytest.approx(e["p"], rel=1e-9)
            assert bool(r["not_worse"]) == (e["p"] >= 0.05)
    best_rows = set(summary.loc[summary["best_row"], "study"])
    assert best_rows == {"cub-contrastive", "cars-ms"}
    strategies = summary.drop_duplicates("study").set_index("study")["strategy"]
    assert strategies["cub-contrastive-metrix"] == "metrix"
    assert pd.isna(strategies["cub-contrastive"])


def test_csv_is_tidy_with_strategy_p_value_and_not_worse(url):
    table = pd.read_csv(io.StringIO(cli("report", "--storage", url, "--format", "csv").stdout))
    assert list(table.columns) == [
        "study",
        "dataset",
        "protocol",
        "protocol_fields",
        "loss",
        "strategy",
        "pruner",
        "mode",
        "metric",
        "mean",
        "half_width",
        "n",
        "low",
        "high",
        "best",
        "best_row",
        "p_value",
        "not_worse",
        "complete_trials",
        "nonfinite_trials",
        "test_set_selection",
        "retrieval",
        "failed_trials",
        "failures",
        "archived",
        "untrained_test",
        "warm_start",
        "pruning_risk",
        "fold_models",
        "embedding_size",
    ]
    # studies stored by hand without a resolved preset: sizes not recorded, left empty
    assert table["fold_models"].isna().all() and table["embedding_size"].isna().all()
    assert not table["test_set_selection"].any()  # no traditional study in this store
    assert (table["retrieval"] == "all vs all").all()  # no dataset with query/gallery roles
    assert len(table) == len(STUDIES) * 6  # every study in the store, one line per cell
    assert not table.duplicated(["study", "mode", "metric"]).any()
    metrix = table[table["study"] == "cub-contrastive-metrix"]
    assert (metrix["strategy"] == "metrix").all() and (metrix["loss"] == "contrastive").all()
    # without the campaign, cub-arcface is in the cub block and is the best everywhere there
    cub = table[table["dataset"] == "cub"]
    assert set(cub.loc[cub["best"], "study"]) == {"cub-arcface"}
    want = expected(list(STUDIES))
    for _, r in table.iterrows():
        e = want[(r["study"], r["mode"], r["metric"])]
        assert r["mean"] == pytest.approx(e["mean"], abs=1e-4)
        if not math.isnan(e["p"]):
            assert r["p_value"] == pytest.approx(e["p"], rel=1e-3, abs=1e-4)


def test_campaign_selects_exactly_its_studies_in_campaign_order(url):
    def studies(*args: str) -> list[str]:
        out = cli("report", "--storage", url, "--format", "csv", *args).stdout
        return list(dict.fromkeys(pd.read_csv(io.StringIO(out))["study"]))

    assert studies("--campaign", "grid") == CAMPAIGNS["grid"]
    # --study alone: by name within each dataset, datasets by name
    assert studies("--study", "cub-triplet", "--study", "cub-contrastive") == [
        "cub-contrastive",
        "cub-triplet",
    ]
    # both: the campaign's studies first, then the extra ones
    assert studies("--campaign", "other", "--study", "cub-triplet") == [
        "cub-arcface",
        "cub-triplet",
    ]
    md = cli("report", "--storage", url, "--campaign", "grid").stdout
    labels = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ")]
    labels = [lab.replace("<ins>", "").replace("</ins>", "") for lab in labels if lab != "Loss"]
    assert labels == [
        "triplet",
        "contrastive + metrix",
        "contrastive",
        "multi_similarity",
        "ntxent",
    ]
    assert md.index("### cub") < md.index("### cars_196")  # campaign order, not name order


def test_unknown_campaign_or_study_is_one_line_and_exit_2(url):
    r = cli("report", "--storage", url, "--campaign", "nope", ok=False)
    assert r.exit_code == 2
    assert r.stderr.strip().count("\n") == 0
    assert "unknown campaign 'nope'" in r.stderr and "grid" in r.stderr
    r = cli("report", "--storage", url, "--study", "missing", ok=False)
    assert r.exit_code == 2 and "unknown study 'missing'" in r.stderr
    assert cli("report", "--storage", url, "--format", "xls", ok=False).exit_code == 2
    r = cli("report", "--storage", url, "--format", "md", "--standalone", ok=False)
    assert r.exit_code == 2


def _marks(names: list[str]) -> tuple[dict, dict, set]:
    """Expected bold cells, dagger cells (study -> set of columns) and underlined studies."""
    want = expected(names)
    bold = {n: {c for c in COLUMNS if want[(n, *c)]["best"]} for n in names}
    dagger = {
        n: {c for c in COLUMNS if not math.isnan(want[(n, *c)]["p"]) and want[(n, *c)]["p"] >= 0.05}
        for n in names
    }
    return bold, dagger, {"cub-contrastive", "cars-ms"}


GRID_LABELS = {
    "triplet": "cub-triplet",
    "contrastive + metrix": "cub-contrastive-metrix",
    "contrastive": "cub-contrastive",
    "multi_similarity": "cars-ms",
    "ntxent": "cars-ntxent",
}


def test_markdown_bold_underline_and_dagger_on_the_right_cells(url):
    md = cli("report", "--storage", url, "--campaign", "grid").stdout
    bold, dagger, underlined = _marks(CAMPAIGNS["grid"])
    # the construction: bold on two different rows in cub, daggers only on contrastive + metrix
    assert ("separated", "precision_at_1") in bold["cub-contrastive-metrix"]
    assert ("concatenated", "map_at_r") in bold["cub-contrastive"]
    assert ("concatenated", "map_at_r") in dagger["cub-contrastive-metrix"]
    assert not dagger["cub-triplet"] and not dagger["cars-ntxent"]
    seen = set()
    for line in md.splitlines():
        if not line.startswith("| ") or line.startswith("| Loss"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        label = cells[0]
        is_underlined = label.startswith("<ins>")
        study = GRID_LABELS[label.removeprefix("<ins>").removesuffix("</ins>")]
        seen.add(study)
        assert is_underlined == (study in underlined), line
        assert cells[1] == str(STUDIES[study][3])
        for col, cell in zip(COLUMNS, cells[2:], strict=True):
            assert cell.startswith("**") == (col in bold[study]), (study, col, cell)
            assert cell.endswith("†") == (col in dagger[study]), (study, col, cell)
            v = _pct(study, col)
            text = f"{v.mean():.2f}"
            if len(v) >= 2:
                text += f" ± {stats.sem(v) * stats.t.ppf(0.975, len(v) - 1):.2f}"
            assert cell.replace("*", "").removesuffix(" †") == text
    assert seen == set(CAMPAIGNS["grid"])
    assert "±" in md and "95%" in md and "† not significantly worse" in md and "Welch" in md


def test_single_row_block_has_no_marks(url):
    md = cli("report", "--storage", url, "--study", "cub-triplet").stdout
    assert "| triplet | 5 |" in md and "**" not in md.split("\n\n")[1] and "<ins>" not in md


class _Tables(HTMLParser):
    """Rows of every <table>: per cell its text and whether it holds <strong>, <u>, <sup>."""

    def __init__(self) -> None:
        super().__init__()
        self.rows, self.cell, self.tags = [], None, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = {"text": "", "strong": False, "u": False, "sup": False, "th": tag == "th"}
        elif tag in ("strong", "u", "sup") and self.cell is not None:
            self.cell[tag] = True

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell["text"] += data


def test_html_is_a_standalone_page_with_strong_u_and_daggers(url, tmp_path):
    out = tmp_path / "t.html"
    cli("report", "--storage", url, "--campaign", "grid", "--format", "html", "--out", str(out))
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "http" not in page and "<link" not in page and "<script" not in page
    parser = _Tables()
    parser.feed(page)
    assert parser.tags.count("table") == 2
    bold, dagger, underlined = _marks(CAMPAIGNS["grid"])
    body = [r for r in parser.rows if r and not r[0]["th"]]
    assert len(body) == len(CAMPAIGNS["grid"])
    for row in body:
        study = GRID_LABELS[row[0]["text"]]
        assert row[0]["u"] == (study in underlined)
        for col, cell in zip(COLUMNS, row[2:], strict=True):
            assert cell["strong"] == (col in bold[study]), (study, col)
            assert cell["sup"] == (col in dagger[study]), (study, col)
    assert "<strong>" in page and "<u>" in page
    assert "± is" in page or "mean ± half-width" in page
    assert "not significantly worse" in page


def test_latex_booktabs_marks_and_escapes(url, tmp_path):
    tex = cli("report", "--storage", url, "--campaign", "grid", "--format", "latex").stdout
    for s in (r"\toprule", r"\midrule", r"\bottomrule", r"$\pm$", r"\textbf{", r"\underline{"):
        assert s in tex
    assert r"\underline{contrastive} &" in tex and r"\textit{cars\_196}" in tex
    assert r"multi\_similarity" in tex and r"$^{\dagger}$" in tex
    assert r"\documentclass" not in tex  # a fragment unless --standalone
    triplet = next(line for line in tex.splitlines() if line.startswith("triplet &"))
    assert r"\textbf" not in triplet and r"\dagger" not in triplet


def _compile(tex: str, tmp_path) -> None:
    require(shutil.which("pdflatex") is not None, "pdflatex (texlive) is not installed")
    (tmp_path / "t.tex").write_text(tex, encoding="utf-8")
    r = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert (tmp_path / "t.pdf").stat().st_size > 1000


def test_standalone_latex_compiles_with_pdflatex(url, tmp_path):
    out = tmp_path / "t.tex"
    cli(
        "report",
        "--storage",
        url,
        "--campaign",
        "grid",
        "--format",
        "latex",
        "--standalone",
        "--out",
        str(out),
    )
    tex = out.read_text(encoding="utf-8")
    assert tex.startswith(r"\documentclass") and r"\usepackage{booktabs}" in tex
    _compile(tex, tmp_path)


def test_special_characters_are_escaped_and_still_compile(tmp_path):
    """Also: a study searched with pruning is marked ‡ in every format, with the note."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        for i, (loss, strategy) in enumerate([("a_b&c%d#e", "x$y{z}~^\\"), ("plain", None)]):
            st = Study(
                name=f"s{i}",
                dataset="set_1 & 50% #2",
                loss=loss,
                strategy=strategy,
                preset="cpu",
                config={"pruner": "median"} if loss == "plain" else {},
                code_version="test",
            )
            s.add(st)
            s.flush()
            for rep in (1, 2, 3):
                for mode in MODES:
                    s.add(
                        TestResult(
                            study_id=st.id,
                            reproduction=rep,
                            mode=mode,
                            fold=-1,
                            params={},
                            **{m: 0.5 + 0.01 * rep + 0.1 * i for m in METRICS},
                        )
                    )
    tex = cli("report", "--storage", url, "--format", "latex", "--standalone").stdout
    assert r"a\_b\&c\%d\#e + x\$y\{z\}\textasciitilde{}\textasciicircum{}\textbackslash{}" in tex
    assert r"set\_1 \& 50\% \#2" in tex
    assert (
        r"\underline{plain $^{\ddagger}$}" in tex and r"$^{\ddagger}$ searched with opt-in" in tex
    )
    _compile(tex, tmp_path)
    md = cli("report", "--storage", url, "--format", "md").stdout
    assert "| <ins>plain ‡</ins> |" in md and "‡ searched with opt-in pruning" in md
    # the pruned row, the note and the study's rules line, not the unpruned row
    assert md.count("‡") == 3 and "‡ s1: median(startup=5)" in md
    csv = pd.read_csv(io.StringIO(cli("report", "--storage", url, "--format", "csv").stdout))
    assert set(zip(csv["study"], csv["pruner"], strict=True)) == {
        ("s0", "none"),
        ("s1", "median(startup=5)"),
    }
    page = cli("report", "--storage", url, "--format", "html").stdout
    assert "a_b&amp;c%d#e + x$y{z}~^\\" in page and "set_1 &amp; 50% #2" in page
