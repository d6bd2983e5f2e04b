"""Tables and dashboards, read from the store only.

The test-result tables (:mod:`mlrc.report.tables`): :func:`collect` the values of a selection of
studies, :func:`summarize` them (95% intervals, marks within each protocol block), and
:func:`render` the summary as ``md``, ``csv``, ``latex`` or ``html``. The dashboard is
:mod:`mlrc.report.dashboard`."""

from mlrc.report.tables import (
    COMPARISON_EXCLUDED,
    FORMATS,
    ReportError,
    collect,
    comparison_key,
    comparison_scope,
    render,
    scope_differences,
    select_studies,
    summarize,
)

__all__ = [
    "FORMATS",
    "COMPARISON_EXCLUDED",
    "ReportError",
    "collect",
    "scope_differences",
    "comparison_key",
    "comparison_scope",
    "render",
    "select_studies",
    "summarize",
]
