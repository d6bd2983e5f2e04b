"""Plotly dashboards of the store: one self-contained HTML file, or the same page served live.

Everything shown is read from the store only — mlrc's tables (``mlrc_trial``, ``mlrc_fold_run``,
``mlrc_epoch_metric``, ``mlrc_test_result``, ``mlrc_campaign_study``, ``mlrc_retrieval_view``)
and Optuna's tables in the same database (hyperparameter importance, slice and
parallel-coordinate plots); the one exception is the retrieval view's thumbnails, read from the
study's dataset. Per study:

- optimisation history: each complete trial's mean validation MAP@R over its folds ± SEM, the
  best-so-far line, failed, pruned and running trials as dotted vertical lines; trials scored 0
  because their loss or embeddings went non-finite (complete, value 0, as in the reference
  harness) as black crosses with their reason;
- hyperparameter importance (Optuna's fANOVA, seeded; needs ≥ 2 complete trials);
- slice and parallel-coordinate plots (Optuna);
- per-fold validation MAP@R curves of the search folds, each fold's best (early-stopping) epoch
  marked with a star;
- the trial table: state, value ± SEM, parameters, folds done, best epochs, failure reasons
  (a trial scored 0 for a non-finite loss is flagged, with its reason);
- the retrieval view of its best reproduction (``mlrc_retrieval_view``, written by the test
  stage): sample test queries with their nearest test images, green/red bordered for the same or
  another class, thumbnails read from the dataset and embedded as ``data:`` URIs (a dataset that
  cannot be opened here is one line instead), and the 2-D map of the test embeddings by class.

Per campaign (``--campaign``), or else for every selected study with test results: test MAP@R
(%) with 95% t-interval error bars per loss and dataset, separated (128-D) vs concatenated
(512-D), from :func:`mlrc.report.tables.collect`/:func:`~mlrc.report.tables.summarize`, and the
table of all three metrics. As in the report, a dataset whose studies ran under several protocols
(:func:`mlrc.report.tables.comparison_scope`) gets one panel and one table per protocol, and each
starts with the untrained baseline ("Pretrained" or "Random init", a single value, crosses in the
figure) of its studies.

Every string read from the store is HTML-escaped, in the page and in the figures' labels.
:func:`build` inlines plotly.js once (the file works offline); the live server
(:func:`mlrc.report.server.make_server`) re-reads the store on every request and reloads the page
every ``refresh`` seconds.

The work is split by concern: :mod:`mlrc.report.snapshot` reads the store (its queries are in
:mod:`mlrc.store.snapshot`) and Optuna's tables, :mod:`mlrc.report.figures` draws what was read,
:mod:`mlrc.report.html` renders the templates of ``mlrc/resources/dashboard/``,
:mod:`mlrc.report.server` serves.
"""

from __future__ import annotations

from pathlib import Path

from mlrc.report.figures import OptunaFigures
from mlrc.report.html import render
from mlrc.report.snapshot import OptunaReader, open_store, read

__all__ = ["Dashboard", "build"]


class Dashboard:
    """A store and what is kept between pages: the engine, Optuna's storage and Optuna's
    figure cache."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = open_store(url)
        self.optuna_tables = OptunaReader(url, self.engine)
        self.optuna = OptunaFigures()

    def page(
        self,
        studies: list[str] | None = None,
        campaigns: list[str] | None = None,
        plotly_js: str = "inline",
        refresh: int | None = None,
        links: bool = False,
        archived: bool = False,
    ) -> str:
        """The page of the selected studies and campaigns (all studies: neither), read now;
        ``plotly_js``, ``refresh`` and ``links`` as :func:`mlrc.report.html.render`;
        ``archived``: with the archived studies the report leaves out by default."""
        snap = read(self.engine, studies, campaigns, archived)
        optuna_figs = {
            st.name: self.optuna.figures(st.name, self.optuna_tables.read(st.name))
            for st in snap.studies
            if st.trials  # a study without trials shows no charts
        }
        return render(snap, optuna_figs, plotly_js, refresh, links)


def build(
    url: str,
    out: Path,
    studies: list[str] | None = None,
    campaigns: list[str] | None = None,
    archived: bool = False,
) -> Path:
    """Write the self-contained page (plotly.js inlined once) to ``out``."""
    text = Dashboard(url).page(studies, campaigns, archived=archived)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out
