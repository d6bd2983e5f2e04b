"""`mlrc report` and `mlrc dashboard build` on a store filled by hand: exact ties in the marks,
archived studies (``NAME.old-K``, left by ``study run --force-new``) and test folds that all
kept epoch 0. Every expectation is recomputed here from the values put in the store.

The store: dataset ``cub`` has ``twin-a`` and ``twin-b`` with identical values (an exact tie
for the best everywhere), ``far`` 20 points below (p < 0.05 against both) and ``near``, 0.1
point below with a wide spread (p ≥ 0.05 against both). ``dup`` and its archived ``dup.old-1``
are on dataset ``cars``: the archived one is far better, so it would be bold and underlined if
it were compared. ``lonely.old-1`` (dataset ``sop``) was archived, and its current study
``lonely`` has no test results. ``zero`` (dataset ``inshop``) has every complete test fold at
epoch 0; ``trained`` beside it has one fold at epoch 3.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.store.engine import session
from mlrc.store.schema import FoldRun, Study, TestResult

runner = CliRunner()
MODES = ("separated", "concatenated")
METRICS = ("map_at_r", "precision_at_1", "r_precision")
COLUMNS = [(mode, m) for mode in MODES for m in METRICS]
SPREAD = np.array([-0.002, -0.001, 0.0, 0.001, 0.002])

# name: dataset, loss, per-reproduction values (fractions; the same in every column)
STUDIES = {
    "twin-a": ("cub", "contrastive", 0.60 + SPREAD),
    "twin-b": ("cub", "triplet", 0.60 + SPREAD),
    "far": ("cub", "arcface", 0.40 + SPREAD),
    "near": ("cub", "ntxent", 0.599 + 10 * SPREAD),
    "dup": ("cars", "contrastive", 0.30 + SPREAD),
    "dup.old-1": ("cars", "contrastive", 0.90 + SPREAD),
    "dup-other": ("cars", "triplet", 0.20 + SPREAD),
    "lonely": ("sop", "contrastive", None),
    "lonely.old-1": ("sop", "contrastive", 0.50 + SPREAD),
    "zero": ("inshop", "contrastive", 0.10 + SPREAD),
    "trained": ("inshop", "triplet", 0.20 + SPREAD),
}
EPOCHS = {"zero": [0, 0, 0, 0], "trained": [0, 3, 0, 0]}  # best epoch of each test fold


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('marks') / 'store.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        for name, (dataset, loss, values) in STUDIES.items():
            st = Study(
                name=name, dataset=dataset, loss=loss, preset="cpu", config={}, code_version="t"
            )
            s.add(st)
            s.flush()
            for rep, v in enumerate([] if values is None else values, 1):
                for mode in MODES:
                    s.add(
                        TestResult(
                            study_id=st.id,
                            reproduction=rep,
                            mode=mode,
                            fold=-1,
                            params={},
                            **dict.fromkeys(METRICS, float(v)),
                        )
                    )
            for fold, epoch in enumerate(EPOCHS.get(name, [])):
                s.add(
                    FoldRun(
                        study_id=st.id,
                        kind="test",
                        params_hash="h",
                        reproduction=1,
                        fold=fold,
                        seed=0,
                        status="complete",
                        best_epoch=epoch,
                    )
                )
    engine.dispose()
    return url


def report(url: str, *args: str) -> str:
    r = runner.invoke(app, ["report", "--storage", url, *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def csv(url: str, *args: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(report(url, "--format", "csv", *args)))


def md_rows(md: str) -> dict[str, list[str]]:
    """Markdown table rows by label (underline kept), cells stripped."""
    out = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| Loss"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def p_value(a: str, b: str) -> float:
    return stats.ttest_ind(100 * STUDIES[a][2], 100 * STUDIES[b][2], equal_var=False).pvalue


# --- exact ties -----------------------------------------------------------------------------


def test_the_data_is_built_as_described():
    assert p_value("far", "twin-a") < 0.05 and p_value("far", "twin-b") < 0.05
    assert p_value("near", "twin-a") >= 0.05 and p_value("near", "twin-b") >= 0.05
    assert (STUDIES["twin-a"][2] == STUDIES["twin-b"][2]).all()


def test_rows_tied_for_the_best_are_all_best_and_none_is_marked(url):
    table = csv(url, "--study", "twin-a", "--study", "twin-b", "--study", "far", "--study", "near")
    for twin in ("twin-a", "twin-b"):
        lines = table[table["study"] == twin]
        assert len(lines) == len(COLUMNS)
        assert lines["best"].all() and lines["best_row"].all() and lines["not_worse"].all()
        assert lines["p_value"].isna().all()  # the best is not tested against itself
    for other in ("far", "near"):
        lines = table[table["study"] == other]
        assert not lines["best"].any() and not lines["best_row"].any()
        # the smallest p of the tests against each tied best row (here the same twice)
        want = min(p_value(other, "twin-a"), p_value(other, "twin-b"))
        assert lines["p_value"].to_numpy() == pytest.approx(want, rel=1e-6)
    assert table.loc[table["study"] == "far", "not_worse"].eq(False).all()
    assert table.loc[table["study"] == "near", "not_worse"].eq(True).all()

    md = report(url, "--study", "twin-a", "--study", "twin-b", "--study", "far", "--study", "near")
    rows = md_rows(md)
    for label in ("<ins>contrastive</ins>", "<ins>triplet</ins>"):  # both underlined
        assert all(c.startswith("**") and not c.endswith("†") for c in rows[label][1:]), rows
    assert all(c.endswith(" †") and "**" not in c for c in rows["ntxent"][1:])
    assert not any(c.endswith("†") or "**" in c for c in rows["arcface"][1:])
    assert "Exact ties: every row tied for a column's best mean is bold and unmarked" in md

    doc = json.loads(
        report(url, "--format", "json", "--study", "twin-a", "--study", "twin-b", "--study", "far")
    )
    [block] = doc["blocks"]
    by_label = {r["label"]: r for r in block["rows"]}
    for label in ("contrastive", "triplet"):
        assert by_label[label]["underline"]
        assert all(c["bold"] and not c["not_worse_mark"] for c in by_label[label]["cells"].values())


# --- archived studies -------------------------------------------------------------------------


def test_an_archived_study_is_left_out_once_its_current_study_has_results(url):
    table = csv(url)
    assert "dup.old-1" not in set(table["study"])  # dup has test results
    assert "lonely.old-1" in set(table["study"])  # lonely has none: shown, marked archived
    assert table.loc[table["study"] == "lonely.old-1", "archived"].all()
    assert not table.loc[table["study"] == "dup", "archived"].any()
    assert not table["archived"][table["study"] != "lonely.old-1"].any()


def test_archived_shows_them_marked_and_outside_the_marks(url):
    table = csv(url, "--archived")
    old = table[table["study"] == "dup.old-1"]
    assert len(old) == len(COLUMNS) and old["archived"].all()
    # far better than dup, yet never best, never tested: dup is the best of its block
    assert not old["best"].any() and not old["best_row"].any() and old["p_value"].isna().all()
    cars = table[(table["dataset"] == "cars") & ~table["archived"]]
    assert set(cars.loc[cars["best"], "study"]) == {"dup"}
    assert set(cars.loc[cars["best_row"], "study"]) == {"dup"}

    label = "contrastive (dup.old-1, archived)"
    md = report(url, "--archived", "--study", "dup", "--study", "dup.old-1", "--study", "dup-other")
    rows = md_rows(md)
    assert label in rows and "<ins>contrastive</ins>" in rows  # the current dup keeps its label
    assert not any("**" in c or "†" in c for c in rows[label])
    assert "archived: a study that `mlrc study run --force-new` replaced" in md
    latex = report(url, "--archived", "--format", "latex", "--study", "dup", "--study", "dup.old-1")
    assert "contrastive (dup.old-1, archived) &" in latex and "archived: a study" in latex
    html = report(url, "--archived", "--format", "html", "--study", "dup", "--study", "dup.old-1")
    assert f'<td class="label">{label}</td>' in html and "archived: a study" in html
    doc = json.loads(report(url, "--archived", "--format", "json", "--study", "dup.old-1"))
    assert all(line["archived"] for line in doc["lines"])
    assert doc["blocks"][0]["rows"][0]["archived"] and doc["blocks"][0]["rows"][0]["label"] == label


def test_naming_an_archived_study_shows_it(url):
    table = csv(url, "--study", "dup", "--study", "dup.old-1")
    assert set(table["study"]) == {"dup", "dup.old-1"}
    assert table.loc[table["study"] == "dup.old-1", "archived"].all()


def test_the_dashboard_marks_and_leaves_out_archived_studies_as_the_report(url, tmp_path):
    out = tmp_path / "new" / "folder" / "d.html"  # the folder is created
    r = runner.invoke(app, ["dashboard", "build", "--out", str(out), "--storage", url])
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    assert "dup.old-1" not in page and "lonely.old-1 (archived)" in page
    r = runner.invoke(
        app, ["dashboard", "build", "--out", str(out), "--storage", url, "--archived"]
    )
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    assert "dup.old-1 (archived)" in page  # its study section
    assert "contrastive (dup.old-1, archived)" in page  # its row in the test table
    assert not list(out.parent.glob(".*tmp*"))  # written through a temporary file, renamed


# --- epoch 0 ----------------------------------------------------------------------------------


def test_a_study_whose_test_folds_all_kept_epoch_0_gets_a_note(url):
    table = csv(url, "--study", "zero", "--study", "trained")
    assert table.loc[table["study"] == "zero", "untrained_test"].all()
    assert not table.loc[table["study"] == "trained", "untrained_test"].any()
    note = "contrastive (inshop): every test fold kept epoch 0, the untrained model"
    for fmt in ("md", "html", "latex"):
        text = report(url, "--format", fmt, "--study", "zero", "--study", "trained")
        assert note in text, fmt
        assert "triplet (inshop): every test fold" not in text
    doc = json.loads(report(url, "--format", "json", "--study", "zero", "--study", "trained"))
    assert any(line.startswith(note) for line in doc["legend"])
    assert not any("epoch 0" in line for line in doc["legend"] if "triplet" in line)


def test_without_such_a_study_there_is_no_note(url):
    md = report(url, "--study", "trained", "--study", "twin-a")
    assert "trained" in md or "triplet" in md
    assert "epoch 0" not in md
