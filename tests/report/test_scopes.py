"""`mlrc report` with protocol groups, baseline rows and trials scored 0, on a store filled by
hand; every mark is recomputed here (scipy's Welch test) within the blocks defined here.

Dataset ``cub`` holds two protocols (the cpu preset with ``max_epochs`` 1 and 2):

* protocol E1: ``e1-contrastive`` (the block's best), ``e1-triplet`` (far below: p < 0.05) and
  ``e1-ms`` (search budget 8 trials instead of 4: same protocol, a note, no block of its own);
* protocol E2: ``e2-arcface``, better than every E1 row in every column — it must not take the
  bold from E1's best — and ``e2-ntxent``.

Every cub study shares the pretrained baseline ``kcub``, whose P@1 (99 %) beats every study: it
must stay unmarked. Dataset ``cars_196`` has one protocol, the random-init baseline ``kcars`` and
``cars-x``, 2 of whose 5 complete trials were scored 0 for a non-finite loss."""

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

from mlrc import store
from mlrc.report.tables import (
    COMPARISON_EXCLUDED,
    collect,
    comparison_key,
    comparison_scope,
    render,
    scope_differences,
    summarize,
)
from mlrc.store.engine import session
from mlrc.store.schema import Baseline, Study, StudyBaseline, TestResult, Trial

MODES = ("separated", "concatenated")
METRICS = ("map_at_r", "precision_at_1", "r_precision")
COLUMNS = [(mode, m) for mode in MODES for m in METRICS]
REPS = 5


def fingerprint(name: str, loss: str, max_epochs: int, trials: int = 4, **extra) -> dict:
    """A config shaped like ``ResolvedStudy.fingerprint()`` (cpu preset, overrides merged)."""
    return {
        "study": {
            "name": name,
            "dataset": {"name": "cub", "root": None, "params": {}},
            "preset": "cpu",
            "loss": {"name": loss, "params": {}, "search": None},
            "miner": None,
            "strategy": None,
            "sampler": {"name": "m_per_class", "params": {}},
            "search": {"trials": trials, "sampler": None, "seed": 0, "enqueue": []},
            "test": {"reproductions": None},
            "overrides": {"max_epochs": max_epochs},
        },
        "preset": {
            "trunk": "tiny_cnn",
            "pretrained": False,
            "image": {"resize": 36, "crop": 32},
            "loss_optimizer": {"lr": {"low": 1e-5, "high": 0.1, "log": True}},
            "max_epochs": max_epochs,
            "patience": {"default": 3},
            "search": {"trials": 4, "sampler": "gp", "seed": 0, "enqueue": []},
            "test": {"reproductions": 3},
        },
        "space": {f"{loss}_margin": {"low": 0.0, "high": 1.0}},
        "fixed": {},
        "trials": trials,
        "sampler": "gp",
        "reproductions": REPS,
        **extra,
    }


# name: dataset, loss, block, config, base per column (fractions)
STUDIES = {
    "e1-contrastive": (
        "cub",
        "contrastive",
        "E1",
        fingerprint("e1-contrastive", "contrastive", 1),
        0.50,
    ),
    "e1-triplet": ("cub", "triplet", "E1", fingerprint("e1-triplet", "triplet", 1), 0.30),
    "e1-ms": ("cub", "multi_similarity", "E1", fingerprint("e1-ms", "ms", 1, trials=8), 0.497),
    "e2-arcface": ("cub", "arcface", "E2", fingerprint("e2-arcface", "arcface", 2), 0.80),
    "e2-ntxent": ("cub", "ntxent", "E2", fingerprint("e2-ntxent", "ntxent", 2), 0.60),
    "cars-x": ("cars_196", "contrastive", "C", {"trials": 5}, 0.40),
    "cars-y": ("cars_196", "triplet", "C", {"trials": 5}, 0.35),
}
BASELINES = {  # key: kind, label, dataset, value per metric (fractions)
    "kcub": ("pretrained", "Pretrained (bninception)", "cub", (0.20, 0.99, 0.15)),
    "kcars": ("random_init", "Random init (tiny_cnn)", "cars_196", (0.05, 0.08, 0.04)),
}
LINKS = {n: ("kcub" if STUDIES[n][0] == "cub" else "kcars") for n in STUDIES}
NONFINITE_REASONS = ["non-finite embeddings in fold 1", "fold 2: non-finite loss at iteration 12"]


