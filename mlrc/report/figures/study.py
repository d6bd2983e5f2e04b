"""A study's search as figures: the optimisation history (:func:`history_figure`) and the
per-fold validation curves of its trials (:func:`fold_curves_figure`), drawn from the
:class:`~mlrc.report.snapshot.StudyData` read by the caller."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mlrc.report.figures.common import label, layout
from mlrc.report.snapshot import FoldCurve, StudyData, TrialRow

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["MAX_VISIBLE_TRIALS", "fold_curves_figure", "history_figure"]

MAX_VISIBLE_TRIALS = 8  # fold curves: beyond this many trials only the best are drawn at first


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
