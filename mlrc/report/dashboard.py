"""Plotly dashboards of the store: one self-contained HTML file, or the same page served live.

Everything shown is read from the store only — mlrc's tables (``mlrc_trial``, ``mlrc_fold_run``,
``mlrc_epoch_metric``, ``mlrc_test_result``, ``mlrc_campaign_study``) and Optuna's tables in the
same database (hyperparameter importance, slice and parallel-coordinate plots). Per study:

- optimisation history: each complete trial's mean validation MAP@R over its folds ± SEM, the
  best-so-far line, failed, pruned and running trials as dotted vertical lines; trials scored 0
  because their loss or embeddings went non-finite (complete, value 0, as in the reference
  harness) as black crosses with their reason;
- hyperparameter importance (Optuna's fANOVA, seeded; needs ≥ 2 complete trials);
- slice and parallel-coordinate plots (Optuna);
- per-fold validation MAP@R curves of the search folds, each fold's best (early-stopping) epoch
  marked with a star;
- the trial table: state, value ± SEM, parameters, folds done, best epochs, failure reasons
  (a trial scored 0 for a non-finite loss is flagged, with its reason).

Per campaign (``--campaign``), or else for every selected study with test results: test MAP@R
(%) with 95% t-interval error bars per loss and dataset, separated (128-D) vs concatenated
(512-D), from :func:`mlrc.report.tables.collect`/:func:`~mlrc.report.tables.summarize`, and the
table of all three metrics. As in the report, a dataset whose studies ran under several protocols
(:func:`mlrc.report.tables.protocol_of`) gets one panel and one table per protocol, and each
starts with the untrained baseline ("Pretrained" or "Random init", a single value, crosses in the
figure) of its studies.

Every string read from the store is HTML-escaped, in the page and in the figures' labels.
``mlrc dashboard build`` inlines plotly.js once (the file works offline); ``mlrc dashboard
serve`` re-reads the store on every request and reloads the page every ``--refresh`` seconds.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
import math
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import typer

from mlrc.errors import first_line

log = logging.getLogger("mlrc")

MODE_LABELS = {"separated": "separated (128-D)", "concatenated": "concatenated (512-D)"}
MODE_COLORS = {"separated": "#4C78A8", "concatenated": "#F58518"}
TRIAL_STATES = ("complete", "running", "failed", "interrupted", "pruned")
MAX_VISIBLE_TRIALS = 8  # fold curves: beyond this many trials only the best are drawn at first
PLOTLY_JS_PATH = "/plotly.min.js"
FIGURE_CONFIG = {"displaylogo": False, "responsive": True}


def esc(value: Any) -> str:
    """HTML-escape anything from the store (quotes too: values also go into attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(v: float | None, digits: int = 4) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _fmt_param(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# --- reading the store -------------------------------------------------------------------------


@dataclass
class TrialRow:
    number: int
    state: str
    value: float | None
    sem: float | None
    params: dict
    params_hash: str
    reason: str | None

    @property
    def nonfinite(self) -> bool:
        """Complete but scored 0: its loss or embeddings went non-finite (``reason`` says so)."""
        from mlrc.report.tables import is_nonfinite

        return is_nonfinite(self.state, self.reason)


@dataclass
class FoldCurve:
    """One search fold run: its validation MAP@R per epoch and its best (early-stop) epoch."""

    fold_run_id: int
    fold: int
    trial: int | None  # the trial that (last) ran it
    params_hash: str
    status: str
    best_epoch: int | None
    best_map_at_r: float | None
    epochs: list[int] = field(default_factory=list)
    map_at_r: list[float] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)


@dataclass
class StudyData:
    name: str
    dataset: str
    loss: str
    strategy: str | None
    preset: str
    created: dt.datetime | None
    code_version: str
    budget: int | None
    campaigns: list[str]
    trials: list[TrialRow]
    curves: list[FoldCurve]
    reproductions: int


@dataclass
class Snapshot:
    """What one page shows, read in one go from the store."""

    where: str  # the store's URL without password
    scope: str  # "all studies", "campaign X, study a"
    campaigns: list[str]  # the selected campaigns
    studies: list[StudyData]
    summary: Any  # pandas DataFrame from mlrc.report.tables.summarize (test results)
    all_campaigns: list[str]  # every campaign in the store (links of the live page)
    read_at: dt.datetime


def open_store(url: str):
    """The store's engine. Unlike the other commands the dashboard never creates a database:
    a SQLite URL naming a missing file is an error (a typo would show an empty store)."""
    from mlrc import store

    return store.connect(url, read_only=True)


def read(engine, studies: list[str] | None = None, campaigns: list[str] | None = None) -> Snapshot:
    """Read the selected studies, in the order of the report's tables
    (:func:`mlrc.report.tables.select_studies`: each campaign's studies by position, then the
    named studies; with neither, every study). Unknown names raise ``ReportError``."""
    from sqlalchemy import func, select

    from mlrc import store
    from mlrc.report.tables import collect, select_studies, summarize
    from mlrc.store import CampaignStudy, EpochMetric, FoldRun, Study, TestResult, Trial

    names = select_studies(engine, studies, campaigns)
    parts = [f"campaign {c}" for c in dict.fromkeys(campaigns or [])]
    parts += [f"study {n}" for n in dict.fromkeys(studies or [])]
    scope = ", ".join(parts) or "all studies"
    with store.session(engine) as s:
        members = s.execute(
            select(CampaignStudy).order_by(CampaignStudy.campaign, CampaignStudy.position)
        ).scalars()
        in_campaigns: dict[int, list[str]] = {}
        for m in members:
            in_campaigns.setdefault(m.study_id, []).append(m.campaign)
        all_campaigns = sorted({c for cs in in_campaigns.values() for c in cs})
        found = {
            st.name: st for st in s.execute(select(Study).where(Study.name.in_(names))).scalars()
        }
        rows = [found[n] for n in names if n in found]
        ids = [st.id for st in rows]
        trials: dict[int, list[TrialRow]] = {i: [] for i in ids}
        for t in s.execute(
            select(Trial).where(Trial.study_id.in_(ids)).order_by(Trial.study_id, Trial.number)
        ).scalars():
            trials[t.study_id].append(
                TrialRow(t.number, t.state, t.value, t.sem, t.params or {}, t.params_hash, t.reason)
            )
        curves: dict[int, dict[int, FoldCurve]] = {i: {} for i in ids}
        for f in s.execute(
            select(FoldRun)
            .where(FoldRun.study_id.in_(ids), FoldRun.kind == "search")
            .order_by(FoldRun.study_id, FoldRun.id)
        ).scalars():
            curves[f.study_id][f.id] = FoldCurve(
                f.id,
                f.fold,
                f.trial_number,
                f.params_hash,
                f.status,
                f.best_epoch,
                f.map_at_r,
            )
        for study_id, e in s.execute(
            select(FoldRun.study_id, EpochMetric)
            .join(EpochMetric, EpochMetric.fold_run_id == FoldRun.id)
            .where(FoldRun.study_id.in_(ids), FoldRun.kind == "search")
            .order_by(EpochMetric.fold_run_id, EpochMetric.epoch)
        ).all():
            c = curves[study_id][e.fold_run_id]
            c.epochs.append(e.epoch)
            c.map_at_r.append(e.map_at_r)
            c.train_loss.append(e.train_loss)
        reps = dict(
            s.execute(
                select(TestResult.study_id, func.count(func.distinct(TestResult.reproduction)))
                .where(TestResult.study_id.in_(ids), TestResult.fold == -1)
                .group_by(TestResult.study_id)
            ).all()
        )
        data = [
            StudyData(
                st.name,
                st.dataset,
                st.loss,
                st.strategy,
                st.preset,
                st.created,
                st.code_version,
                _budget(st.config),
                in_campaigns.get(st.id, []),
                _with_trial_numbers(trials[st.id], list(curves[st.id].values())),
                list(curves[st.id].values()),
                reps.get(st.id, 0),
            )
            for st in rows
        ]
    summary = summarize(collect(engine, studies, campaigns))
    summary = summary[summary["study"].isin([st.name for st in data]) | summary["baseline"]]
    return Snapshot(
        store.redact(str(engine.url)),
        scope,
        list(dict.fromkeys(campaigns or [])),
        data,
        summary,
        all_campaigns,
        dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None),
    )