def _values() -> dict[str, dict[tuple[str, str], np.ndarray]]:
    rng = np.random.default_rng(3)
    out = {}
    for k, (name, (*_, base)) in enumerate(STUDIES.items()):
        out[name] = {}
        for i, col in enumerate(COLUMNS):
            spread = (0.004 + 0.001 * k) * rng.permutation([-2.0, -1.0, 0.0, 1.0, 2.0])
            out[name][col] = base + 0.01 * i + spread
    return out


VALUES = _values()


def pct(name: str, col: tuple[str, str]) -> np.ndarray:
    return 100.0 * VALUES[name][col]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('protocols') / 'store.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        for key, (kind, label, dataset, v) in BASELINES.items():
            for mode in MODES:
                s.add(
                    Baseline(
                        key=key,
                        dataset=dataset,
                        kind=kind,
                        label=label,
                        trunk=label.split("(")[1].rstrip(")"),
                        mode=mode,
                        config={"dataset": dataset},
                        **dict(zip(METRICS, v, strict=True)),
                    )
                )
        for name, (dataset, loss, _, config, _) in STUDIES.items():
            st = Study(
                name=name,
                dataset=dataset,
                loss=loss,
                strategy=None,
                preset="cpu",
                config=config,
                code_version="test",
            )
            s.add(st)
            s.flush()
            s.add(StudyBaseline(study_id=st.id, key=LINKS[name]))
            for rep in range(1, REPS + 1):
                for mode in MODES:
                    v = {m: float(VALUES[name][(mode, m)][rep - 1]) for m in METRICS}
                    s.add(
                        TestResult(
                            study_id=st.id, reproduction=rep, mode=mode, fold=-1, params={}, **v
                        )
                    )
            if name == "cars-x":  # 5 complete trials, 2 scored 0; a failed one is not counted
                for number in range(6):
                    zero = number in (1, 3)
                    s.add(
                        Trial(
                            study_id=st.id,
                            number=number,
                            params={},
                            params_hash=f"h{number}",
                            state="failed" if number == 5 else "complete",
                            value=None if number == 5 else 0.0 if zero else 0.3,
                            sem=None if number == 5 else 0.0 if zero else 0.01,
                            reason=NONFINITE_REASONS[number // 3]
                            if zero
                            else "non-finite loss"
                            if number == 5
                            else None,
                        )
                    )
    return url


def summary_of(url: str, **selection) -> pd.DataFrame:
    return summarize(collect(store.connect(url), **selection))


def expected_marks(names: list[str]) -> dict[tuple[str, str, str], dict]:
    """Independently: per block (defined above, not by the code) the best means and Welch p."""
    out = {}
    for block in {STUDIES[n][2] for n in names}:
        rows = [n for n in names if STUDIES[n][2] == block]
        for col in COLUMNS:
            means = {n: pct(n, col).mean() for n in rows}
            top = max(means.values())
            ref = next(n for n in rows if means[n] == top)
            for n in rows:
                p = (
                    math.nan
                    if n == ref
                    else stats.ttest_ind(pct(n, col), pct(ref, col), equal_var=False).pvalue
                )
                out[(n, *col)] = {"best": means[n] == top, "p": p}
    return out


# --- the protocol --------------------------------------------------------------------------------


def test_comparison_scope_leaves_out_methods_and_budgets_only():
    a = fingerprint("a", "contrastive", 1)
    b = fingerprint("b", "arcface", 1, trials=50)
    b["study"]["strategy"] = {"name": "metrix", "params": {}}
    b["study"]["miner"] = {"name": "multi_similarity", "params": {}}
    b["study"]["sampler"] = {"name": "hard_class", "params": {"k": 2}}
    b["study"]["search"]["enqueue"] = [{"arcface_margin": 0.5}]
    b["study"]["overrides"] = {"max_epochs": 1, "trunk": "tiny_cnn"}
    b["study"]["preset"] = "studies/presets/cpu.yaml"
    b["study"]["test"] = {"reproductions": 10}
    b["preset"]["loss_optimizer"]["lr"] = {"low": 1e-4, "high": 1e-2, "log": True}
    b["preset"]["test"] = {"reproductions": 10}
    b["reproductions"] = 10
    b["pruner"] = "median"
    assert comparison_key(a) == comparison_key(b) and comparison_scope(a) == comparison_scope(b)
    for path in ("preset.max_epochs", "study.dataset.root", "study.search.seed", "sampler"):
        c = fingerprint("a", "contrastive", 1)
        *parents, last = path.split(".")
        node = c
        for p in parents:
            node = node[p]
        node[last] = {"preset.max_epochs": 2, "study.dataset.root": "/data", "sampler": "tpe"}.get(
            path, 7
        )
        assert comparison_key(c) != comparison_key(a), path
        assert [d[0] for d in scope_differences([comparison_scope(a), comparison_scope(c)])] == [
            path
        ]
    assert comparison_scope(a) is not a and a["study"]["name"] == "a"  # the input is not changed
    assert comparison_scope(None) == {} and len(comparison_key({})) == 8
    for path in ("study.loss", "study.sampler", "space", "trials", "study.overrides"):
        assert path in COMPARISON_EXCLUDED


def test_comparison_scope_real_resolved_studies():
    """Two resolved study files (mlrc.config): another loss, strategy and budget keep the
    protocol; another max_epochs override changes it, and only preset.max_epochs differs."""
    from mlrc.config import StudyConfig, resolve, validate_model

    def resolved(loss: str, **kw) -> dict:
        doc = {
            "name": f"s-{loss}",
            "dataset": {"name": "glyphs"},
            "preset": "cpu",
            "loss": {"name": loss},
            "search": {"seed": 0, "trials": kw.get("trials", 2)},
            "overrides": {"max_epochs": kw.get("max_epochs", 1)},
        }
        return resolve(validate_model(StudyConfig, doc, "t"), "t").fingerprint()

    a, b = resolved("contrastive"), resolved("triplet", trials=3)
    assert comparison_key(a) == comparison_key(b)
    c = resolved("contrastive", max_epochs=2)
    diffs = scope_differences([comparison_scope(a), comparison_scope(c)])
    assert diffs == [("preset.max_epochs", [1, 2])]


# --- grouping and marks --------------------------------------------------------------------------


def test_two_protocols_two_blocks_marks_within_each(url):
    summary = summary_of(url)
    studies = summary[~summary["baseline"]]
    assert set(studies["study"]) == set(STUDIES)
    keys = {n: comparison_key(STUDIES[n][3]) for n in STUDIES}
    assert keys["e1-contrastive"] == keys["e1-triplet"] == keys["e1-ms"] != keys["e2-arcface"]
    for _, r in studies.iterrows():
        assert r["protocol"] == keys[r["study"]]
    want = expected_marks(list(STUDIES))
    for _, r in studies.iterrows():
        e = want[(r["study"], r["mode"], r["metric"])]
        assert bool(r["best"]) == e["best"], (r["study"], r["mode"], r["metric"])
        if math.isnan(e["p"]):
            assert math.isnan(r["p_value"])
        else:
            assert r["p_value"] == pytest.approx(e["p"], rel=1e-9)
            assert bool(r["not_worse"]) == (e["p"] >= 0.05)
    # e2-arcface beats every E1 row, and e1-contrastive keeps its bold and underline
    assert (studies.loc[studies["study"] == "e2-arcface", "best"]).all()
    assert (studies.loc[studies["study"] == "e1-contrastive", "best"]).all()
    best_rows = set(studies.loc[studies["best_row"], "study"])
    assert best_rows == {"e1-contrastive", "e2-arcface", "cars-x"}
    # e1-ms is 0.3 points below e1-contrastive: within the noise of its own block
    e1ms = studies[(studies["study"] == "e1-ms") & (studies["metric"] == "map_at_r")]
    assert e1ms["not_worse"].all()
    fields = dict(zip(studies["study"], studies["protocol_fields"], strict=True))
    assert fields["e1-triplet"] == "preset.max_epochs 1" and fields["e2-ntxent"] == (
        "preset.max_epochs 2"
    )
    assert fields["cars-x"] == ""  # a single protocol in its dataset: nothing to name


def _md_blocks(md: str) -> dict[str, list[list[str]]]:
    """Heading → rows (cells) of each markdown block."""
    blocks, current = {}, None
    for line in md.splitlines():
        if line.startswith("### "):
            current = line[4:]
            blocks[current] = []
        elif line.startswith("| ") and not line.startswith("| Loss") and current:
            blocks[current].append([c.strip() for c in line.strip("|").split("|")])
    return blocks


def test_markdown_blocks_headers_baseline_first_and_legend(url):
    md = render(summary_of(url), "md")
    k1, k2 = comparison_key(STUDIES["e1-ms"][3]), comparison_key(STUDIES["e2-arcface"][3])
    tail = " (%, mean ± 95% CI half-width over n reproductions)"
    blocks = _md_blocks(md)
    assert list(blocks) == [  # every study: datasets by name, studies by name
        f"cars_196{tail}",
        f"cub — protocol {k1}: preset.max_epochs 1{tail}",
        f"cub — protocol {k2}: preset.max_epochs 2{tail}",
    ]
    want = expected_marks(list(STUDIES))
    labels = {
        "contrastive": "e1-contrastive",
        "triplet": "e1-triplet",
        "multi_similarity": "e1-ms",
        "arcface": "e2-arcface",
        "ntxent": "e2-ntxent",
    }
    for heading, rows in blocks.items():
        baseline = rows[0]
        kind, label, _, v = BASELINES["kcars" if heading.startswith("cars") else "kcub"]
        assert baseline[0] == label and baseline[1] == "1"
        assert baseline[2:] == [f"{100 * x:.2f}" for x in v] * 2  # no ±, no mark
        for row in rows[1:]:
            if heading.startswith("cars"):
                continue
            study = labels[row[0].removeprefix("<ins>").removesuffix("</ins>")]
            assert row[0].startswith("<ins>") == (study in ("e1-contrastive", "e2-arcface"))
            for col, cell in zip(COLUMNS, row[2:], strict=True):
                e = want[(study, *col)]
                assert cell.startswith("**") == e["best"], (study, col, cell)
                dagger = not math.isnan(e["p"]) and e["p"] >= 0.05
                assert cell.endswith("†") == dagger, (study, col, cell)
    assert [r[0] for r in blocks[f"cub — protocol {k1}: preset.max_epochs 1{tail}"]] == [
        "Pretrained (bninception)",
        "<ins>contrastive</ins>",
        "multi_similarity",
        "triplet",
    ]
    legend = md.split("\n\n")[-1]
    assert (
        f"cub: 2 protocols, differing in preset.max_epochs 1 vs 2 — {k1}: preset.max_epochs 1"
        in legend
    )
    assert f"{k2}: preset.max_epochs 2." in legend
    assert "marks and Welch tests compare rows within a block only" in legend
    assert (
        f"cub, protocol {k1}: the search budgets differ — trials 4 (contrastive, triplet) vs 8 "
        "(multi_similarity)." in legend
    )
    assert f"cub, protocol {k2}: the search budgets" not in legend
    assert "Pretrained: the ImageNet-pretrained trunk" in legend and "Random init:" in legend
    assert (
        "contrastive (cars_196): 2 of 5 complete trials scored 0 — non-finite loss or "
        "embeddings, as in the reference harness." in legend
    )
    assert legend.count("scored 0") == 1


def test_csv_protocol_columns_baseline_rows_and_nonfinite_counts(url):
    table = pd.read_csv(io.StringIO(render(summary_of(url), "csv")))
    for c in ("protocol", "protocol_fields", "complete_trials", "nonfinite_trials"):
        assert c in table.columns
    assert not table.duplicated(["study", "protocol", "mode", "metric"]).any()
    base = table[table["loss"].isin(["pretrained", "random_init"])]
    # the cub baseline is the first row of both cub blocks: once per protocol
    assert len(base) == 3 * 6
    assert (base["n"] == 1).all()
    assert (
        base[["half_width", "low", "high", "p_value", "not_worse", "strategy"]].isna().all().all()
    )
    assert not base["best"].any() and not base["best_row"].any()
    cub = base[base["dataset"] == "cub"]
    assert set(cub["loss"]) == {"pretrained"} and set(cub["study"]) == {"Pretrained (bninception)"}
    assert set(cub["protocol"]) == {comparison_key(STUDIES[n][3]) for n in ("e1-ms", "e2-ntxent")}
    p1 = cub[(cub["mode"] == "separated") & (cub["metric"] == "precision_at_1")]
    assert p1["mean"].tolist() == pytest.approx([99.0, 99.0])  # above every study, unmarked
    cars = base[base["dataset"] == "cars_196"]
    assert set(cars["loss"]) == {"random_init"} and cars["protocol_fields"].isna().all()
    counts = table[~table.index.isin(base.index)].drop_duplicates("study").set_index("study")
    assert counts.loc["cars-x", "nonfinite_trials"] == 2
    assert counts.loc["cars-x", "complete_trials"] == 5
    assert counts.loc["cars-y", "nonfinite_trials"] == 0
    # the line order: each block's baseline first
    first = table.drop_duplicates(["dataset", "protocol"], keep="first")
    assert first["loss"].isin(["pretrained", "random_init"]).all()


class _Tables(HTMLParser):
    """Per <table>: its attributes and rows; per cell: text and <strong>, <u>, <sup>."""

    def __init__(self) -> None:
        super().__init__()
        self.tables, self.cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append({"attrs": dict(attrs), "rows": []})
        elif tag == "tr":
            self.tables[-1]["rows"].append({"attrs": dict(attrs), "cells": []})
        elif tag in ("td", "th"):
            self.cell = {"text": "", "strong": False, "u": False, "sup": False, "th": tag == "th"}
        elif tag in ("strong", "u", "sup") and self.cell is not None:
            self.cell[tag] = True

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1]["rows"][-1]["cells"].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell["text"] += data


