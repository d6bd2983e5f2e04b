"""Warm starts (``search.warm_start``): a study's first trials are the best configurations of
another, finished study.

The source is ``study: NAME``, a study of the same store (its ``top`` best complete trials,
highest value first), or ``file: EXPORT.yaml``, what ``mlrc study export`` writes (it holds the
best trial only, so it gives one configuration whatever ``top`` says).

The source must have tuned the same loss (and miner and strategy) over the same parameters: each
configuration is mapped onto this study's search space and checked against it — a parameter the
source never had, one it searched that this study does not, a fixed value that differs, a value
outside this study's range, choices or grid — and any misfit is refused in one line naming the
study file and ``search.warm_start`` (never clipped). Other datasets and presets are allowed.

The configurations are enqueued once, after the study file's ``enqueue`` list and before the
sampler's own suggestions (:func:`enqueue_warm_start`, under the study's lock), and the warm
start is recorded in the study's history (``search.warm_start``: the source and the trials
taken). A warm-started search is not the reference's: ``study status`` and the report mark it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrc.config import ConfigError, ParamSpace, ResolvedStudy, did_you_mean, load_yaml
from mlrc.config.identity import code_version
from mlrc.store import history, reads, studies, trials

if TYPE_CHECKING:
    import optuna
    from sqlalchemy.engine import Engine

    from mlrc.search.session import StudySession

__all__ = ["FIELD", "WarmStart", "check_warm_start", "enqueue_warm_start", "warm_start"]

log = logging.getLogger("mlrc")
FIELD = "search.warm_start"  # its field in the study's history
_DONE = "warm_started"  # the Optuna study's user attribute once its warm start is enqueued
_INDEX = "warm_start_index"  # an enqueued configuration's place in the warm start


@dataclass(frozen=True)
class WarmStart:
    """A resolved warm start: what the history records (``text``) and the configurations to
    enqueue (``points``: this study's searched parameters, best first)."""

    text: str
    points: list[dict[str, Any]]


@dataclass(frozen=True)
class _Source:
    """What a warm start reads from its source, before mapping."""

    label: str  # "study 'cub-contrastive'" or "file best.yaml", for messages
    methods: dict[str, str | None]  # loss, miner, strategy names
    searched: set[str] | None  # the source's searched parameters (None: not known, a file)
    params: list[dict[str, Any]]  # each configuration's every parameter, best first
    text: str  # for the history


def warm_start(engine: Engine, resolved: ResolvedStudy) -> WarmStart | None:
    """The study's warm start read from its source and mapped onto its space (None: it has
    none); a :class:`~mlrc.config.ConfigError` in one line when the source is unknown,
    unfinished, the study itself, or does not fit."""
    spec = resolved.study.search.warm_start
    if spec is None:
        return None
    where = f"{resolved.source or 'study'}: {FIELD}"
    source = _from_study(engine, resolved, where) if spec.study else _from_file(resolved, where)
    ours = _methods(resolved.study.model_dump(mode="json"))
    for part, theirs in source.methods.items():
        if theirs != ours[part]:
            raise ConfigError(
                f"{where}: {source.label} tuned {_named(part, theirs)}, this study tunes "
                f"{_named(part, ours[part])}"
            )
    points = [_mapped(p, resolved, source, where) for p in source.params]
    return WarmStart(source.text, points)


def check_warm_start(engine: Engine, resolved: ResolvedStudy) -> None:
    """Before the study is registered: its warm start resolves (the refusals of
    :func:`warm_start`), unless the stored study already took it (its history says so)."""
    if resolved.study.search.warm_start is not None and not _recorded(engine, resolved):
        warm_start(engine, resolved)


def enqueue_warm_start(ctx: StudySession, ostudy: optuna.Study) -> None:
    """Under the study's lock, once per study: enqueue the warm start's configurations (each
    once even if a kill interrupts the loop; one equal to a trial already there is skipped)
    and record it in the study's history."""
    if ctx.resolved.study.search.warm_start is None or ostudy.user_attrs.get(_DONE):
        return
    ws = warm_start(ctx.engine, ctx.resolved)
    assert ws is not None
    seen = {t.user_attrs.get(_INDEX) for t in ostudy.get_trials(deepcopy=False)}
    for i, params in enumerate(ws.points):
        if i not in seen:
            ostudy.enqueue_trial(params, user_attrs={_INDEX: i}, skip_if_exists=True)

    def diff(config: dict, settings: dict | None, last: dict) -> tuple[list, None, None]:
        return ([] if FIELD in last else [(FIELD, None, ws.text)]), None, None

    history.record_changes(ctx.engine, ctx.study_id, diff, code_version())
    ostudy.set_user_attr(_DONE, True)
    log.warning("study %r: warm-started from %s (not the reference's search)", ctx.name, ws.text)


def _recorded(engine: Engine, resolved: ResolvedStudy) -> bool:
    """The stored study of this name has its warm start in its history."""
    row = studies.study_named(engine, resolved.study.name)
    return row is not None and any(h.field == FIELD for h in history.study_history(engine, row.id))


def _methods(study: dict[str, Any]) -> dict[str, str | None]:
    """The loss, miner and strategy names of a study file's content (a stored or exported one)."""
    return {part: (study.get(part) or {}).get("name") for part in ("loss", "miner", "strategy")}


def _named(part: str, name: str | None) -> str:
    return f"{part} {name!r}" if name else f"no {part}"


def _from_study(engine: Engine, resolved: ResolvedStudy, where: str) -> _Source:
    """The ``top`` best complete trials of the named study of this store."""
    spec = resolved.study.search.warm_start
    name, top = spec.study, spec.top
    if name == resolved.study.name:
        raise ConfigError(
            f"{where}: study {name!r} is this study itself (a warm start takes another, "
            "finished study)"
        )
    row = studies.study_named(engine, name)
    if row is None:
        known = reads.study_names(engine)
        shown = ", ".join(known[:10]) + (", …" if len(known) > 10 else "")
        raise ConfigError(
            f"{where}: no study {name!r} in the store{did_you_mean(name, known)} "
            f"(known: {shown or 'none'})"
        )
    best = trials.top_trials(engine, row.id, top)
    if not best:
        raise ConfigError(
            f"{where}: study {name!r} has no complete trial yet (a warm start takes the best "
            "of a finished study: run it first)"
        )
    numbers = ", ".join(str(t.number) for t in best)
    few = f": all its {len(best)} complete" if len(best) < top else ""
    return _Source(
        f"study {name!r}",
        _methods(row.config.get("study") or {}),
        set(row.config.get("space") or {}),
        [dict(t.params) for t in best],
        f"study {name} top {top} (trials {numbers}{few})",
    )


def _from_file(resolved: ResolvedStudy, where: str) -> _Source:
    """The best trial of a study file that ``mlrc study export`` wrote."""
    spec = resolved.study.search.warm_start
    given = Path(spec.file).expanduser()
    candidates = [given] if given.is_absolute() else [given, Path(resolved.source).parent / given]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        looked = " and ".join(dict.fromkeys(str(c.resolve()) for c in candidates))
        raise ConfigError(f"{where}: file {spec.file} does not exist (looked in {looked})")
    try:
        doc = load_yaml(path)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    loss = doc.get("loss") if isinstance(doc, dict) else None
    if not isinstance(loss, dict) or not isinstance(loss.get("params"), dict):
        raise ConfigError(
            f"{where}: {spec.file} is not a study export (what `mlrc study export` writes: the "
            "best parameters in loss.params)"
        )
    params = dict(loss["params"])
    for part in ("miner", "strategy"):
        for k, v in ((doc.get(part) or {}).get("params") or {}).items():
            params[f"{part}.{k}"] = v
    return _Source(
        f"file {spec.file}",
        _methods(doc),
        None,
        [params],
        f"file {spec.file} top {spec.top} (its best trial: an export holds only that)",
    )


def _mapped(
    params: dict[str, Any], resolved: ResolvedStudy, source: _Source, where: str
) -> dict[str, Any]:
    """A source configuration as this study's searched parameters, or the refusal."""
    space, fixed = resolved.space, resolved.fixed
    for k in space:
        if k not in params:
            raise ConfigError(
                f"{where}: {source.label} never had parameter {k!r}, which this study searches"
            )
    for k in sorted(source.searched or ()):
        if k not in space:
            raise ConfigError(
                f"{where}: {source.label} searched {k!r}, which this study does not search "
                f"(searched: {', '.join(space) or 'nothing'})"
            )
    for k in sorted(params):
        if k not in space and (k not in fixed or fixed[k] != params[k]):
            now = f"fixes it at {fixed[k]!r}" if k in fixed else "neither searches nor fixes it"
            raise ConfigError(f"{where}: {source.label} has {k} = {params[k]!r}; this study {now}")
    out = {}
    for k, s in space.items():
        problem = _misfit(s, params[k])
        if problem:
            raise ConfigError(f"{where}: {source.label}: {k} = {params[k]!r} {problem}")
        out[k] = int(params[k]) if s.int_ else params[k]
    return out


def _misfit(s: ParamSpace, v: Any) -> str | None:
    """Why ``v`` cannot be drawn from this study's space ``s`` (None: it can)."""
    if s.choices is not None:
        ok = any(v == c and isinstance(v, bool) == isinstance(c, bool) for c in s.choices)
        return None if ok else f"is not one of this study's choices {s.choices}"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"is not a number (this study searches [{s.low}, {s.high}])"
    if not s.low <= v <= s.high:
        return f"is outside this study's range [{s.low}, {s.high}]"
    if s.int_ and not float(v).is_integer():
        return f"is not a whole number (this study searches it with int: true over [{s.low}, {s.high}])"
    if s.step is not None and abs((v - s.low) / s.step - round((v - s.low) / s.step)) > 1e-9:
        return f"is not on this study's grid {s.low} + k × {s.step} (up to {s.high})"
    return None
