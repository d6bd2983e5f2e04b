"""Comparison scopes: which studies a table may compare (see :mod:`mlrc.report.tables`).

A comparison is only fair within one protocol — its *comparison scope*
(:func:`comparison_scope`): everything in a study's
resolved configuration that defines its numbers except the methods compared and the budgets.
:func:`comparison_key` is its short hash; :func:`scope_differences` names the fields in which
a dataset's protocols differ, and :func:`fields_text` / :func:`diff_text` word them for a
block's header and the legend."""

from __future__ import annotations

import copy
import json
from typing import Any

from mlrc.config.identity import canonical_json, key_of
from mlrc.report.legend import DDAGGER, WARM

__all__ = [
    "MAX_SHOWN_FIELDS",
    "COMPARISON_EXCLUDED",
    "diff_text",
    "fields_text",
    "scope_differences",
    "comparison_key",
    "comparison_scope",
]

MAX_SHOWN_FIELDS = 4  # a protocol's header names at most this many differing fields

_BUDGET = "a budget: a different one within a protocol gets a note, not a block of its own"
# Paths (dot-separated) of ``mlrc_study.config`` (``ResolvedStudy.fingerprint()``) left out of a
# study's protocol, with the reason. See :func:`comparison_scope`.
COMPARISON_EXCLUDED: dict[str, str] = {
    "study.name": "the study's name, a label",
    "study.loss": "the method the table compares, with its fixed parameters and search space",
    "study.miner": "a method compared like the loss",
    "study.strategy": "a method compared like the loss (metrix, …)",
    "study.sampler": "the batch sampler: a training trick, compared like the miner",
    "space": "the searched parameters of the loss, miner and strategy",
    "fixed": "the fixed parameters of the loss, miner and strategy",
    "preset.loss_optimizer.lr": "the range of the loss's learning rate, a searched parameter "
    "of the loss (loss_lr in space)",
    "study.search.enqueue": "the search's first points, in the searched parameters",
    "study.search.warm_start": "the search's first points, from another study: a method "
    f"setting like enqueue, but not the reference's search — its rows are marked {WARM} with a "
    "note",
    "study.preset": "the preset's name or path: its resolved content is compared as preset",
    "study.overrides": "already merged into preset",
    "trials": _BUDGET,
    "reproductions": _BUDGET + " (the n column shows it)",
    "study.search.trials": _BUDGET,
    "study.test": _BUDGET + " (reproductions)",
    "preset.test": _BUDGET + " (reproductions)",
    "preset.search": "the preset's search defaults: trials is a budget; sampler, pruner and "
    "prune_startup are compared as resolved (sampler, pruner); seed and enqueue are unused "
    "(the study's search.seed is used)",
    "study.search.sampler": "compared as resolved (sampler)",
    "study.search.pruner": "compared as resolved (pruner)",
    "study.search.prune_startup": "compared as resolved (prune_startup)",
    "study.search.prune_p": "compared as resolved (prune_p)",
    "study.search.prune_delta": "compared as resolved (prune_delta)",
    "study.search.prune_alpha": "compared as resolved (prune_alpha)",
    "study.search.stop": "compared as resolved (stop)",
    "pruner": "opt-in pruning saves compute, like a smaller budget: its rows are marked "
    f"{DDAGGER} with a note (the rules and their measured risk) instead",
    "prune_startup": "part of the pruning, see pruner",
    "prune_p": "part of the pruning, see pruner",
    "prune_delta": "part of the pruning, see pruner",
    "prune_alpha": "part of the pruning, see pruner",
    "stop": "in-fold stopping (search.stop) is part of the pruning, see pruner",
}


def comparison_scope(config: dict | None) -> dict:
    """The protocol of a study: its resolved configuration (``mlrc_study.config``, the study's
    ``ResolvedStudy.fingerprint()``) without what a comparison table compares or counts.

    Left out (:data:`COMPARISON_EXCLUDED`):

    * the study's name (``study.name``), a label;
    * the methods compared: ``study.loss``, ``study.miner``, ``study.strategy``, and
      ``study.sampler`` — the batch sampler is a training trick too, compared like the miner —
      with their parameters: ``space``, ``fixed``, ``study.search.enqueue`` (first points of the
      search), ``study.search.warm_start`` (first points taken from another study; its rows are
      marked ¶ with a note, since it is not the reference's search) and
      ``preset.loss_optimizer.lr`` (the loss's learning-rate range, searched);
    * ``study.preset`` (the preset's name or path) and ``study.overrides``: the overrides are
      already merged into ``preset``, which is compared whole instead;
    * the budgets: ``trials``, ``reproductions``, ``study.search.trials``, ``study.test``,
      ``preset.test`` and ``preset.search`` (its ``trials``; its ``sampler``/``pruner`` are
      compared as resolved, its ``seed``/``enqueue`` are unused), and the inputs of the resolved
      ``sampler``/``pruner`` in ``study.search``. A different budget within a protocol gets a
      note, not a block of its own;
    * ``pruner``/``prune_startup``/``prune_p``/``stop``: opt-in pruning saves compute like a smaller budget;
      pruned rows keep their ‡ mark and note.

    What is left: the dataset (name, root, params), the resolved preset (trunk, weights, image
    sizes, batch, optimiser, epochs, patience, folds, split, precision, …), the search seed and
    the BO sampler (``sampler``), and any field a later mlrc adds. A non-dict config (stores
    that hold none) has the empty protocol."""
    out = copy.deepcopy(config) if isinstance(config, dict) else {}
    for path in COMPARISON_EXCLUDED:
        *parents, last = path.split(".")
        node: Any = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def comparison_key(config: dict | None) -> str:
    """Short hash (8 hex digits) of :func:`comparison_scope` ``(config)``: equal for two studies
    exactly when their protocols are equal."""
    return key_of(comparison_scope(config), 8)


_UNSET = object()


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


def scope_differences(protocols: list[dict]) -> list[tuple[str, list[Any]]]:
    """The dot-separated fields whose values are not the same in all ``protocols``, each with
    its value per protocol (``"unset"`` where a protocol lacks it), in first-seen order."""
    flat = [_flatten(p) for p in protocols]
    paths = list(dict.fromkeys(p for f in flat for p in f))
    out = []
    for path in paths:
        values = [f.get(path, _UNSET) for f in flat]
        if len({"\0unset" if v is _UNSET else canonical_json(v) for v in values}) > 1:
            out.append((path, ["unset" if v is _UNSET else v for v in values]))
    return out


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def fields_text(diffs: list[tuple[str, list[Any]]], i: int) -> str:
    """Protocol ``i``'s values of the differing fields: ``preset.max_epochs 1, …``."""
    shown = [f"{path} {_show(values[i])}" for path, values in diffs[:MAX_SHOWN_FIELDS]]
    more = len(diffs) - MAX_SHOWN_FIELDS
    return ", ".join(shown) + (f", … ({more} more fields)" if more > 0 else "")


def diff_text(diffs: list[tuple[str, list[Any]]]) -> str:
    """``preset.max_epochs 1 vs 2, …`` (values in the order of the dataset's protocols)."""
    shown = [
        f"{path} {' vs '.join(_show(v) for v in values)}"
        for path, values in diffs[:MAX_SHOWN_FIELDS]
    ]
    more = len(diffs) - MAX_SHOWN_FIELDS
    return ", ".join(shown) + (f", … ({more} more fields)" if more > 0 else "")
