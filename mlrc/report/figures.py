"""The dashboard's Plotly figures: a study's optimisation history and per-fold validation curves,
the 2-D map of its best reproduction's test embeddings (retrieval view), the test results of the
selected studies, and Optuna's importance, slice and parallel-coordinate plots
(:class:`OptunaFigures`, read from Optuna's tables in the same store).

Every string from the store that goes into a label is escaped first (:func:`label`).
"""

from __future__ import annotations

import html
import math
import threading
import warnings
from typing import TYPE_CHECKING, Any

from mlrc import store
from mlrc.errors import first_line
from mlrc.report.snapshot import FoldCurve, Retrieval, StudyData, TrialRow
from mlrc.report.tables import ARCHIVED, SECTION, row_label, with_defaults
from mlrc.store.optuna_tables import has_optuna_tables

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    import plotly.graph_objects as go
    from sqlalchemy.engine import Engine

__all__ = [
    "MAP_LEGEND_CLASSES",
    "MAX_VISIBLE_TRIALS",
    "MODE_COLORS",
    "MODE_LABELS",
    "OptunaFigures",
    "fold_curves_figure",
    "history_figure",
    "label",
    "layout",
    "retrieval_map_figure",
    "test_figure",
]

MODE_LABELS = {"separated": "separated (128-D)", "concatenated": "concatenated (512-D)"}
MODE_COLORS = {"separated": "#4C78A8", "concatenated": "#F58518"}
MAX_VISIBLE_TRIALS = 8  # fold curves: beyond this many trials only the best are drawn at first
OPTUNA_KINDS = ("importance", "slice", "parallel")
MAP_LEGEND_CLASSES = 20  # the embedding map: one legend entry per class up to this many classes
MAP_METHODS = {"pca": "PCA", "umap": "UMAP", "tsne": "t-SNE"}


def label(value: Any) -> str:
    """A store string inside a Plotly label: Plotly renders a subset of HTML in labels, so
    escape it (Plotly turns the entities back into the literal characters)."""
    return html.escape(str(value), quote=False)


def layout(
    fig: go.Figure, height: int = 380, template: str | None = "plotly_white", **kw: Any
) -> go.Figure:
    """Common layout. Optuna's figures keep their own template (``template=None``): their
    colour scales start at white, which only shows on Plotly's default grey background."""
    if template:
        fig.update_layout(template=template)
    fig.update_layout(
        height=height,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        title=None,
        **kw,
    )
    return fig


# --- optimisation history ----------------------------------------------------------------------


def history_figure(study: StudyData) -> go.Figure | None:
    """Complete trials' val MAP@R (± SEM over folds) by trial number and the best so far; trials
    scored 0 for a non-finite loss as crosses; failed, pruned and running trials as dotted
    lines. None without a complete trial."""
    import plotly.graph_objects as go

    done = [t for t in study.trials if t.state == "complete" and t.value is not None]
    if not done:
        return None
    best = _best_so_far(done)
    fig = go.Figure()
    fig.add_trace(_trials_trace([t for t in done if not t.nonfinite], study.value_label))
    fig.add_trace(_best_trace(done, best))
    zeros = [t for t in done if t.nonfinite]
    if zeros:
        fig.add_trace(_zeros_trace(zeros))
    last = max(t.number for t in study.trials)
    if last > done[-1].number:  # the best so far holds up to the latest trial
        fig.data[1].x = (*fig.data[1].x, last)
        fig.data[1].y = (*fig.data[1].y, best[-1])
    _mark_unfinished(fig, study.trials)
    return layout(
        fig,
        xaxis_title="trial",
        yaxis_title=f"{study.value_label} (mean over folds)",
        legend={"orientation": "h", "y": 1.08},
        xaxis={"dtick": 1} if len(study.trials) <= 20 else {},
    )


def _best_so_far(done: list[TrialRow]) -> list[float]:
    """The running maximum of the complete trials' values."""
    best, running = [], -math.inf
    for t in done:
        running = max(running, t.value)
        best.append(running)
    return best


def _trials_trace(scored: list[TrialRow], label: str = "val MAP@R") -> go.Scatter:
    import plotly.graph_objects as go

    return go.Scatter(
        x=[t.number for t in scored],
        y=[t.value for t in scored],
        error_y={"type": "data", "array": [t.sem or 0.0 for t in scored], "visible": True},
        mode="markers",
        name="trial (mean ± SEM over folds)",
        marker={"size": 9, "color": "#4C78A8"},
        meta={"role": "trials"},
        hovertemplate=f"trial %{{x}}<br>{label} %{{y:.4f}} ± %{{error_y.array:.4f}}<extra></extra>",
    )