def test_html_one_table_per_protocol_with_baseline_first(url):
    page = render(summary_of(url), "html")
    parser = _Tables()
    parser.feed(page)
    k1, k2 = comparison_key(STUDIES["e1-ms"][3]), comparison_key(STUDIES["e2-arcface"][3])
    assert [(t["attrs"]["data-dataset"], t["attrs"]["data-protocol"]) for t in parser.tables] == [
        ("cars_196", comparison_key(STUDIES["cars-x"][3])),
        ("cub", k1),
        ("cub", k2),
    ]
    for t in parser.tables:
        body = [r for r in t["rows"] if not r["cells"][0]["th"]]
        first = body[0]
        assert first["attrs"].get("class") == "baseline"
        assert first["cells"][1]["text"] == "1"
        assert not any(c["strong"] or c["u"] or c["sup"] for c in first["cells"])
        assert not any("±" in c["text"] for c in first["cells"])
        assert all(r["attrs"].get("class") != "baseline" for r in body[1:])
        assert sum(c["strong"] for r in body for c in r["cells"]) >= 6  # a best in each column
    assert f"<h3>cub — protocol {k1}: preset.max_epochs 1</h3>" in page
    assert "preset.max_epochs 1 vs 2" in page and "2 of 5 complete trials scored 0" in page


