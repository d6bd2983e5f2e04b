"""Presets: the protocol's numbers, shipped as package data (``mlrc/resources/presets``).

A study names a preset (``preset: cpu``) or gives a path to a preset YAML; its ``overrides``
are merged in, each key checked against the preset's fields.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from mlrc.config.load import (
    ConfigError,
    fields_at,
    load_yaml,
    model_at,
    resource_dir,
    validate_model,
)
from mlrc.config.schema import Preset

PRESETS_DIR = resource_dir("presets")  # in a checkout, studies/presets links here


def load_preset(
    name_or_path: str, overrides: dict[str, Any] | None = None, source: str = ""
) -> Preset:
    """A preset by name (``mlrc/resources/presets/<name>.yaml``, also reachable as
    ``studies/presets/``) or path, with ``overrides`` merged in."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESETS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            names = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
            close = difflib.get_close_matches(name_or_path, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{source or 'study'}: preset: unknown preset {name_or_path!r}{hint} "
                f"(available: {', '.join(names)}, or a path to a preset YAML)"
            )
    elif not path.is_file():
        raise ConfigError(
            f"{source or 'study'}: preset: {name_or_path} is not a file "
            f"(looked for {path.absolute()})"
        )
    data = load_yaml(path)
    if overrides and isinstance(data, dict):
        data = _deep_merge(data, overrides, f"{source}: overrides" if source else "overrides")
    return validate_model(
        Preset, data, str(path) if not overrides else f"{source}: preset {path.name} + overrides"
    )


def _deep_merge(base: dict, over: dict, where: str, loc: tuple = ()) -> dict:
    """``over`` merged into ``base``; a key checked against the preset's fields at ``loc``
    (free-form tables such as ``validate_every`` take any key)."""
    out = dict(base)
    fields = fields_at(Preset, loc) if model_at(Preset, loc) is not None else None
    for k, v in over.items():
        if fields is not None and k not in base and k not in fields:
            close = difflib.get_close_matches(str(k), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown preset field {k!r}{hint}")
        out[k] = (
            _deep_merge(base[k], v, f"{where}.{k}", (*loc, k))
            if isinstance(v, dict) and isinstance(base.get(k), dict)
            else v
        )
    return out


# How the value a search maximises is named, by the preset's selection_metric.
_METRIC_NAMES = {"map_at_r": "MAP@R", "precision_at_1": "R@1"}


def is_traditional(config: dict[str, Any] | None) -> bool:
    """Whether a stored study configuration (its resolved fingerprint) runs the traditional
    protocol: the epoch chosen on the test classes (test-set selection)."""
    preset = (config or {}).get("preset") or {}
    return isinstance(preset, dict) and preset.get("split_scheme") == "traditional"


def objective_label(config: dict[str, Any] | None) -> str:
    """The name of a study's search value for status lines and charts: ``val MAP@R`` in the
    reality check; ``test R@1 §`` (or ``test MAP@R §``) under the traditional preset, whose
    "validation" classes are the test classes (§: test-set selection)."""
    preset = (config or {}).get("preset") or {}
    metric = _METRIC_NAMES.get(preset.get("selection_metric") or "map_at_r", "MAP@R")
    return f"test {metric} §" if is_traditional(config) else f"val {metric}"