def _best_trace(done: list[TrialRow], best: list[float]) -> go.Scatter:
    import plotly.graph_objects as go

    return go.Scatter(
        x=[t.number for t in done],
        y=best,
        mode="lines",
        line={"shape": "hv", "color": "#E45756", "width": 2},
        name="best so far",
        meta={"role": "best"},
        hovertemplate="best after trial %{x}: %{y:.4f}<extra></extra>",
    )


def _zeros_trace(zeros: list[TrialRow]) -> go.Scatter:
    import plotly.graph_objects as go

    return go.Scatter(
        x=[t.number for t in zeros],
        y=[t.value for t in zeros],
        mode="markers",
        name="scored 0: non-finite loss or embeddings",
        marker={"size": 11, "color": "#1F2933", "symbol": "x"},
        customdata=[[label(t.reason or "")] for t in zeros],
        meta={"role": "nonfinite"},
        hovertemplate="trial %{x}: scored %{y:.4f}<br>%{customdata[0]}<extra></extra>",
    )


def _mark_unfinished(fig: go.Figure, trials: list[TrialRow]) -> None:
    """A dotted vertical line for each failed, pruned or running trial."""
    for t in trials:
        if t.state in ("failed", "pruned", "running"):
            fig.add_vline(
                x=t.number,
                line={"dash": "dot", "color": "#999", "width": 1},
                annotation_text=f"{t.state}",
                annotation_font_size=10,
            )


# --- validation curves per fold ----------------------------------------------------------------


def fold_curves_figure(study: StudyData) -> go.Figure | None:
    """Validation MAP@R by epoch, one panel per fold, one line per trial; stars = best epoch.
    None without a validated epoch."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    curves = [c for c in study.curves if c.epochs]
    if not curves:
        return None
    folds = sorted({c.fold for c in curves})
    fig = make_subplots(
        rows=1,
        cols=len(folds),
        shared_yaxes=True,
        subplot_titles=[f"fold {f}" for f in folds],
        horizontal_spacing=0.03,
    )
    trials = sorted({c.trial for c in curves}, key=lambda n: (n is None, n if n is not None else 0))
    shown = _shown_trials(study.trials, trials, curves)
    palette = qualitative.Dark24
    legend_done: set[Any] = set()
    for c in sorted(curves, key=lambda c: (c.fold, c.trial if c.trial is not None else -1)):
        name = f"trial {c.trial}" if c.trial is not None else f"params {c.params_hash[:8]}"
        style = {
            "color": palette[trials.index(c.trial) % len(palette)],
            "visible": True if c.trial in shown else "legendonly",
        }
        col = folds.index(c.fold) + 1
        label = study.curve_label
        fig.add_trace(
            _curve_trace(c, name, name not in legend_done, label=label, **style), row=1, col=col
        )
        legend_done.add(name)
        if c.best_epoch is not None and c.best_epoch in c.epochs:
            fig.add_trace(_best_epoch_trace(c, name, label=label, **style), row=1, col=col)
    last = max(c.epochs[-1] for c in curves)
    fig.update_xaxes(title_text="epoch", **({"dtick": 1} if last <= 20 else {}))
    fig.update_yaxes(title_text=study.curve_label, row=1, col=1)
    return layout(fig, height=400, legend={"title": {"text": "★ best epoch"}})


def _shown_trials(
    rows: list[TrialRow], trials: list[int | None], curves: list[FoldCurve]
) -> set[int | None]:
    """The trials drawn at first: all of them up to :data:`MAX_VISIBLE_TRIALS`, else the five
    best; running ones always."""
    values = {t.number: t.value for t in rows}
    ranked = sorted((n for n in trials if values.get(n) is not None), key=lambda n: -values[n])
    shown = set(trials) if len(trials) <= MAX_VISIBLE_TRIALS else set(ranked[:5])
    return shown | {c.trial for c in curves if c.status == "running"}


def _curve_trace(
    c: FoldCurve,
    name: str,
    showlegend: bool,
    color: str,
    visible: bool | str,
    label: str = "val MAP@R",
) -> go.Scatter:
    """One fold run's validation MAP@R by epoch (dashed while it runs)."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=c.epochs,
        y=c.map_at_r,
        mode="lines+markers",
        name=name,
        legendgroup=name,
        showlegend=showlegend,
        visible=visible,
        line={"color": color, "dash": "dash" if c.status == "running" else "solid"},
        marker={"size": 5},
        customdata=[[v if v is not None else math.nan] for v in c.train_loss],
        meta={"role": "curve", "trial": c.trial, "fold": c.fold, "id": c.fold_run_id},
        hovertemplate=f"{name}, fold {c.fold}<br>epoch %{{x}}: {label} %{{y:.4f}}"
        "<br>train loss %{customdata[0]:.4f}<extra></extra>",
    )