def test_latex_blocks_baseline_and_notes_compile(url, tmp_path):
    tex = render(summary_of(url), "latex", standalone=True)
    k1 = comparison_key(STUDIES["e1-ms"][3])
    lines = tex.splitlines()
    head = lines.index(rf"\multicolumn{{8}}{{l}}{{\textit{{cub}} --- protocol {k1}}} \\")
    baseline = lines[head + 1]
    assert baseline.startswith("Pretrained (bninception) & 1 & 20.00 & 99.00 & 15.00 &")
    assert r"\textbf" not in baseline and r"\dagger" not in baseline and r"\pm" not in baseline
    assert lines[head + 2].startswith(r"\underline{contrastive} & 5 & \textbf{")
    cars = lines.index(r"\multicolumn{8}{l}{\textit{cars\_196}} \\")
    assert lines[cars + 1].startswith("Random init (tiny\\_cnn) & 1 &")
    assert r"preset.max\_epochs 1 vs 2" in tex and "scored 0 --- non-finite" in tex
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


def test_single_protocol_report_has_no_protocol_noise(url):
    """One protocol per dataset, no zero-scored trials: no protocol header, note or legend."""
    md = render(summary_of(url, studies=["cars-y", "e1-triplet"]), "md")
    assert "protocol" not in md.lower() and "budget" not in md and "scored 0" not in md
    # the baselines of the selected studies still lead their blocks
    assert "| Random init (tiny_cnn) | 1 |" in md and "| Pretrained (bninception) | 1 |" in md
    one = render(summary_of(url, studies=["e1-triplet", "e1-contrastive"]), "md")
    assert "protocol" not in one.lower() and "### cub (%" in one
