"""Declared types (and ranges) of plug-in parameters, checked when a study file is validated.

A loss, miner or strategy factory declares each keyword-only parameter by its annotation; the
study's fixed values (``loss.params``, ``miner.params``, ``strategy.params``), its search choices
and ranges, and its enqueued trials are checked against it before anything trains, so that
``pos_margin: abc`` is one line (``loss.params.pos_margin: expected a number, got 'abc'``) and not
a ``TypeError`` deep inside a fold.

Annotations and what they accept:

- ``float`` — a finite number. An int is accepted (``margin: 1`` is 1.0); a boolean is not (YAML
  ``true`` is not 1), nor a string (YAML 1.1 reads ``1e-3`` as text: write ``1.0e-3``).
- ``int`` — a whole number. An integral float (``10.0``) is accepted, as every int parameter is
  cast with ``int()`` by its factory (PML does the same for FastAP's ``num_bins``); ``2.5`` is
  refused, since casting it would silently train with 2. A searched int parameter needs
  ``int: true`` (a float range would be truncated the same way).
- ``bool`` — ``true`` or ``false`` only.
- ``Literal["a", "b"]`` — one of the listed choices.
- ``Annotated[T, Range(...)]`` — T, within the range. A range is declared only where the method's
  definition bounds the value (a count ≥ 1, a temperature > 0 that divides, 1/α, a probability
  in [0, 1]); margins and scales carry none, since papers use negative margins (MLRC searched
  [−0.2, 2] for the Triplet and Margin losses). ``Unit`` only documents a unit (degrees).

A parameter without one of these annotations is unchecked (kind ``"any"``); the bad-input corpus
(tests/bad_inputs/test_param_types.py) requires every shipped parameter to declare one.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

Kind = Literal["number", "integer", "boolean", "choice", "any"]


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric parameter: ``ge``/``gt`` below, ``le``/``lt`` above (None: open)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def contains(self, v: float) -> bool:
        return not (
            (self.ge is not None and v < self.ge)
            or (self.gt is not None and v <= self.gt)
            or (self.le is not None and v > self.le)
            or (self.lt is not None and v >= self.lt)
        )

    def __str__(self) -> str:
        lo = f"[{_num(self.ge)}" if self.ge is not None else None
        lo = f"({_num(self.gt)}" if self.gt is not None else lo
        hi = f"{_num(self.le)}]" if self.le is not None else None
        hi = f"{_num(self.lt)})" if self.lt is not None else hi
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'≥' if lo[0] == '[' else '>'} {lo[1:]}"
        if hi:
            return f"{'≤' if hi[-1] == ']' else '<'} {hi[:-1]}"
        return ""


@dataclass(frozen=True)
class Unit:
    """The unit of a numeric parameter, for messages and documentation (e.g. "degrees")."""

    name: str


# Aliases used in the factories' signatures.
Positive = Annotated[float, Range(gt=0)]  # divides, or scales a log-sum-exp as 1/value
NonNegative = Annotated[float, Range(ge=0)]
Probability = Annotated[float, Range(ge=0, le=1)]
Count = Annotated[int, Range(ge=1)]
Degrees = Annotated[float, Unit("degrees")]


@dataclass(frozen=True)
class ParamType:
    """What a parameter accepts. ``problem(value)`` is None or why ``value`` is refused."""

    kind: Kind
    choices: tuple[Any, ...] = ()
    range: Range = Range()
    unit: str = ""

    def describe(self) -> str:
        """``"a number > 0"``, ``"an integer ≥ 1"``, ``"one of 'a', 'b'"``, ..."""
        if self.kind == "choice":
            return "one of " + ", ".join(map(repr, self.choices))
        if self.kind == "boolean":
            return "a boolean (true or false)"
        if self.kind == "any":
            return "any value"
        text = "a number" if self.kind == "number" else "an integer"
        bounds = str(self.range)
        text += f" {bounds}" if bounds else ""
        return text + (f" ({self.unit})" if self.unit else "")

    def problem(self, value: Any, check_range: bool = True) -> str | None:
        """None, or ``"expected <describe()>, got <value>"`` (``check_range=False``: the kind
        only — number, integer, boolean or choice)."""
        if self.kind == "any":
            return None
        if self.kind == "choice":
            ok = any(type(value) is type(c) and value == c for c in self.choices)
        elif self.kind == "boolean":
            ok = isinstance(value, bool)
        else:
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and (self.kind == "number" or float(value).is_integer())
                and (not check_range or self.range.contains(value))
            )
        if ok:
            return None
        hint = ""
        if isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+[eE][-+]?[0-9]+", value):
            fixed = re.sub("[eE]", ".0e", value)
            hint = f" (YAML reads {value} as text; write {fixed})"
        return f"expected {self.describe()}, got {value!r}{hint}"


ANY = ParamType("any")


def declared_types(
    factory: Callable[..., Any], skip: tuple[str, ...] = ("num_classes", "embedding_size")
) -> dict[str, ParamType]:
    """The ParamType of each keyword-only parameter of ``factory`` (but ``skip``), from its
    annotation; an annotation that cannot be read or is not one of the above gives ``ANY``."""
    import inspect

    out = {}
    for name, p in inspect.signature(factory).parameters.items():
        if p.kind != p.KEYWORD_ONLY or name in skip:
            continue
        ann = p.annotation
        if isinstance(ann, str):  # ``from __future__ import annotations``
            try:
                ann = eval(ann, getattr(factory, "__globals__", {}))  # noqa: S307 (our source)
            except Exception:  # noqa: BLE001 — a name the module cannot resolve: unchecked
                ann = p.empty
        out[name] = _from_annotation(ann)
    return out


def _from_annotation(ann: Any) -> ParamType:
    rng, unit = Range(), ""
    if typing.get_origin(ann) is Annotated:
        ann, *extras = typing.get_args(ann)
        for e in extras:
            rng = e if isinstance(e, Range) else rng
            unit = e.name if isinstance(e, Unit) else unit
    if typing.get_origin(ann) is Literal:
        return ParamType("choice", choices=typing.get_args(ann))
    kind = {bool: "boolean", int: "integer", float: "number"}.get(ann)
    return ParamType(kind, range=rng, unit=unit) if kind else ANY


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)
