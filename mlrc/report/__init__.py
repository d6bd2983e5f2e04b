"""Tables and dashboards, read from the store only.

The test-result tables (:mod:`mlrc.report.tables`): :func:`collect` the values of a selection of
studies, :func:`summarize` them (95% intervals, marks within each protocol block), and
:func:`render` the summary as ``md``, ``csv``, ``latex`` or ``html``. The dashboard is
:mod:`mlrc.report.dashboard`."""

from mlrc.report.tables import (
    FORMATS,
    PROTOCOL_EXCLUDED,
    ReportError,
    collect,
    protocol_differences,
    protocol_key,
    protocol_of,
    render,
    select_studies,
    summarize,
)

__all__ = [
    "FORMATS",
    "PROTOCOL_EXCLUDED",
    "ReportError",
    "collect",
    "protocol_differences",
    "protocol_key",
    "protocol_of",
    "render",
    "select_studies",
    "summarize",
]
