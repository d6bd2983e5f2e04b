"""The dashboard's Plotly figures, drawn from data the caller read (:mod:`mlrc.report.snapshot`). No
figure reads the store. The figures are a study's optimisation history and per-fold validation
curves (:mod:`mlrc.report.figures.study`), the 2-D map of its best reproduction's test embeddings
(:mod:`mlrc.report.figures.retrieval`), the test results of the selected studies
(:mod:`mlrc.report.figures.results`), and Optuna's importance, slice and parallel-coordinate plots
of its Optuna trials (:mod:`mlrc.report.figures.optuna_plots`).

Every string from the store that goes into a label is escaped first
(:func:`~mlrc.report.figures.common.label`).
"""

from mlrc.report.figures.common import MODE_COLORS, label, layout
from mlrc.report.figures.optuna_plots import OptunaFigures, OptunaPlots
from mlrc.report.figures.results import test_figure
from mlrc.report.figures.retrieval import MAP_LEGEND_CLASSES, retrieval_map_figure
from mlrc.report.figures.study import MAX_VISIBLE_TRIALS, fold_curves_figure, history_figure

__all__ = [
    "MAP_LEGEND_CLASSES",
    "MAX_VISIBLE_TRIALS",
    "MODE_COLORS",
    "OptunaFigures",
    "OptunaPlots",
    "fold_curves_figure",
    "history_figure",
    "label",
    "layout",
    "retrieval_map_figure",
    "test_figure",
]
