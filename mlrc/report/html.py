"""The dashboard's HTML: a :class:`~mlrc.report.snapshot.Snapshot` rendered as one page.

The page's skeleton, its sections, CSS and JavaScript are template files in
``mlrc/resources/dashboard/`` (filled with :class:`string.Template`); this module fills them with
the figures of :mod:`mlrc.report.figures` and the trial and test tables. Every string read from
the store is HTML-escaped (:func:`esc`).
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Mapping
from importlib.resources import files
from string import Template
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from mlrc.report import tables
from mlrc.report.figures import (
    OptunaPlots,
    fold_curves_figure,
    history_figure,
    retrieval_map_figure,
    test_figure,
)
from mlrc.report.layout import sizes_of
from mlrc.report.snapshot import FoldCurve, Retrieval, Snapshot, StudyData, TrialRow

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "FIGURE_CONFIG",
    "TRIAL_STATES",
    "error_page",
    "esc",
    "render",
    "resource",
    "template",
]

TRIAL_STATES = ("complete", "running", "failed", "interrupted", "pruned")
FIGURE_CONFIG = {"displaylogo": False, "responsive": True}


def esc(value: Any) -> str:
    """HTML-escape anything from the store (quotes too: values also go into attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


@functools.cache
def resource(name: str) -> str:
    """The text of the file ``name`` in ``mlrc/resources/dashboard/`` (package data)."""
    return (files("mlrc.resources") / "dashboard" / name).read_text(encoding="utf-8")


def template(name: str) -> Template:
    """The dashboard template ``name`` (``$name`` placeholders), without its final newline."""
    return Template(resource(name).removesuffix("\n"))


def _fmt(v: float | None, digits: int = 4) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _fmt_param(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# --- the page ----------------------------------------------------------------------------------


def render(
    snap: Snapshot,
    optuna_figs: Mapping[str, OptunaPlots],
    plotly_js: str = "inline",
    refresh: int | None = None,
    links: bool = False,
) -> str:
    """The page. ``optuna_figs``: Optuna's figures of each study with trials, by name
    (:meth:`mlrc.report.figures.OptunaFigures.figures`); ``plotly_js``: ``inline`` (plotly.js
    in the page: works offline) or a URL; ``refresh``: reload every that many seconds (live
    server); ``links``: campaign links."""
    title = f"mlrc dashboard — {snap.scope}"
    nav = _nav(snap, links)
    page = template("page.html").substitute(
        title=esc(title),
        css=resource("dashboard.css"),
        script=_plotly_script(plotly_js),
        meta=_meta(snap, refresh),
        nav=f"<nav>{''.join(nav)}</nav>" if nav else "",
        body="\n".join(_body(snap, optuna_figs)),
        refresh=_refresh_script(refresh),
    )
    return page + "\n"


def _plotly_script(plotly_js: str) -> str:
    """plotly.js inlined (``inline``) or loaded from the URL ``plotly_js``."""
    if plotly_js == "inline":
        from plotly.offline import get_plotlyjs

        return f'<script type="text/javascript">{get_plotlyjs()}</script>'
    return f'<script type="text/javascript" src="{esc(plotly_js)}"></script>'


def _meta(snap: Snapshot, refresh: int | None) -> str:
    """The line under the title: the store, when it was read, the reload period and its pause."""
    meta = f"store {esc(snap.where)} · read {snap.read_at:%Y-%m-%d %H:%M:%S} UTC"
    if refresh:
        meta += (
            f' · refreshes every {refresh} s <label><input type="checkbox" id="pause"> pause'
            "</label>"
        )
    return meta


def _refresh_script(refresh: int | None) -> str:
    """The script that reloads the page every ``refresh`` seconds unless paused ("": none)."""
    if not refresh:
        return ""
    return f"<script>\n{Template(resource('refresh.js')).substitute(seconds=refresh)}</script>"


def _nav(snap: Snapshot, links: bool) -> list[str]:
    """Links: every campaign's page (live server), then each study's section."""
    nav = []
    if links:
        nav.append('<a href="/">all studies</a>')
        nav += [
            f'<a href="/?campaign={esc(quote(c, safe=""))}">campaign {esc(c)}</a>'
            for c in snap.all_campaigns
        ]
    if len(snap.studies) > 1:
        nav += [f'<a href="#study-{i}">{esc(st.name)}</a>' for i, st in enumerate(snap.studies)]
    return nav


def _body(snap: Snapshot, optuna_figs: Mapping[str, OptunaPlots]) -> list[str]:
    """The sections: test results, then one per study (a notice if the store has none)."""
    if not snap.studies:
        return [template("empty.html").substitute(where=esc(snap.where))]
    return [
        _tests_section(snap),
        *(_study_section(st, i, optuna_figs) for i, st in enumerate(snap.studies)),
    ]


def _tests_section(snap: Snapshot) -> str:
    """Test MAP@R of the selected studies as a figure and the report's table."""
    fig = test_figure(snap.summary)
    if fig is None:
        results = _note("test", "No test results yet for these studies: run mlrc study test.")
    else:
        sizes = sizes_of(snap.summary)
        k, d = sizes or (None, None)
        models = f"the {k} {d}-D fold models" if sizes else "a study's fold models"
        joined = f"their {k * d}-D concatenation" if sizes else "their concatenation"
        caption = (
            "Test MAP@R in %, mean over n reproductions with the 95% t-interval "
            f"(error bars: half-width); separated = mean of {models}, concatenated = {joined}."
        )
        if snap.summary["test_set_selection"].any():
            caption += f" {tables.SECTION}: {tables.TRADITIONAL_TITLE} (leakage; one model)."
        results = _figure_html(fig, "test-map", "test", None, caption)
        results += "\n" + _test_table(snap.summary)
    campaigns = f" — campaign {esc(', '.join(snap.campaigns))}" if snap.campaigns else ""
    return template("tests.html").substitute(campaigns=campaigns, results=results)


# --- a study's section -------------------------------------------------------------------------


def _study_section(study: StudyData, index: int, optuna_figs: Mapping[str, OptunaPlots]) -> str:
    """One study: its facts, best trial, charts and trial table."""
    sid = f"study-{index}"
    if study.trials:
        views = _study_charts(study, sid, optuna_figs)
    else:
        views = _note(
            "study", "No trials yet: the search of this study has not started (mlrc study run)."
        )
    return template("study.html").substitute(
        sid=sid,
        name=esc(study.name) + (f" ({tables.ARCHIVED})" if study.archived else ""),
        facts=" · ".join(f for f in _facts(study) if f),
        best=_best_line(study),
        views=views,
        retrieval=_retrieval_view(study, sid),
    )


def _facts(study: StudyData) -> list[str]:
    """What the study is: dataset, loss, strategy, preset, trials by state, tests, campaigns."""
    return [
        f"dataset <b>{esc(study.dataset)}</b>",
        f"loss <b>{esc(study.loss)}</b>",
        *([f"strategy <b>{esc(study.strategy)}</b>"] if study.strategy else []),
        f"preset {esc(study.preset)}",
        *(
            [f"<b>{tables.SECTION} {tables.TRADITIONAL_TITLE}</b>"]
            if study.test_set_selection
            else []
        ),
        _trial_counts(study),
        *(
            [f"<b>{tables.DDAGGER} pruned search</b>: {esc(study.pruning)}"]
            if study.pruning
            else []
        ),
        f"reproductions tested {study.reproductions}",
        *([f"campaigns {esc(', '.join(study.campaigns))}"] if study.campaigns else []),
        f"created {study.created:%Y-%m-%d %H:%M} UTC" if study.created else "",
        f"code {esc(study.code_version)}",
    ]


def _trial_counts(study: StudyData) -> str:
    """E.g. "trials 3 of 4 (2 complete, 1 running)", with how many were scored 0 for a
    non-finite loss; "no trials" without any."""
    if not study.trials:
        return "no trials"
    counts = {s: sum(t.state == s for t in study.trials) for s in TRIAL_STATES}
    zeros = sum(t.nonfinite for t in study.trials)
    return (
        f"trials {len(study.trials)}"
        + (f" of {study.budget}" if study.budget else "")
        + " ("
        + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        + (f", of them {zeros} scored 0 for a non-finite loss" if zeros else "")
        + ")"
    )


def _best_line(study: StudyData) -> str:
    """The best complete trial so far with its parameters ("": none yet)."""
    done = [t for t in study.trials if t.state == "complete" and t.value is not None]
    if not done:
        return ""
    best = max(done, key=lambda t: t.value)
    sem = f" ± {_fmt(best.sem)} (SEM over folds)" if best.sem is not None else ""
    return (
        f'<div class="facts">best so far: trial {best.number}, {esc(study.value_label)} '
        f"{_fmt(best.value)}{sem}; "
        f"{esc(', '.join(f'{k}={_fmt_param(v)}' for k, v in best.params.items()))}</div>"
    )


def _study_charts(study: StudyData, sid: str, optuna_figs: Mapping[str, OptunaPlots]) -> str:
    """History, Optuna's three figures, the fold curves and the trial table of a study."""
    ofigs = optuna_figs[study.name]
    optuna_views = {
        kind: _optuna_view(ofigs[kind], sid, kind, title, study.name)
        for kind, title in (
            ("importance", "Hyperparameter importance"),
            ("parallel", "Parallel coordinates"),
            ("slice", "Slice plot"),
        )
    }
    return template("study-charts.html").substitute(
        history=_history_view(study, sid),
        **optuna_views,
        folds=_folds_view(study, sid),
        trials=_trial_table(study),
    )


def _history_view(study: StudyData, sid: str) -> str:
    fig = history_figure(study)
    if fig is None:
        return _note("history", "No complete trial yet.")
    caption = (
        "Each complete trial: mean validation MAP@R over its folds ± SEM; red: best so far; "
        "dotted lines: failed, pruned or running trials"
    )
    if any(t.nonfinite for t in study.trials):
        caption += (
            "; black crosses: trials scored 0 because their loss or embeddings went non-finite "
            "(as in the reference harness; hover for the reason)."
        )
    else:
        caption += "."
    return _figure_html(fig, f"{sid}-history", "history", study.name, caption)


def _optuna_view(
    fig_note: tuple[go.Figure | None, str | None], sid: str, kind: str, title: str, study: str
) -> str:
    fig, note = fig_note
    if fig is None:
        return _note(kind, f"{title}: {note}.")
    return _figure_html(fig, f"{sid}-{kind}", kind, study)


def _folds_view(study: StudyData, sid: str) -> str:
    fig = fold_curves_figure(study)
    if fig is None:
        return _note("folds", "No validated epoch yet.")
    caption = (
        "One line per trial and fold (dashed: still running); ★ the fold's best epoch, the "
        "checkpoint early stopping keeps. Click a legend entry to show or hide a trial."
    )
    return _figure_html(fig, f"{sid}-folds", "folds", study.name, caption)


# --- a study's retrieval view ------------------------------------------------------------------


def _retrieval_view(study: StudyData, sid: str) -> str:
    """The retrieval view of the study's best reproduction: its sample queries, each with its k
    nearest test images (green border: same class, red: another), and the embedding map ("":
    no view stored)."""
    view = study.retrieval
    if view is None:
        return ""
    fig = retrieval_map_figure(view)
    method = (view.data.get("map") or {}).get("method", "")
    if fig is None:
        chart = _note("retrieval-map", "No embedding map stored for this reproduction.")
    else:
        n, shown = view.data.get("n"), len((view.data.get("map") or {}).get("x") or [])
        caption = (
            f"The test embeddings ({_concatenated(study)}, L2-normalised) in 2-D by "
            f"{esc(method.upper())}: "
            f"{shown} of {n} test images, coloured by class; stars: the sample queries."
        )
        chart = _figure_html(fig, f"{sid}-retrieval-map", "retrieval-map", study.name, caption)
    return template("retrieval.html").substitute(
        name=esc(study.name) + (f" ({tables.ARCHIVED})" if study.archived else ""),
        reproduction=view.reproduction,
        map_at_r=_fmt(view.map_at_r) + (f" {tables.SECTION}" if study.test_set_selection else ""),
        queries=_retrieval_grid(view, _concatenated(study)),
        embedding=esc(_concatenated(study)),
        map=chart,
    )


def _concatenated(study: StudyData) -> str:
    """The study's test embedding in words: ``512-D concatenated`` (4 × 128), ``512-D`` (one
    model), ``concatenated`` (sizes not recorded)."""
    if study.sizes is None:
        return "concatenated"
    k, d = study.sizes
    return f"{d}-D" if k == 1 else f"{k * d}-D concatenated"


def _retrieval_grid(view: Retrieval, embedding: str) -> str:
    """One row per sample query: its image, then its k nearest other test images in order."""
    queries = view.data.get("queries") or []
    if not queries:
        return _note("retrieval", "No sample queries stored for this reproduction.")
    if view.unavailable or not view.images:
        return _note("retrieval", f"No thumbnails: {view.unavailable or 'no images'}.")
    k = max(len(q.get("neighbours", [])) for q in queries)
    head = "<tr><th>query</th><th></th>" + "".join(f"<th>{j}</th>" for j in range(1, k + 1))
    rows = [
        f'<tr data-query="{int(q["index"])}">{_thumb(view, q, "query")}<td class="arrow">→</td>'
        + "".join(
            _thumb(view, nb, "same" if nb.get("same") else "different")
            for nb in q.get("neighbours", [])
        )
        + "</tr>"
        for q in queries
    ]
    caption = (
        f"Sample test queries (one per class, seeded) and their {k} nearest other test images "
        f"by the {embedding} embedding, nearest first; border green: same class as the query, red: "
        "another class."
    )
    return (
        f'<table class="retrieval">{head}</tr>{"".join(rows)}</table>'
        f"<figcaption>{caption}</figcaption>"
    )


def _thumb(view: Retrieval, item: dict, kind: str) -> str:
    """One thumbnail cell: the image (its border says ``kind``) and its class name."""
    index, name = int(item["index"]), item.get("name", item.get("label"))
    same = "" if kind == "query" else f' data-same="{str(kind == "same").lower()}"'
    title = f"{'query' if kind == 'query' else kind + ' class'}: {name} (item {index})"
    return (
        f'<td><img class="{kind}" src="{view.images[index]}" alt="{esc(name)}" '
        f'title="{esc(title)}" data-index="{index}" data-label="{esc(item.get("label"))}"{same}>'
        f'<div class="cls">{esc(name)}</div></td>'
    )


# --- pieces ------------------------------------------------------------------------------------


def _figure_html(
    fig: go.Figure, div_id: str, kind: str, study: str | None, caption: str = ""
) -> str:
    """A figure (plotly.js not included) in a ``<figure>`` with its kind, study and caption."""
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
    """Every trial: state, value ± SEM, parameters, folds done, best epochs, reason."""
    if not study.trials:
        return ""
    by_hash: dict[str, list[FoldCurve]] = {}
    for c in study.curves:
        by_hash.setdefault(c.params_hash, []).append(c)
    head = (
        f"<tr><th>trial</th><th>state</th><th>{esc(study.value_label)}</th><th>± SEM</th>"
        "<th>parameters</th><th>folds done</th><th>best epochs</th>"
        f"<th>fold {esc(study.curve_label)}</th><th>reason</th></tr>"
    )
    rows = [_trial_row(t, by_hash.get(t.params_hash, [])) for t in study.trials]
    return f'<table class="trials">{head}{"".join(rows)}</table>'


def _trial_row(t: TrialRow, curves: list[FoldCurve]) -> str:
    folds = sorted(curves, key=lambda c: c.fold)
    done = [c for c in folds if c.status == "complete"]
    params = ", ".join(f"{k}={_fmt_param(v)}" for k, v in t.params.items())
    value = "" if t.value is None else repr(float(t.value))
    flag = ' <span class="flag">scored 0: non-finite</span>' if t.nonfinite else ""
    return (
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


def _test_table(summary: pd.DataFrame) -> str:
    """The report's own HTML table (``mlrc report --format html``): marks and legend included."""
    page = tables.render(summary, "html")
    body = page.split("<body>", 1)[-1].rsplit("</body>", 1)[0]
    return f'<div class="report">{body}</div>'


def error_page(title: str, message: str) -> bytes:
    """A small HTML page saying what went wrong (the live server's 404 and 500)."""
    return template("error.html").substitute(title=esc(title), message=esc(message)).encode()