def _best_epoch_trace(
    c: FoldCurve, name: str, color: str, visible: bool | str, label: str = "val MAP@R"
) -> go.Scatter:
    """A star on the fold run's best (early-stopping) epoch."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[c.best_epoch],
        y=[c.map_at_r[c.epochs.index(c.best_epoch)]],
        mode="markers",
        name=f"{name} best epoch",
        legendgroup=name,
        showlegend=False,
        visible=visible,
        marker={"symbol": "star", "size": 14, "color": color, "line": {"width": 1}},
        meta={"role": "best_epoch", "trial": c.trial, "fold": c.fold},
        hovertemplate=f"{name}, fold {c.fold}: best epoch %{{x}}, {label} "
        f"%{{y:.4f}} (stopped after epoch {c.epochs[-1]})<extra></extra>",
    )


# --- retrieval view: the embedding map ---------------------------------------------------------


def retrieval_map_figure(view: Retrieval) -> go.Figure | None:
    """The stored 2-D map of the test embeddings, one colour per class (a legend entry per class
    up to :data:`MAP_LEGEND_CLASSES` classes, else one trace coloured by class without legend),
    the view's sample queries as black-edged stars. None without map points."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative, sample_colorscale

    m = view.data.get("map") or {}
    xs, ys, labels = m.get("x") or [], m.get("y") or [], m.get("label") or []
    index = m.get("index") or [None] * len(xs)
    if not xs:
        return None
    classes = sorted(set(labels))
    names = {
        it["label"]: it.get("name", it["label"])
        for q in view.data.get("queries", [])
        for it in (q, *q.get("neighbours", []))
    }
    hover = [
        f"class {label(names.get(c, c))}<br>item {i}" for c, i in zip(labels, index, strict=True)
    ]
    fig = go.Figure()
    if len(classes) <= MAP_LEGEND_CLASSES:
        palette = qualitative.Dark24
        for n, c in enumerate(classes):
            pts = [j for j, lab in enumerate(labels) if lab == c]
            fig.add_trace(
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
    else:
        rank = {c: n for n, c in enumerate(classes)}
        colours = sample_colorscale("Turbo", [rank[c] / max(len(classes) - 1, 1) for c in labels])
        fig.add_trace(
            go.Scatter(
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
        )
    at = {i: j for j, i in enumerate(index) if i is not None}
    queries = [q for q in view.data.get("queries", []) if q["index"] in at]
    if queries:
        fig.add_trace(
            go.Scatter(
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
        )
    method = MAP_METHODS.get(m.get("method"), str(m.get("method")))
    return layout(
        fig,
        height=480,
        xaxis_title=f"{method} 1",
        yaxis_title=f"{method} 2",
        showlegend=True,
        legend={"itemsizing": "constant"},
    )


# --- test results ------------------------------------------------------------------------------


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
    for col, (dataset, protocol) in enumerate(blocks, start=1):
        block = data[(data["dataset"] == dataset) & (data["protocol"] == protocol)]
        _add_test_block(fig, block, col, {"dataset": dataset, "protocol": protocol})
    fig.update_yaxes(title_text="test MAP@R (%)", row=1, col=1)
    return layout(
        fig, height=420, scattermode="group", scattergap=0.6, legend={"orientation": "h", "y": 1.12}
    )


def _add_test_block(fig: go.Figure, block: pd.DataFrame, col: int, where: dict[str, str]) -> None:
    """One panel: the block's baselines, then its studies, each mode as a dot with whiskers."""
    base = block[block["baseline"]]
    d = block[~block["baseline"]]
    baselines = list(dict.fromkeys(base["study"]))
    studies = list(dict.fromkeys(d["study"]))
    labels = _study_labels(d, studies)
    for mode in ("separated", "concatenated"):
        meta = {**where, "mode": mode}
        fig.add_trace(_test_trace(d, studies, labels, mode, col, meta), row=1, col=col)
        if baselines:
            fig.add_trace(_baseline_trace(base, baselines, mode, meta), row=1, col=col)
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
        name=MODE_LABELS[mode],
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
        name=f"untrained, {MODE_LABELS[mode]}",
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


# --- Optuna's figures --------------------------------------------------------------------------


class OptunaFigures:
    """Importance, slice and parallel-coordinate figures from Optuna's tables, cached by the
    study's trials (the live server does not recompute fANOVA while nothing changed)."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url, self.engine = url, engine
        self._storage = None
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _open(self) -> Any:
        if self._storage is None:
            if not has_optuna_tables(self.engine):
                return None
            # read-only: never create Optuna's tables from a dashboard
            self._storage = store.optuna_storage(self.url, skip_table_creation=True)
        return self._storage

    def figures(self, name: str) -> dict[str, tuple[Any, str | None]]:
        """kind → (figure or None, note when there is no figure)."""
        import optuna
        from optuna.trial import TrialState

        try:
            storage = self._open()
            if storage is None:
                return dict.fromkeys(OPTUNA_KINDS, (None, "no Optuna tables in this store"))
            ostudy = optuna.load_study(study_name=name, storage=storage)
            trials = ostudy.get_trials(deepcopy=False)
        except KeyError:
            return dict.fromkeys(
                OPTUNA_KINDS, (None, f"no Optuna study named {name} in this store")
            )
        except Exception as e:  # e.g. Optuna's tables written by another Optuna version
            note = f"Optuna's tables cannot be read ({first_line(e)})"
            return dict.fromkeys(OPTUNA_KINDS, (None, note))
        key = (name, tuple((t.number, t.state, tuple(t.values or ())) for t in trials))
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        out = self._compute(ostudy, [t for t in trials if t.state == TrialState.COMPLETE])
        with self._lock:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = out
        return out

    def _compute(
        self, ostudy: optuna.Study, done: list[optuna.trial.FrozenTrial]
    ) -> dict[str, tuple[Any, str | None]]:
        """The three figures of a study whose complete trials are ``done`` (or notes why not)."""
        params = sorted({p for t in done for p in t.params})
        if not done:
            return dict.fromkeys(OPTUNA_KINDS, (None, "needs ≥ 1 complete trial (0 so far)"))
        if not params:
            return dict.fromkeys(OPTUNA_KINDS, (None, "no searched hyperparameters"))
        out: dict[str, tuple[Any, str | None]] = {}
        if len(done) < 2:
            out["importance"] = (None, f"needs ≥ 2 complete trials ({len(done)} so far)")
        else:
            out["importance"] = self._plot("importance", ostudy)
        out["slice"] = self._plot("slice", ostudy)
        out["parallel"] = self._plot("parallel", ostudy)
        return out

    @staticmethod
    def _plot(kind: str, ostudy: optuna.Study) -> tuple[Any, str | None]:
        import optuna
        from optuna import visualization as ov

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if kind == "importance":
                    from optuna.importance import FanovaImportanceEvaluator

                    fig = ov.plot_param_importances(
                        ostudy, evaluator=FanovaImportanceEvaluator(seed=0)
                    )
                    height = max(240, 90 + 40 * len(fig.data[0].y))
                    return layout(fig, height=height, template=None), None
                if kind == "slice":
                    fig = _visible_lines(ov.plot_slice(ostudy))
                    return layout(fig, height=360, template=None), None
                fig = _visible_lines(ov.plot_parallel_coordinate(ostudy))
                return layout(fig, height=380, template=None), None
        except ImportError as e:
            return None, f"needs the package {e.name or e} ({kind})"
        except (ValueError, RuntimeError, ZeroDivisionError, optuna.exceptions.OptunaError) as e:
            return None, f"not available: {first_line(e)}"


def _visible_lines(fig: go.Figure) -> go.Figure:
    """Optuna colours trials on a scale that starts at white (the slice plot's markers by trial
    number, the parallel coordinates' lines by objective, on a white background there): the
    first or worst trial is invisible. Use the same scale from 35 % on. A parallel-coordinate
    line's first point is its objective normalised to [0, 1] (the first axis), so its colour is
    recomputed from it. A figure of another shape is returned unchanged."""
    from plotly.colors import sample_colorscale

    scaled = [t for t in fig.data if t.marker is not None and t.marker.colorscale]
    lines = [t for t in fig.data if t.mode == "lines" and t.y is not None and len(t.y)]
    try:
        scales = []
        for t in scaled:
            old = [[float(p), c] for p, c in t.marker.colorscale]
            points = sample_colorscale(old, [0.35 + 0.65 * i / 8 for i in range(9)])
            scales.append([[i / 8, c] for i, c in enumerate(points)])
        colours = []
        if len(scaled) == 1 and lines:  # parallel coordinates: explicit colours per line
            flip = bool(scaled[0].marker.reversescale)
            for t in lines:
                u = min(max(float(t.y[0]), 0.0), 1.0)
                colours.append(sample_colorscale(scales[0], [1.0 - u if flip else u])[0])
    except (TypeError, ValueError, IndexError):
        return fig
    for t, scale in zip(scaled, scales, strict=True):
        t.marker.colorscale = scale
    for t, colour in zip(lines if colours else [], colours, strict=True):
        t.line.color = colour
    return fig
