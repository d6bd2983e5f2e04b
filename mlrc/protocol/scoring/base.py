"""The metric registry, its entries (:class:`MetricInfo`), requested metrics (:class:`Metric`)
and what a metric function is given (:class:`Ranked`, :class:`PairScores`).

Two kinds of metric:

- ``ranking``: ``fn(ranked: Ranked, **params) -> np.ndarray`` — one value per query of a block
  of queries, read from the relevance of their nearest reference items; ``depth`` says how many
  neighbours it reads: ``"R"`` (each query's R), the name of an integer parameter (``"k"``: its
  value; None → down to the query's first relevant item, searched ever deeper), or a fixed
  integer;
- ``pairs``: ``fn(pairs: PairScores, **params) -> float`` — one value from the similarities of
  every (query, reference) pair (verification).

A plug-in registers with :func:`register` from a module listed under the entry-point group
``mlrc.metrics`` (see :mod:`mlrc.registry`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mlrc.params import ParamType
from mlrc.registry import Entry, Registry, RegistryError


@dataclass(frozen=True, kw_only=True)
class MetricInfo(Entry):
    """A registered metric. ``kind``: ``"ranking"`` or ``"pairs"`` (module docstring);
    ``depth``: neighbours a ranking metric reads; ``param``: the parameter written after ``@``
    in :func:`parse_metrics` (None: takes none); ``key``: the column name, a format string of
    the parameters (``"recall_at_{k}"``); ``key_without``: the column name when the optional
    ``param`` is left out; ``needs``: extra inputs (``"super_labels"``);
    ``higher_is_better``: False for error rates (FNMR); ``param_type``: the ``@`` parameter's
    type where its annotation cannot say it (an optional ``Count | None``)."""

    kind: Literal["ranking", "pairs"] = "ranking"
    depth: str | int = "R"
    param: str | None = None
    key: str = ""
    key_without: str = ""
    needs: frozenset[str] = frozenset()
    higher_is_better: bool = True
    param_type: ParamType | None = None


FIRST_DEPTH = 16  # first search depth of a metric that reads to the first relevant item

METRICS: Registry[Any] = Registry("metric", group="mlrc.metrics", entry=MetricInfo)


def register(
    name: str,
    *,
    kind: Literal["ranking", "pairs"] = "ranking",
    depth: str | int = "R",
    param: str | None = None,
    key: str | None = None,
    key_without: str | None = None,
    needs: frozenset[str] | set[str] = frozenset(),
    higher_is_better: bool = True,
    param_type: ParamType | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a metric function (module docstring); ``key`` defaults to
    ``name``. Parameters are the function's keyword-only arguments, typed as plug-in parameters
    are (:mod:`mlrc.params`)."""
    return METRICS.register(
        name,
        kind=kind,
        depth=depth,
        param=param,
        key=key or name,
        key_without=key_without or name,
        needs=frozenset(needs),
        higher_is_better=higher_is_better,
        param_type=param_type,
    )


