"""Optuna's importance, slice and parallel-coordinate figures of a study (:class:`OptunaFigures`),
drawn from the study's trials as Optuna stored them (:class:`~mlrc.report.snapshot.OptunaTrials`,
read by the caller): Optuna's plots run on an in-memory copy of the study, never on the store."""

from __future__ import annotations

import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any

from mlrc.errors import first_line
from mlrc.report.figures.common import layout
from mlrc.report.snapshot import OptunaTrials

if TYPE_CHECKING:
    import optuna
    import plotly.graph_objects as go

__all__ = ["OPTUNA_KINDS", "OptunaFigures", "OptunaPlots", "optuna_figures"]

OPTUNA_KINDS = ("importance", "slice", "parallel")
OptunaPlots = dict[str, tuple[Any, str | None]]  # kind → (figure or None, note when none)


class OptunaFigures:
    """:func:`optuna_figures`, cached by the study's trials (the live server does not recompute
    fANOVA while nothing changed)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, OptunaPlots] = {}
        self._lock = threading.Lock()

    def figures(self, name: str, read: OptunaTrials) -> OptunaPlots:
        """kind → (figure or None, note when there is no figure) of study ``name``, whose
        Optuna trials are ``read``."""
        if read.note is not None:
            return dict.fromkeys(OPTUNA_KINDS, (None, read.note))
        key = (name, tuple((t.number, t.state, tuple(t.values or ())) for t in read.trials))
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        out = optuna_figures(read)
        with self._lock:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = out
        return out


def optuna_figures(read: OptunaTrials) -> OptunaPlots:
    """The three figures of a study whose Optuna trials are ``read`` (or notes why not)."""
    from optuna.trial import TrialState

    done = [t for t in read.trials if t.state == TrialState.COMPLETE]
    params = sorted({p for t in done for p in t.params})
    if not done:
        return dict.fromkeys(OPTUNA_KINDS, (None, "needs ≥ 1 complete trial (0 so far)"))
    if not params:
        return dict.fromkeys(OPTUNA_KINDS, (None, "no searched hyperparameters"))
    ostudy = _in_memory(read)
    out: OptunaPlots = {}
    if len(done) < 2:
        out["importance"] = (None, f"needs ≥ 2 complete trials ({len(done)} so far)")
    else:
        out["importance"] = _plot("importance", ostudy)
    out["slice"] = _plot("slice", ostudy)
    out["parallel"] = _plot("parallel", ostudy)
    return out


def _in_memory(read: OptunaTrials) -> optuna.Study:
    """An in-memory Optuna study holding ``read``'s trials (numbers, states, parameters and
    values as stored), its directions and metric names: what Optuna's plots read."""
    import optuna

    storage = optuna.storages.InMemoryStorage()
    quiet = logging.getLogger("optuna.storages._in_memory")  # no "A new study created" line
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        study_id = storage.create_new_study(list(read.directions))
    finally:
        quiet.setLevel(level)
    for t in read.trials:  # in order: each keeps its number
        storage.create_new_trial(study_id, template_trial=t)
    ostudy = optuna.load_study(study_name=storage.get_study_name_from_id(study_id), storage=storage)
    if read.metric_names is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # set_metric_names is experimental
            ostudy.set_metric_names(list(read.metric_names))
    return ostudy


def _plot(kind: str, ostudy: optuna.Study) -> tuple[Any, str | None]:
    """Optuna's ``kind`` figure of ``ostudy`` in the dashboard's layout (or a note why not)."""
    import optuna
    from optuna import visualization as ov

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "importance":
                from optuna.importance import FanovaImportanceEvaluator

                fig = ov.plot_param_importances(ostudy, evaluator=FanovaImportanceEvaluator(seed=0))
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
