"""The report's ranking-stability section (:mod:`mlrc.report.stability`), every number checked
against a computation written here: Kendall's τ-b as a naive count of concordant, discordant and
tied pairs, the bootstrap as a naive loop over resamples (and against the exact probability
enumerated over every resample), the separated/concatenated flips on a hand-made case. The
section itself is checked in the md, html, json and stability-csv reports of the store of
``test_report.py`` (campaign ``grid``: cub with three rows, cars_196 with a row of one
reproduction) and of small value frames built here."""

from __future__ import annotations

import io
import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_report import MODES, VALUES, cli, url  # noqa: F401 (url: a fixture)

from mlrc.report.stability import (
    RESAMPLES,
    SEED,
    best_kept,
    flipped_pairs,
    kendall_tau,
    stability_lines,
    stability_md,
)
from mlrc.report.tables import summarize

CSV_COLUMNS = [
    "kind",
    "dataset",
    "protocol",
    "mode",
    "metric",
    "other_dataset",
    "other_protocol",
    "other_mode",
    "other_metric",
    "row",
    "other_row",
    "rows",
    "value",
    "p_value",
    "resamples",
    "seed",
    "note",
]


def naive_tau_b(x: list[float], y: list[float]) -> float:
    """τ-b from the pairs: (C − D) / √((C + D + Tx)(C + D + Ty)), Tx the pairs tied in x only."""
    c = d = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = x[i] - x[j], y[i] - y[j]
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif dx * dy > 0:
            c += 1
        else:
            d += 1
    return (c - d) / math.sqrt((c + d + tx) * (c + d + ty))


def naive_kept(samples: list[np.ndarray], best: list[int], resamples: int, seed: int) -> float:
    """The bootstrap as a loop: the same draws (each row's index matrix, rows in order), means
    and maxima computed one resample at a time."""
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(v), size=(resamples, len(v))) for v in samples]
    kept = 0
    for b in range(resamples):
        means = [sum(v[k] for k in draws[j][b]) / len(v) for j, v in enumerate(samples)]
        kept += any(means[i] >= max(means) for i in best)
    return kept / resamples


def exact_kept(samples: list[np.ndarray], best: int) -> float:
    """The probability the bootstrap estimates, by enumerating every resample of every row."""
    per_row = []
    for v in samples:
        means = [np.mean(v[list(idx)]) for idx in itertools.product(range(len(v)), repeat=len(v))]
        per_row.append(means)
    total = hits = 0
    for combo in itertools.product(*per_row):
        total += 1
        hits += combo[best] >= max(combo)
    return hits / total


# --- the numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tau_b_against_a_naive_pair_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, size=9).astype(float)  # few values: many ties
    y = x + rng.integers(-2, 3, size=9)
    tau, p = kendall_tau(x, y)
    assert tau == pytest.approx(naive_tau_b(x.tolist(), y.tolist()), abs=1e-12)
    assert p == pytest.approx(stats.kendalltau(x, y).pvalue, abs=1e-12)


def test_tau_is_nan_for_one_row_or_an_all_tied_ranking():
    assert math.isnan(kendall_tau(np.array([1.0]), np.array([2.0]))[0])
    assert math.isnan(kendall_tau(np.array([1.0, 1.0, 1.0]), np.array([1.0, 2.0, 3.0]))[0])
    assert kendall_tau(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))[0] == -1.0


def test_bootstrap_equals_a_naive_loop_and_is_seeded():
    samples = [np.array([60.0, 61.0, 59.5]), np.array([60.2, 58.0, 61.5, 60.0]), np.array([50.0])]
    for seed in (0, 5):
        assert best_kept(samples, [1], 400, seed) == naive_kept(samples, [1], 400, seed)
    assert best_kept(samples, [1], 400, 3) == best_kept(samples, [1], 400, 3)
    assert 0.0 < best_kept(samples, [1], 400, 3) < 1.0


def test_bootstrap_converges_to_the_exact_probability():
    samples = [np.array([1.0, 4.0, 2.0]), np.array([2.0, 3.0, 2.5])]
    exact = exact_kept(samples, 0)
    n = 20_000
    got = best_kept(samples, [0], n, SEED)
    assert abs(got - exact) < 4 * math.sqrt(exact * (1 - exact) / n)


def test_bootstrap_refuses_no_resamples_or_an_empty_row_in_one_line():
    for args in (([np.array([1.0, 2.0])], [0], 0), ([np.array([1.0]), np.array([])], [0], 10)):
        with pytest.raises(ValueError, match="best_kept needs resamples") as e:
            best_kept(*args)
        assert "\n" not in str(e.value)