def _with_trial_numbers(trials: list[TrialRow], curves: list[FoldCurve]) -> list[TrialRow]:
    """Fold runs written without a trial number get the latest trial with their parameters."""
    by_hash = {t.params_hash: t.number for t in trials}
    for c in curves:
        if c.trial is None:
            c.trial = by_hash.get(c.params_hash)
    return trials


def _budget(config: dict | None) -> int | None:
    try:
        return (
            config["study"]["search"].get("trials") or config["preset"]["search"]["trials"]
        ) or None
    except (KeyError, TypeError, AttributeError):
        return None


# --- figures -----------------------------------------------------------------------------------


def _label(value: Any) -> str:
    """A store string inside a Plotly label: Plotly renders a subset of HTML in labels, so
    escape it (Plotly turns the entities back into the literal characters)."""
    return html.escape(str(value), quote=False)


def _layout(fig, height: int = 380, template: str | None = "plotly_white", **kw: Any):
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


def history_figure(study: StudyData):
    """Complete trials' val MAP@R (± SEM over folds) by trial number and the best so far."""
    import plotly.graph_objects as go

    done = [t for t in study.trials if t.state == "complete" and t.value is not None]
    if not done:
        return None
    best, running = [], -math.inf
    for t in done:
        running = max(running, t.value)
        best.append(running)
    scored = [t for t in done if not t.nonfinite]
    zeros = [t for t in done if t.nonfinite]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[t.number for t in scored],
            y=[t.value for t in scored],
            error_y={"type": "data", "array": [t.sem or 0.0 for t in scored], "visible": True},
            mode="markers",
            name="trial (mean ± SEM over folds)",
            marker={"size": 9, "color": "#4C78A8"},
            meta={"role": "trials"},
            hovertemplate="trial %{x}<br>val MAP@R %{y:.4f} ± %{error_y.array:.4f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[t.number for t in done],
            y=best,
            mode="lines",
            line={"shape": "hv", "color": "#E45756", "width": 2},
            name="best so far",
            meta={"role": "best"},
            hovertemplate="best after trial %{x}: %{y:.4f}<extra></extra>",
        )
    )
    if zeros:
        fig.add_trace(
            go.Scatter(
                x=[t.number for t in zeros],
                y=[t.value for t in zeros],
                mode="markers",
                name="scored 0: non-finite loss or embeddings",
                marker={"size": 11, "color": "#1F2933", "symbol": "x"},
                customdata=[[_label(t.reason or "")] for t in zeros],
                meta={"role": "nonfinite"},
                hovertemplate="trial %{x}: scored %{y:.4f}<br>%{customdata[0]}<extra></extra>",
            )
        )
    last = max(t.number for t in study.trials)
    if last > done[-1].number:  # the best so far holds up to the latest trial
        fig.data[1].x = (*fig.data[1].x, last)
        fig.data[1].y = (*fig.data[1].y, best[-1])
    for t in study.trials:
        if t.state in ("failed", "pruned", "running"):
            fig.add_vline(
                x=t.number,
                line={"dash": "dot", "color": "#999", "width": 1},
                annotation_text=f"{t.state}",
                annotation_font_size=10,
            )
    return _layout(
        fig,
        xaxis_title="trial",
        yaxis_title="val MAP@R (mean over folds)",
        legend={"orientation": "h", "y": 1.08},
        xaxis={"dtick": 1} if len(study.trials) <= 20 else {},
    )