@dataclass(frozen=True)
class Metric:
    """One requested metric: registry ``name``, its ``params``, the column name ``key``
    (``"ndcg_at_10"``) and what it ``needs`` beyond embeddings and labels."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    needs: frozenset[str] = frozenset()
    higher_is_better: bool = True

    @property
    def info(self) -> MetricInfo:
        """The registry entry of :attr:`name`."""
        return METRICS.info(self.name)

    def __hash__(self) -> int:  # params is a dict: hash what identifies the column
        return hash((self.name, self.key))


@dataclass(frozen=True)
class Ranked:
    """What a ranking metric reads for a block of m queries (ranks 1..k, k ≥ its depth).

    ``rel`` (m × k float64 0/1): rank i holds a reference item of the query's class (0 past
    the end of the reference set); ``R`` (m,) float64 ≥ 1: reference items of the query's class
    (its own row excluded); ``super_rel`` / ``S`` / ``both``: the same for the query's
    super-class (``both``: items sharing class and super-class), only with super labels.
    """

    rel: np.ndarray
    R: np.ndarray
    super_rel: np.ndarray | None = None
    S: np.ndarray | None = None
    both: np.ndarray | None = None


@dataclass(frozen=True)
class PairScores:
    """Similarities of every (query, reference) pair but a query's own row, split by label:
    ``genuine`` (same class, all of them) and ``impostor_top`` (the largest impostor scores,
    descending, at least as many as the metric asked for through ``impostor_keep``) out of
    ``num_impostor`` impostor pairs. Similarity: −d(q, r), the ranking distance negated (on
    unit vectors 2·cos − 2, the order of cosine similarity)."""

    genuine: np.ndarray
    impostor_top: np.ndarray
    num_impostor: int


def parse_metrics(text: str) -> list[Metric]:
    """``"map_at_r,mrr,recall_at_k@10,fnmr_at_fmr@0.001"`` → metrics, in the order given.

    ``name@value`` sets the metric's ``@`` parameter; an unknown name, a missing or bad value or
    a repeated column is a one-line ``ValueError`` (with "did you mean").
    """
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(items):
        raise ValueError(f"metrics: expected a comma-separated list of names, got {text!r}")
    out = [_parse_one(item) for item in items]
    keys = [m.key for m in out]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"metrics: {', '.join(twice)} asked for twice in {text!r}")
    return out


def _parse_one(item: str) -> Metric:
    name, at, value = item.partition("@")
    name = name.strip()
    try:
        info: MetricInfo = METRICS.info(name)
    except RegistryError as e:
        raise ValueError(f"metrics: {e}") from None
    params = dict(info.params)
    if info.param is None:
        if at:
            raise ValueError(f"metrics: {name} takes no @ parameter, got {item!r}")
    elif at:
        params[info.param] = _value(item, value, info.param_type or info.types[info.param])
    elif params.get(info.param) is inspect.Parameter.empty:
        raise ValueError(f"metrics: {name} needs its {info.param}, e.g. {name}@10 ({item!r})")
    given = at or info.param is None
    key = info.key.format(**params) if given else info.key_without
    return Metric(name, params, key, info.needs, info.higher_is_better)


def _value(item: str, text: str, kind: ParamType) -> Any:
    """The ``@`` value of ``item`` as ``kind`` declares it; one line when it does not fit."""
    text = text.strip()
    number: Any = text
    if re.fullmatch(r"[-+]?\d+", text):
        number = int(text)
    elif re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        number = float(text)
    problem = kind.problem(number)
    if problem:
        raise ValueError(f"metrics: {item!r}: {problem}")
    return int(number) if kind.kind == "integer" else number


def higher_is_better(key: str) -> bool:
    """Direction of a result column ``key`` as stored (``"fnmr_at_fmr_0.1"``, ``"map_at_r"``):
    the registered metric whose column name it is says (False for error rates such as FNMR);
    a column no registered metric names (NMI, a built-in test-stage column) is higher-better."""
    for info in (METRICS.info(n) for n in METRICS.available()):
        if key == info.key_without or _template(info.key).fullmatch(key):
            return info.higher_is_better
    return True


def _template(key: str) -> re.Pattern[str]:
    """``"fnmr_at_fmr_{fmr}"`` → a pattern of the column names it formats to."""
    parts = re.split(r"\{[^}]*\}", key)
    return re.compile(".+".join(re.escape(p) for p in parts))


def check_needs(metrics: list[Metric], given: set[str]) -> None:
    """One-line ``ValueError`` naming the first metric whose extra inputs were not given."""
    for m in metrics:
        missing = sorted(m.needs - given)
        if missing:
            raise ValueError(
                f"metric {m.key} needs {', '.join(missing)} (query_super_labels and "
                f"reference_super_labels); use ndcg_at_k for plain class relevance"
                if "super_labels" in missing
                else f"metric {m.key} needs {', '.join(missing)}"
            )


def depth_of(metric: Metric, R: np.ndarray, available: int) -> np.ndarray:
    """Neighbours ``metric`` reads for each query (int64, ≤ ``available``)."""
    depth = metric.info.depth
    if depth == "R":
        need = R.astype(np.int64)
    elif isinstance(depth, int):
        need = np.full(len(R), depth, np.int64)
    else:
        value = metric.params.get(depth)
        need = np.full(len(R), FIRST_DEPTH if value is None else int(value), np.int64)
    return np.minimum(need, available)


def reads_to_first_hit(metric: Metric) -> bool:
    """The metric reads each query's ranking down to its first relevant item (its depth
    parameter is None, e.g. ``mrr`` without ``@K``)."""
    depth = metric.info.depth
    return isinstance(depth, str) and depth != "R" and metric.params.get(depth) is None
