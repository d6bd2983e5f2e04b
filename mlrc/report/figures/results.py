"""The test results of the selected studies as a figure (:func:`test_figure`), drawn from the
summary DataFrame of :func:`mlrc.report.tables.summarize` read by the caller."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mlrc.report.figures.common import MODE_COLORS, label, layout
from mlrc.report.layout import mode_label, sizes_of
from mlrc.report.tables import ARCHIVED, SECTION, row_label, with_defaults

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["test_figure"]


def test_figure(summary: pd.DataFrame) -> go.Figure | None:
    """Test MAP@R (%) ± 95% CI half-width per study, one panel per dataset (per dataset and
    protocol when a dataset has several, as the report's blocks), separated vs concatenated (dot
    and whisker: the interval is the point, not the bar's area). A block's untrained baseline
    comes first, as a cross without an interval."""
    from plotly.subplots import make_subplots

    data = with_defaults(summary[summary["metric"] == "map_at_r"])
    if data.empty:
        return None
    blocks = list(dict.fromkeys(zip(data["dataset"], data["protocol"], strict=True)))
    split = {d for d, _ in blocks if sum(d == e for e, _ in blocks) > 1}
    flagged = data[data["test_set_selection"]]
    traditional = set(zip(flagged["dataset"], flagged["protocol"], strict=True))
    fig = make_subplots(
        rows=1,
        cols=len(blocks),
        subplot_titles=[
            label(f"{d} · {p}" if d in split else d)
            + (f" · traditional {SECTION}" if (d, p) in traditional else "")
            for d, p in blocks
        ],
        horizontal_spacing=0.06,
    )
    sizes = sizes_of(data)  # the legend names the sizes when every panel shares them
    names = {m: mode_label(m, sizes).lower() for m in MODE_COLORS}
    for col, (dataset, protocol) in enumerate(blocks, start=1):
        block = data[(data["dataset"] == dataset) & (data["protocol"] == protocol)]
        _add_test_block(fig, block, col, {"dataset": dataset, "protocol": protocol}, names)
    fig.update_yaxes(title_text="test MAP@R (%)", row=1, col=1)
    return layout(
        fig, height=420, scattermode="group", scattergap=0.6, legend={"orientation": "h", "y": 1.12}
    )


def _add_test_block(
    fig: go.Figure, block: pd.DataFrame, col: int, where: dict[str, str], names: dict[str, str]
) -> None:
    """One panel: the block's baselines, then its studies, each mode as a dot with whiskers."""
    base = block[block["baseline"]]
    d = block[~block["baseline"]]
    baselines = list(dict.fromkeys(base["study"]))
    studies = list(dict.fromkeys(d["study"]))
    labels = _study_labels(d, studies)
    for mode in ("separated", "concatenated"):
        meta = {**where, "mode": mode}
        trace = _test_trace(d, studies, labels, mode, col, meta)
        fig.add_trace(trace.update(name=names[mode]), row=1, col=col)
        if baselines:
            trace = _baseline_trace(base, baselines, mode, meta)
            fig.add_trace(trace.update(name=f"untrained, {names[mode]}"), row=1, col=col)
    order = [label(b) for b in baselines] + labels
    fig.update_xaxes(categoryorder="array", categoryarray=order, row=1, col=col)


def _study_labels(d: pd.DataFrame, studies: list[str]) -> list[str]:
    """Each study's row label (loss and strategy); as in the report's tables, a label shared by
    two studies gets their names, an archived study's its name and "archived", and a traditional
    study's (epoch chosen on the test set) a §."""
    labels = [row_label(*d[d["study"] == st][["loss", "strategy"]].iloc[0]) for st in studies]
    marked = set(d.loc[d["test_set_selection"], "study"])
    archived = set(d.loc[d["archived"], "study"])
    current = [lab for lab, st in zip(labels, studies, strict=True) if st not in archived]
    return [
        label(
            f"{lab} ({st}, {ARCHIVED})"
            if st in archived
            else (lab if current.count(lab) == 1 else f"{lab} ({st})")
        )
        + (f" {SECTION}" if st in marked else "")
        for lab, st in zip(labels, studies, strict=True)
    ]


def _test_trace(
    d: pd.DataFrame, studies: list[str], labels: list[str], mode: str, col: int, meta: dict
) -> go.Scatter:
    """The studies' test MAP@R in one mode: mean with the 95% half-width as error bars."""
    import plotly.graph_objects as go

    rows = {r["study"]: r for _, r in d[d["mode"] == mode].iterrows()}
    return go.Scatter(
        x=labels,
        y=[_num(rows[s]["mean"]) if s in rows else None for s in studies],
        mode="markers",
        error_y={
            "type": "data",
            "array": [_num(rows[s]["half_width"]) if s in rows else None for s in studies],
            "visible": True,
            "thickness": 2,
        },
        legendgroup=mode,
        offsetgroup=mode,
        showlegend=col == 1,
        marker={"color": MODE_COLORS[mode], "size": 11, "symbol": "diamond"},
        customdata=[[int(rows[s]["n"]) if s in rows else 0] for s in studies],
        meta={"role": "test", **meta, "studies": studies},
        hovertemplate="%{x}, "
        + mode
        + "<br>MAP@R %{y:.2f} ± %{error_y.array:.2f} % (n = %{customdata[0]})"
        "<extra></extra>",
    )


def _baseline_trace(base: pd.DataFrame, baselines: list[str], mode: str, meta: dict) -> go.Scatter:
    """The untrained baselines in one mode: a cross each (a single value, no interval)."""
    import plotly.graph_objects as go

    rows = {r["study"]: r for _, r in base[base["mode"] == mode].iterrows()}
    return go.Scatter(
        x=[label(b) for b in baselines],
        y=[_num(rows[b]["mean"]) if b in rows else None for b in baselines],
        mode="markers",
        legendgroup=mode,
        offsetgroup=mode,
        showlegend=False,
        marker={"color": MODE_COLORS[mode], "size": 11, "symbol": "x"},
        meta={"role": "baseline", **meta, "baselines": baselines},
        hovertemplate="%{x}, " + mode + "<br>MAP@R %{y:.2f} % (a single value, "
        "untrained)<extra></extra>",
    )


def _num(v: Any) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v
