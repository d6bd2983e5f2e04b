"""What every dashboard figure shares: escaped labels (:func:`label`), the common layout
(:func:`layout`) and the test modes' names and colours."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["MODE_COLORS", "label", "layout"]

MODE_COLORS = {"separated": "#4C78A8", "concatenated": "#F58518"}


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