def test_a_dominant_row_is_always_kept_and_ties_count_as_kept():
    samples = [np.array([90.0, 91.0, 89.0]), np.array([50.0, 52.0, 48.0])]
    assert best_kept(samples, [0], 200, 1) == 1.0
    assert best_kept(samples, [1], 200, 1) == 0.0
    twins = [np.array([5.0, 5.0]), np.array([5.0, 5.0])]
    assert best_kept(twins, [0], 50, 1) == 1.0


def test_flips_on_a_hand_made_case():
    sep = np.array([3.0, 2.0, 1.0, 1.0])
    cat = np.array([1.0, 2.0, 3.0, 0.0])
    # 0 > 1 > 2 when separated, 2 > 1 > 0 concatenated; row 3 ties row 2 when separated and is
    # last concatenated, behind 0 and 1 both ways: no flip with it
    assert sorted(flipped_pairs(sep, cat)) == [(0, 1), (0, 2), (1, 2)]
    assert flipped_pairs(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == []


# --- the section in the reports ---------------------------------------------------------------

GRID_CUB = ["cub-triplet", "cub-contrastive-metrix", "cub-contrastive"]  # table order


def _mean(name: str, col: tuple[str, str]) -> float:
    return float(100 * VALUES[name][col].mean())


def test_stability_csv_numbers_against_naive_ones(url):  # noqa: F811
    r = cli("report", "--storage", url, "--campaign", "grid", "--format", "stability-csv")
    table = pd.read_csv(io.StringIO(r.stdout))
    assert list(table.columns) == CSV_COLUMNS
    cub = table[table["dataset"] == "cub"]
    for mode in MODES:
        for a, b in itertools.combinations(["map_at_r", "precision_at_1", "r_precision"], 2):
            line = cub[(cub["kind"] == "tau") & (cub["mode"] == mode) & (cub["metric"] == a)]
            line = line[line["other_metric"] == b].iloc[0]
            x = [_mean(n, (mode, a)) for n in GRID_CUB]
            y = [_mean(n, (mode, b)) for n in GRID_CUB]
            assert line["value"] == pytest.approx(naive_tau_b(x, y), abs=1e-9)
            assert line["rows"] == 3
    kept = cub[(cub["kind"] == "best_kept") & (cub["mode"] == "concatenated")]
    kept = kept[kept["metric"] == "map_at_r"].iloc[0]
    samples = [100 * VALUES[n][("concatenated", "map_at_r")] for n in GRID_CUB]
    assert kept["row"] == "contrastive"
    assert kept["value"] == naive_kept(samples, [2], RESAMPLES, SEED)
    assert 0.0 < kept["value"] < 1.0  # 0.2 points ahead within the noise: not always kept
    assert (kept["resamples"], kept["seed"]) == (RESAMPLES, SEED)
    # separated P@1: contrastive + metrix ahead (60 vs 50); concatenated: contrastive (65 vs 64.8)
    flips = cub[cub["kind"] == "flip"]
    assert flips[["metric", "row", "other_row"]].values.tolist() == [
        ["precision_at_1", "contrastive + metrix", "contrastive"]
    ]
    assert flips["value"].iloc[0] == pytest.approx(
        _mean("cub-contrastive", ("concatenated", "precision_at_1"))
        - _mean("cub-contrastive-metrix", ("concatenated", "precision_at_1")),
        abs=1e-9,
    )
    cars = table[(table["dataset"] == "cars_196") & (table["kind"] == "best_kept")]
    assert cars["value"].isna().all()
    assert set(cars["note"]) == {"ntxent has one reproduction"}


def test_md_html_and_json_show_the_section(url):  # noqa: F811
    md = cli("report", "--storage", url, "--campaign", "grid").stdout
    section = md[md.index("**Ranking stability**") :]
    row = next(line for line in section.splitlines() if line.startswith("- cub (3 rows): "))
    kept = naive_kept(
        [100 * VALUES[n][("concatenated", "map_at_r")] for n in GRID_CUB], [2], RESAMPLES, SEED
    )
    assert f"contrastive {kept:.2f}" in row
    assert row.endswith("flips (MAP@R) 0 of 3.")  # no MAP@R flip among three rows
    assert "– (ntxent has one reproduction)" in section
    page = cli("report", "--storage", url, "--campaign", "grid", "--format", "html").stdout
    assert '<section class="stability"><h3>Ranking stability</h3><ul>' in page
    assert f"contrastive {kept:.2f}" in page
    doc = json.loads(
        cli("report", "--storage", url, "--campaign", "grid", "--format", "json").stdout
    )
    csv = cli("report", "--storage", url, "--campaign", "grid", "--format", "stability-csv").stdout
    lines = doc["stability"]["lines"]
    assert (doc["stability"]["resamples"], doc["stability"]["seed"]) == (RESAMPLES, SEED)
    assert len(lines) == len(pd.read_csv(io.StringIO(csv)))
    assert [r["kind"] for r in lines].count("flip") == 1


def test_one_row_is_one_line(url):  # noqa: F811
    md = cli("report", "--storage", url, "--campaign", "other").stdout
    section = md[md.index("**Ranking stability**") :].splitlines()
    assert section[2] == "- cub: one row (arcface): no ranking to check."
    assert section[3] == ""  # one line, no numbers and no words about them
    assert section[4].startswith("Values in %")  # the table's legend follows


def _values(table: dict[str, dict[str, list[float]]]) -> pd.DataFrame:
    """A values frame (:func:`mlrc.report.tables.collect`'s shape) of dataset → loss →
    per-reproduction concatenated and separated MAP@R (the same values in both)."""
    rows = [
        {
            "study": f"{dataset}-{loss}",
            "dataset": dataset,
            "protocol": "p",
            "loss": loss,
            "strategy": None,
            "pruner": "none",
            "reproduction": rep,
            "mode": mode,
            "metric": "map_at_r",
            "value": v,
        }
        for dataset, losses in table.items()
        for loss, values in losses.items()
        for mode in MODES
        for rep, v in enumerate(values, 1)
    ]
    return pd.DataFrame(rows)


def test_one_reproduction_per_row_is_one_line():
    summary = summarize(_values({"cub": {"a": [50.0], "b": [40.0]}}))
    md = stability_md(summary)
    assert "- cub: one reproduction per row: no ranking stability to measure." in md
    assert [r["kind"] for r in stability_lines(summary)] == ["note"]


def test_across_blocks_tau_over_the_shared_losses():
    summary = summarize(
        _values(
            {
                "cub": {"a": [60.0, 61.0], "b": [50.0, 51.0], "c": [40.0, 41.0], "d": [1.0, 2.0]},
                "cars": {"a": [30.0, 31.0], "c": [25.0, 26.0], "b": [20.0, 21.0]},
            }
        )
    )
    across = [r for r in stability_lines(summary) if r["kind"] == "across"]
    assert len(across) == 1  # the headline column only: concatenated MAP@R
    r = across[0]
    assert (r["dataset"], r["other_dataset"], r["rows"]) == ("cub", "cars", 3)
    assert r["value"] == pytest.approx(naive_tau_b([60.5, 50.5, 40.5], [30.5, 20.5, 25.5]))
    md = "\n".join(stability_md(summary))
    assert "- Across blocks, τ-b of the shared rows' order: cub vs cars 0.33 (3 rows)." in md


def test_a_block_of_archived_studies_only_is_one_line():
    values = _values({"cub": {"a": [50.0, 51.0], "b": [40.0, 41.0]}, "cars": {"a": [1.0, 2.0]}})
    values["archived"] = values["dataset"] == "cars"
    lines = stability_lines(summarize(values))
    cars = [r for r in lines if r["dataset"] == "cars"]
    assert [(r["kind"], r["rows"]) for r in cars] == [("note", 0)]
    assert "no row to rank" in cars[0]["note"]


def test_the_dashboard_shows_the_section(url, tmp_path):  # noqa: F811
    out = tmp_path / "d.html"
    cli("dashboard", "build", "--out", str(out), "--storage", url, "--campaign", "grid")
    page = out.read_text(encoding="utf-8")
    tests = page[page.index('id="tests"') :]
    assert '<section class="stability"><h3>Ranking stability</h3><ul>' in tests
    assert "<li>cars_196 (2 rows): " in tests


def test_latex_has_the_section_and_compiles(url, tmp_path):  # noqa: F811
    from test_report import _compile

    args = ("report", "--storage", url, "--campaign", "grid", "--format", "latex")
    tex = cli(*args, "--standalone").stdout
    assert r"\textbf{Ranking stability.} cub (3 rows): $\tau$-b vs MAP@R" in tex
    _compile(tex, tmp_path)


def test_a_column_of_one_row_has_no_bootstrap():
    values = _values({"cub": {"a": [50.0, 51.0], "b": [40.0, 41.0]}})
    values = values[~((values["study"] == "cub-b") & (values["mode"] == "separated"))]
    kept = [r for r in stability_lines(summarize(values)) if r["kind"] == "best_kept"]
    by_mode = {r["mode"]: r for r in kept}
    assert by_mode["separated"]["value"] is None
    assert by_mode["separated"]["note"] == "one row has this column"
    assert by_mode["concatenated"]["value"] == 1.0  # 50.5 vs 40.5 with a spread of 0.5
