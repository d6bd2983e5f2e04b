"""The retrieval view's 2-D map of a study's test embeddings (:func:`retrieval_map_figure`),
drawn from the :class:`~mlrc.report.snapshot.Retrieval` read by the caller."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlrc.report.figures.common import label, layout
from mlrc.report.snapshot import Retrieval

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["MAP_LEGEND_CLASSES", "MAP_METHODS", "retrieval_map_figure"]

MAP_LEGEND_CLASSES = 20  # the embedding map: one legend entry per class up to this many classes
MAP_METHODS = {"pca": "PCA", "umap": "UMAP", "tsne": "t-SNE"}


def retrieval_map_figure(view: Retrieval) -> go.Figure | None:
    """The stored 2-D map of the test embeddings, one colour per class (a legend entry per class
    up to :data:`MAP_LEGEND_CLASSES` classes, else one trace coloured by class without legend),
    the view's sample queries as black-edged stars. None without map points."""
    import plotly.graph_objects as go

    m = view.data.get("map") or {}
    xs, ys, labels = m.get("x") or [], m.get("y") or [], m.get("label") or []
    index = m.get("index") or [None] * len(xs)
    if not xs:
        return None
    classes = sorted(set(labels))
    names = _class_names(view)
    hover = [
        f"class {label(names.get(c, c))}<br>item {i}" for c, i in zip(labels, index, strict=True)
    ]
    fig = go.Figure()
    if len(classes) <= MAP_LEGEND_CLASSES:
        for trace in _class_traces(xs, ys, labels, classes, names, hover):
            fig.add_trace(trace)
    else:
        fig.add_trace(_points_trace(xs, ys, labels, classes, hover))
    queries = _queries_trace(view, xs, ys, index, hover)
    if queries is not None:
        fig.add_trace(queries)
    method = MAP_METHODS.get(m.get("method"), str(m.get("method")))
    return layout(
        fig,
        height=480,
        xaxis_title=f"{method} 1",
        yaxis_title=f"{method} 2",
        showlegend=True,
        legend={"itemsizing": "constant"},
    )


def _class_names(view: Retrieval) -> dict[Any, Any]:
    """Class label → its name, as the view's sample queries and their neighbours give them."""
    return {
        it["label"]: it.get("name", it["label"])
        for q in view.data.get("queries", [])
        for it in (q, *q.get("neighbours", []))
    }


def _class_traces(
    xs: list, ys: list, labels: list, classes: list, names: dict, hover: list[str]
) -> list[go.Scatter]:
    """One trace per class, each with its legend entry and colour."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    palette = qualitative.Dark24
    traces = []
    for n, c in enumerate(classes):
        pts = [j for j, lab in enumerate(labels) if lab == c]
        traces.append(
            go.Scatter(
                x=[xs[j] for j in pts],
                y=[ys[j] for j in pts],
                mode="markers",
                name=f"class {label(names.get(c, c))}",
                marker={"size": 6, "color": palette[n % len(palette)], "opacity": 0.8},
                text=[hover[j] for j in pts],
                hoverinfo="text",
                meta={"role": "class", "label": c},
            )
        )
    return traces


def _points_trace(xs: list, ys: list, labels: list, classes: list, hover: list[str]) -> go.Scatter:
    """Every point in one trace, coloured by class on a colour scale, without legend."""
    import plotly.graph_objects as go
    from plotly.colors import sample_colorscale

    rank = {c: n for n, c in enumerate(classes)}
    colours = sample_colorscale("Turbo", [rank[c] / max(len(classes) - 1, 1) for c in labels])
    return go.Scatter(
        x=xs,
        y=ys,
        mode="markers",
        name="test items",
        marker={"size": 5, "color": colours, "opacity": 0.8},
        text=hover,
        hoverinfo="text",
        showlegend=False,
        meta={"role": "points"},
    )


def _queries_trace(
    view: Retrieval, xs: list, ys: list, index: list, hover: list[str]
) -> go.Scatter | None:
    """The view's sample queries that are on the map, as black-edged stars (None: none)."""
    import plotly.graph_objects as go

    at = {i: j for j, i in enumerate(index) if i is not None}
    queries = [q for q in view.data.get("queries", []) if q["index"] in at]
    if not queries:
        return None
    return go.Scatter(
        x=[xs[at[q["index"]]] for q in queries],
        y=[ys[at[q["index"]]] for q in queries],
        mode="markers",
        name="sample queries",
        marker={
            "symbol": "star",
            "size": 14,
            "color": "white",
            "line": {"color": "black", "width": 1.5},
        },
        text=[f"query {n + 1}: {hover[at[q['index']]]}" for n, q in enumerate(queries)],
        hoverinfo="text",
        meta={"role": "queries"},
    )