def fold_curves_figure(study: StudyData):
    """Validation MAP@R by epoch, one panel per fold, one line per trial; stars = best epoch."""
    import plotly.graph_objects as go
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
    values = {t.number: t.value for t in study.trials}
    trials = sorted({c.trial for c in curves}, key=lambda n: (n is None, n if n is not None else 0))
    ranked = sorted((n for n in trials if values.get(n) is not None), key=lambda n: -values[n])
    shown = set(trials) if len(trials) <= MAX_VISIBLE_TRIALS else set(ranked[:5])
    shown |= {c.trial for c in curves if c.status == "running"}
    palette = qualitative.Dark24
    legend_done: set[Any] = set()
    for c in sorted(curves, key=lambda c: (c.fold, c.trial if c.trial is not None else -1)):
        col = folds.index(c.fold) + 1
        name = f"trial {c.trial}" if c.trial is not None else f"params {c.params_hash[:8]}"
        color = palette[trials.index(c.trial) % len(palette)]
        visible = True if c.trial in shown else "legendonly"
        fig.add_trace(
            go.Scatter(
                x=c.epochs,
                y=c.map_at_r,
                mode="lines+markers",
                name=name,
                legendgroup=name,
                showlegend=name not in legend_done,
                visible=visible,
                line={"color": color, "dash": "dash" if c.status == "running" else "solid"},
                marker={"size": 5},
                customdata=[[v if v is not None else math.nan] for v in c.train_loss],
                meta={"role": "curve", "trial": c.trial, "fold": c.fold, "id": c.fold_run_id},
                hovertemplate=f"{name}, fold {c.fold}<br>epoch %{{x}}: val MAP@R %{{y:.4f}}"
                "<br>train loss %{customdata[0]:.4f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        legend_done.add(name)
        if c.best_epoch is not None and c.best_epoch in c.epochs:
            y = c.map_at_r[c.epochs.index(c.best_epoch)]
            fig.add_trace(
                go.Scatter(
                    x=[c.best_epoch],
                    y=[y],
                    mode="markers",
                    name=f"{name} best epoch",
                    legendgroup=name,
                    showlegend=False,
                    visible=visible,
                    marker={"symbol": "star", "size": 14, "color": color, "line": {"width": 1}},
                    meta={"role": "best_epoch", "trial": c.trial, "fold": c.fold},
                    hovertemplate=f"{name}, fold {c.fold}: best epoch %{{x}}, val MAP@R "
                    f"%{{y:.4f}} (stopped after epoch {c.epochs[-1]})<extra></extra>",
                ),
                row=1,
                col=col,
            )
    last = max(c.epochs[-1] for c in curves)
    fig.update_xaxes(title_text="epoch", **({"dtick": 1} if last <= 20 else {}))
    fig.update_yaxes(title_text="val MAP@R", row=1, col=1)
    return _layout(fig, height=400, legend={"title": {"text": "★ best epoch"}})


def test_figure(summary):
    """Test MAP@R (%) ± 95% CI half-width per study, one panel per dataset (per dataset and
    protocol when a dataset has several, as the report's blocks), separated vs concatenated (dot
    and whisker: the interval is the point, not the bar's area). A block's untrained baseline
    comes first, as a cross without an interval."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from mlrc.report.tables import row_label, with_defaults

    data = with_defaults(summary[summary["metric"] == "map_at_r"])
    if data.empty:
        return None
    blocks = list(dict.fromkeys(zip(data["dataset"], data["protocol"], strict=True)))
    split = {d for d, _ in blocks if sum(d == e for e, _ in blocks) > 1}
    fig = make_subplots(
        rows=1,
        cols=len(blocks),
        subplot_titles=[_label(f"{d} · {p}" if d in split else d) for d, p in blocks],
        horizontal_spacing=0.06,
    )
    for col, (dataset, protocol) in enumerate(blocks, start=1):
        block = data[(data["dataset"] == dataset) & (data["protocol"] == protocol)]
        base = block[block["baseline"]]
        d = block[~block["baseline"]]
        baselines = list(dict.fromkeys(base["study"]))
        studies = list(dict.fromkeys(d["study"]))
        labels = [row_label(*d[d["study"] == st][["loss", "strategy"]].iloc[0]) for st in studies]
        labels = [  # as in the report's tables: a label shared by two studies gets their names
            _label(lab if labels.count(lab) == 1 else f"{lab} ({st})")
            for lab, st in zip(labels, studies, strict=True)
        ]
        order = [_label(b) for b in baselines] + labels
        for mode in ("separated", "concatenated"):
            rows = {r["study"]: r for _, r in d[d["mode"] == mode].iterrows()}
            mean = [_num(rows[s]["mean"]) if s in rows else None for s in studies]
            hw = [_num(rows[s]["half_width"]) if s in rows else None for s in studies]
            n = [int(rows[s]["n"]) if s in rows else 0 for s in studies]
            meta = {"dataset": dataset, "protocol": protocol, "mode": mode}
            fig.add_trace(
                go.Scatter(
                    x=labels,
                    y=mean,
                    mode="markers",
                    error_y={"type": "data", "array": hw, "visible": True, "thickness": 2},
                    name=MODE_LABELS[mode],
                    legendgroup=mode,
                    offsetgroup=mode,
                    showlegend=col == 1,
                    marker={"color": MODE_COLORS[mode], "size": 11, "symbol": "diamond"},
                    customdata=[[k] for k in n],
                    meta={"role": "test", **meta, "studies": studies},
                    hovertemplate="%{x}, "
                    + mode
                    + "<br>MAP@R %{y:.2f} ± %{error_y.array:.2f} % (n = %{customdata[0]})"
                    "<extra></extra>",
                ),
                row=1,
                col=col,
            )
            if baselines:
                rows = {r["study"]: r for _, r in base[base["mode"] == mode].iterrows()}
                fig.add_trace(
                    go.Scatter(
                        x=[_label(b) for b in baselines],
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
                    ),
                    row=1,
                    col=col,
                )
        fig.update_xaxes(categoryorder="array", categoryarray=order, row=1, col=col)
    fig.update_yaxes(title_text="test MAP@R (%)", row=1, col=1)
    return _layout(
        fig, height=420, scattermode="group", scattergap=0.6, legend={"orientation": "h", "y": 1.12}
    )


def _num(v: Any) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


class OptunaFigures:
    """Importance, slice and parallel-coordinate figures from Optuna's tables, cached by the
    study's trials (the live server does not recompute fANOVA while nothing changed)."""

    def __init__(self, url: str, engine) -> None:
        self.url, self.engine = url, engine
        self._storage = None
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _open(self):
        from sqlalchemy import inspect

        from mlrc import store

        if self._storage is None:
            with self.engine.connect() as conn:
                if not inspect(conn).has_table("studies"):
                    return None
            # read-only: never create Optuna's tables from a dashboard
            self._storage = store.optuna_storage(self.url, skip_table_creation=True)
        return self._storage

    def figures(self, name: str) -> dict[str, tuple[Any, str | None]]:
        """kind → (figure or None, note when there is no figure)."""
        import optuna
        from optuna.trial import TrialState

        kinds = ("importance", "slice", "parallel")
        try:
            storage = self._open()
            if storage is None:
                return dict.fromkeys(kinds, (None, "no Optuna tables in this store"))
            ostudy = optuna.load_study(study_name=name, storage=storage)
            trials = ostudy.get_trials(deepcopy=False)
        except KeyError:
            return dict.fromkeys(kinds, (None, f"no Optuna study named {name} in this store"))
        except Exception as e:  # e.g. Optuna's tables written by another Optuna version
            return dict.fromkeys(kinds, (None, f"Optuna's tables cannot be read ({first_line(e)})"))
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        key = (name, tuple((t.number, t.state, tuple(t.values or ())) for t in trials))
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        out: dict[str, tuple[Any, str | None]] = {}
        params = sorted({p for t in done for p in t.params})
        if not done:
            out = dict.fromkeys(kinds, (None, "needs ≥ 1 complete trial (0 so far)"))
        elif not params:
            out = dict.fromkeys(kinds, (None, "no searched hyperparameters"))
        else:
            if len(done) < 2:
                out["importance"] = (None, f"needs ≥ 2 complete trials ({len(done)} so far)")
            else:
                out["importance"] = self._plot("importance", ostudy)
            out["slice"] = self._plot("slice", ostudy)
            out["parallel"] = self._plot("parallel", ostudy)
        with self._lock:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = out
        return out

    @staticmethod
    def _plot(kind: str, ostudy) -> tuple[Any, str | None]:
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
                    return _layout(fig, height=height, template=None), None
                if kind == "slice":
                    fig = _visible_lines(ov.plot_slice(ostudy))
                    return _layout(fig, height=360, template=None), None
                fig = _visible_lines(ov.plot_parallel_coordinate(ostudy))
                return _layout(fig, height=380, template=None), None
        except ImportError as e:
            return None, f"needs the package {e.name or e} ({kind})"
        except (ValueError, RuntimeError, ZeroDivisionError, optuna.exceptions.OptunaError) as e:
            return None, f"not available: {first_line(e)}"


def _visible_lines(fig):
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


# --- HTML --------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2933;
background:#f6f7f9}
header{background:#1f2933;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .meta{color:#cbd2d9;font-size:13px;margin-top:4px}header a{color:#9fd3ff}
main{max-width:1500px;margin:0 auto;padding:12px 24px 40px}
nav{font-size:14px;margin:8px 0 4px}nav a{margin-right:12px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:12px 18px;margin:16px 0}
h2{font-size:18px;margin:4px 0 8px}h3{font-size:15px;margin:14px 0 4px}
.facts{font-size:13px;color:#52606d}.report p{font-size:13px;color:#52606d;margin:4px 0}.note{color:#7b8794;font-style:italic;font-size:14px;
margin:6px 0 12px}.notice{background:#fff8e1;border:1px solid #f0c36d;padding:10px 14px;
border-radius:6px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:8px 18px}
figure{margin:0}figcaption{font-size:13px;color:#52606d}
table{border-collapse:collapse;font-size:13px;margin:6px 0 10px;width:100%}
th,td{border-bottom:1px solid #e4e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f4f8}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.reason{white-space:pre-wrap;color:#b42318;max-width:520px}
tr.state-failed td,tr.state-interrupted td{background:#fff5f5}
tr.state-running td{background:#f0f9ff}
tr.nonfinite td{background:#fff4e5}.flag{font-size:11px;color:#b42318;border:1px solid #f0b4ae;
border-radius:3px;padding:0 3px;margin-left:4px;white-space:nowrap}
.report tr.baseline td{color:#52606d;font-style:italic}
"""

REFRESH_JS = """
(function () {
  var seconds = %d, box = document.getElementById("pause");
  box.checked = sessionStorage.getItem("mlrc-paused") === "1";
  box.addEventListener("change", function () {
    sessionStorage.setItem("mlrc-paused", box.checked ? "1" : "0");
  });
  setInterval(function () { if (!box.checked) { location.reload(); } }, seconds * 1000);
})();
"""


def _figure_html(fig, div_id: str, kind: str, study: str | None, caption: str = "") -> str:
    import plotly.io as pio

    body = pio.to_html(
        fig,
        include_plotlyjs=False,
        full_html=False,
        div_id=div_id,
        config=FIGURE_CONFIG,
        default_width="100%",
        default_height=f"{fig.layout.height or 380}px",
    )
    attrs = f' data-kind="{esc(kind)}"' + (f' data-study="{esc(study)}"' if study else "")
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure class="chart"{attrs}>{body}{cap}</figure>'


def _note(kind: str, text: str) -> str:
    return f'<p class="note" data-kind="{esc(kind)}">{esc(text)}</p>'


def _trial_table(study: StudyData) -> str:
    if not study.trials:
        return ""
    by_hash: dict[str, list[FoldCurve]] = {}
    for c in study.curves:
        by_hash.setdefault(c.params_hash, []).append(c)
    head = (
        "<tr><th>trial</th><th>state</th><th>val MAP@R</th><th>± SEM</th><th>parameters</th>"
        "<th>folds done</th><th>best epochs</th><th>fold val MAP@R</th><th>reason</th></tr>"
    )
    rows = []
    for t in study.trials:
        folds = sorted(by_hash.get(t.params_hash, []), key=lambda c: c.fold)
        done = [c for c in folds if c.status == "complete"]
        params = ", ".join(f"{k}={_fmt_param(v)}" for k, v in t.params.items())
        value = "" if t.value is None else repr(float(t.value))
        flag = ' <span class="flag">scored 0: non-finite</span>' if t.nonfinite else ""
        rows.append(
            f'<tr class="state-{esc(t.state)}{" nonfinite" if t.nonfinite else ""}" '
            f'data-trial="{t.number}">'
            f'<td class="num">{t.number}</td><td>{esc(t.state)}{flag}</td>'
            f'<td class="num" data-value="{value}">{_fmt(t.value)}</td>'
            f'<td class="num">{_fmt(t.sem)}</td><td>{esc(params)}</td>'
            f'<td class="num">{f"{len(done)}/{len(folds)}" if folds else "0"}</td>'
            f"<td>{esc(', '.join(str(c.best_epoch) for c in done))}</td>"
            f"<td>{esc(', '.join(_fmt(c.best_map_at_r, 3) for c in done))}</td>"
            f'<td class="reason">{esc(t.reason or "")}</td></tr>'
        )
    return f'<table class="trials">{head}{"".join(rows)}</table>'


def _test_table(summary) -> str:
    """The report's own HTML table (``mlrc report --format html``): marks and legend included."""
    from mlrc.report.tables import render

    page = render(summary, "html")
    body = page.split("<body>", 1)[-1].rsplit("</body>", 1)[0]
    return f'<div class="report">{body}</div>'


def _study_section(study: StudyData, index: int, optuna_figs: OptunaFigures) -> str:
    sid = f"study-{index}"
    counts = {s: sum(t.state == s for t in study.trials) for s in TRIAL_STATES}
    zeros = sum(t.nonfinite for t in study.trials)
    done = [t for t in study.trials if t.state == "complete" and t.value is not None]
    best = max(done, key=lambda t: t.value) if done else None
    facts = [
        f"dataset <b>{esc(study.dataset)}</b>",
        f"loss <b>{esc(study.loss)}</b>",
        *([f"strategy <b>{esc(study.strategy)}</b>"] if study.strategy else []),
        f"preset {esc(study.preset)}",
        f"trials {len(study.trials)}"
        + (f" of {study.budget}" if study.budget else "")
        + " ("
        + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        + (f", of them {zeros} scored 0 for a non-finite loss" if zeros else "")
        + ")"
        if study.trials
        else "no trials",
        f"reproductions tested {study.reproductions}",
        *([f"campaigns {esc(', '.join(study.campaigns))}"] if study.campaigns else []),
        f"created {study.created:%Y-%m-%d %H:%M} UTC" if study.created else "",
        f"code {esc(study.code_version)}",
    ]
    out = [
        f'<section class="study" id="{sid}" data-study="{esc(study.name)}">',
        f"<h2>Study {esc(study.name)}</h2>",
        f'<div class="facts">{" · ".join(f for f in facts if f)}</div>',
    ]
    if best is not None:
        out.append(
            f'<div class="facts">best so far: trial {best.number}, val MAP@R '
            f"{_fmt(best.value)} ± {_fmt(best.sem)} (SEM over folds); "
            f"{esc(', '.join(f'{k}={_fmt_param(v)}' for k, v in best.params.items()))}</div>"
        )
    if not study.trials:
        out.append(
            _note(
                "study", "No trials yet: the search of this study has not started (mlrc study run)."
            )
        )
        out.append("</section>")
        return "\n".join(out)
    out.append("<h3>Optimisation history</h3>")
    fig = history_figure(study)
    out.append(
        _figure_html(
            fig,
            f"{sid}-history",
            "history",
            study.name,
            "Each complete trial: mean validation MAP@R over its folds ± SEM; red: best so far; "
            "dotted lines: failed, pruned or running trials"
            + (
                "; black crosses: trials scored 0 because their loss or embeddings went non-finite "
                "(as in the reference harness; hover for the reason)."
                if zeros
                else "."
            ),
        )
        if fig is not None
        else _note("history", "No complete trial yet.")
    )
    ofigs = optuna_figs.figures(study.name)
    out.append('<div class="grid"><div>')
    out.append("<h3>Hyperparameter importance (fANOVA)</h3>")
    fig, note = ofigs["importance"]
    out.append(
        _figure_html(fig, f"{sid}-importance", "importance", study.name)
        if fig is not None
        else _note("importance", f"Hyperparameter importance: {note}.")
    )
    out.append("</div><div><h3>Parallel coordinates</h3>")
    fig, note = ofigs["parallel"]
    out.append(
        _figure_html(fig, f"{sid}-parallel", "parallel", study.name)
        if fig is not None
        else _note("parallel", f"Parallel coordinates: {note}.")
    )
    out.append("</div></div><h3>Slice plot</h3>")
    fig, note = ofigs["slice"]
    out.append(
        _figure_html(fig, f"{sid}-slice", "slice", study.name)
        if fig is not None
        else _note("slice", f"Slice plot: {note}.")
    )
    out.append("<h3>Validation MAP@R per fold (search)</h3>")
    fig = fold_curves_figure(study)
    out.append(
        _figure_html(
            fig,
            f"{sid}-folds",
            "folds",
            study.name,
            "One line per trial and fold (dashed: still running); ★ the fold's best epoch, the "
            "checkpoint early stopping keeps. Click a legend entry to show or hide a trial.",
        )
        if fig is not None
        else _note("folds", "No validated epoch yet.")
    )
    out.append("<h3>Trials</h3>")
    out.append(_trial_table(study))
    out.append("</section>")
    return "\n".join(out)


def render(
    snap: Snapshot,
    optuna_figs: OptunaFigures,
    plotly_js: str = "inline",
    refresh: int | None = None,
    links: bool = False,
) -> str:
    """The page. ``plotly_js``: ``inline`` (plotly.js in the page: works offline) or a URL;
    ``refresh``: reload every that many seconds (live server); ``links``: campaign links."""
    if plotly_js == "inline":
        from plotly.offline import get_plotlyjs

        script = f'<script type="text/javascript">{get_plotlyjs()}</script>'
    else:
        script = f'<script type="text/javascript" src="{esc(plotly_js)}"></script>'
    title = f"mlrc dashboard — {snap.scope}"
    meta = f"store {esc(snap.where)} · read {snap.read_at:%Y-%m-%d %H:%M:%S} UTC"
    if refresh:
        meta += (
            f' · refreshes every {refresh} s <label><input type="checkbox" id="pause"> pause'
            "</label>"
        )
    nav = []
    if links:
        nav.append('<a href="/">all studies</a>')
        nav += [
            f'<a href="/?campaign={esc(_q(c))}">campaign {esc(c)}</a>' for c in snap.all_campaigns
        ]
    if len(snap.studies) > 1:
        nav += [f'<a href="#study-{i}">{esc(st.name)}</a>' for i, st in enumerate(snap.studies)]
    body = []
    if not snap.studies:
        body.append(
            '<section><p class="notice" data-kind="empty">No studies in this store yet '
            f"({esc(snap.where)}): run <code>mlrc study run STUDY.yaml</code>.</p></section>"
        )
    else:
        body.append('<section class="tests" id="tests">')
        body.append(
            "<h2>Test results"
            + (f" — campaign {esc(', '.join(snap.campaigns))}" if snap.campaigns else "")
            + "</h2>"
        )
        fig = test_figure(snap.summary)
        if fig is None:
            body.append(
                _note("test", "No test results yet for these studies: run mlrc study test.")
            )
        else:
            body.append(
                _figure_html(
                    fig,
                    "test-map",
                    "test",
                    None,
                    "Test MAP@R in %, mean over n reproductions with the 95% t-interval "
                    "(error bars: half-width); separated = mean of the four 128-D fold models, "
                    "concatenated = their 512-D concatenation.",
                )
            )
            body.append(_test_table(snap.summary))
        body.append("</section>")
        body += [_study_section(st, i, optuna_figs) for i, st in enumerate(snap.studies)]
    js = f"<script>{REFRESH_JS % refresh}</script>" if refresh else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{esc(title)}</title><style>{CSS}</style>'
        f"{script}</head><body><header><h1>{esc(title)}</h1>"
        f'<div class="meta">{meta}</div></header><main>'
        + (f"<nav>{''.join(nav)}</nav>" if nav else "")
        + "\n".join(body)
        + f"</main>{js}</body></html>\n"
    )


def _q(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


class Dashboard:
    """A store and what is kept between pages: the engine and Optuna's figure cache."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = open_store(url)
        self.optuna = OptunaFigures(url, self.engine)

    def page(
        self,
        studies: list[str] | None = None,
        campaigns: list[str] | None = None,
        plotly_js: str = "inline",
        refresh: int | None = None,
        links: bool = False,
    ) -> str:
        snap = read(self.engine, studies, campaigns)
        return render(snap, self.optuna, plotly_js, refresh, links)


def build(
    url: str, out: Path, studies: list[str] | None = None, campaigns: list[str] | None = None
) -> Path:
    """Write the self-contained page (plotly.js inlined once) to ``out``."""
    text = Dashboard(url).page(studies, campaigns)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out


# --- live server -------------------------------------------------------------------------------


def make_server(url: str, host: str = "127.0.0.1", port: int = 8050, refresh: int = 30):
    """A threading HTTP server: ``/`` (optionally ``?campaign=C&study=A``, repeatable) renders
    from the store at each request; ``/plotly.min.js`` serves plotly.js (cached by the browser)."""
    from plotly.offline import get_plotlyjs

    from mlrc.report.tables import ReportError

    render_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "mlrc-dashboard"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            parts = urlsplit(self.path)
            if parts.path == PLOTLY_JS_PATH:
                self._send(200, plotly_bytes, "application/javascript", cache=True)
                return
            if parts.path not in ("/", "/index.html"):
                self._send(404, _error_page("not found", self.path), "text/html")
                return
            q = parse_qs(parts.query)
            try:
                with render_lock:
                    text = dash.page(
                        q.get("study") or None,
                        q.get("campaign") or None,
                        plotly_js=PLOTLY_JS_PATH,
                        refresh=refresh or None,
                        links=True,
                    )
                self._send(200, text.encode(), "text/html")
            except ReportError as e:  # unknown study or campaign in the query
                self._send(404, _error_page("not found", str(e)), "text/html")
            except Exception as e:  # the store went away, a bug: say so, keep serving
                log.exception("dashboard page failed")
                self._send(500, _error_page("error", f"{type(e).__name__}: {e}"), "text/html")

        def _send(self, status: int, body: bytes, ctype: str, cache: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{ctype}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

    server = listen(host, port, Handler)  # first: a busy port fails before the store is read
    try:
        dash = Dashboard(url)
        dash.page(plotly_js=PLOTLY_JS_PATH)  # fail now on an unusable store; warms the imports
        plotly_bytes = get_plotlyjs().encode()
    except BaseException:
        server.server_close()
        raise
    return server


class ServeError(RuntimeError):
    """The server cannot listen where it was asked to (port in use, privileged, bad host)."""


def listen(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threading HTTP server bound to ``host:port`` (IPv4 or IPv6); a :class:`ServeError`
    with a one-line reason if it cannot be."""
    import errno
    import socket

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not 0 <= port <= 65535:
        raise ServeError(f"--port {port}: not a port number (0 to 65535)")
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {})
        server_class.address_family = socket.AF_INET6
    try:
        return server_class((host, port), handler)
    except socket.gaierror as e:
        raise ServeError(f"--host {host}: cannot resolve this address ({e.strerror})") from None
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == errno.EADDRINUSE:
            message = f"{where} is already in use; choose another --port"
        elif e.errno == errno.EACCES:
            below = " (ports below 1024 need administrator rights)" if port < 1024 else ""
            message = f"{where}: permission denied{below}; choose another --port"
        elif e.errno == errno.EADDRNOTAVAIL:
            message = (
                f"--host {host}: not an address of this machine ({reason}); "
                "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
            )
        else:
            message = f"{where}: cannot listen ({reason})"
        raise ServeError(message) from None


def _error_page(title: str, message: str) -> bytes:
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title></head><body><h1>{esc(title)}</h1><p>{esc(message)}</p>"
        '<p><a href="/">all studies</a></p></body></html>'
    ).encode()


# --- command line ------------------------------------------------------------------------------

dashboard_app = typer.Typer(
    no_args_is_help=True,
    help="Plotly dashboards of the store: a self-contained HTML file, or served live.",
)
StorageOpt = Annotated[
    str, typer.Option("--storage", envvar="MLRC_STORAGE", help="SQLAlchemy URL of the store")
]


@contextmanager
def _user_errors() -> Iterator[None]:
    from rich.console import Console
    from rich.markup import escape

    from mlrc.report.tables import ReportError
    from mlrc.store import StoreError

    try:
        yield
    except (StoreError, ReportError, ServeError) as e:
        Console(stderr=True, soft_wrap=True, emoji=False).print(
            f"[red]error:[/red] {escape(str(e))}", highlight=False
        )
        raise typer.Exit(2) from None


@dashboard_app.command("build")
def build_command(
    out: Annotated[Path, typer.Option("--out", help="HTML file to write")] = Path(
        "mlrc-dashboard.html"
    ),
    storage: StorageOpt = "sqlite:///mlrc.db",
    study: Annotated[
        list[str] | None, typer.Option("--study", help="study name (repeat); default: all")
    ] = None,
    campaign: Annotated[
        list[str] | None,
        typer.Option("--campaign", help="campaign name (repeat): its studies in campaign order"),
    ] = None,
) -> None:
    """Write one self-contained HTML page (works offline) with every view of the store."""
    with _user_errors():
        path = build(storage, out, study, campaign)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


@dashboard_app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="address to bind (127.0.0.1: this machine only)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="port (0: any free port)")] = 8050,
    storage: StorageOpt = "sqlite:///mlrc.db",
    refresh: Annotated[
        int, typer.Option(help="reload the page every S seconds (0: never)", min=0)
    ] = 30,
) -> None:
    """Serve the dashboard live: every request re-reads the store; the page reloads itself."""
    with _user_errors():
        server = make_server(storage, host, port, refresh)
    from mlrc.store import redact

    shown = f"[{host}]" if ":" in host else host
    typer.echo(
        f"serving http://{shown}:{server.server_address[1]}/ (store {redact(storage)}, "
        f"refresh {refresh or 'off'}{' s' if refresh else ''}); Ctrl-C stops",
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


__all__ = [
    "Dashboard",
    "build",
    "dashboard_app",
    "make_server",
    "read",
    "render",
]
