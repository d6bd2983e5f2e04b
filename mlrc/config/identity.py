"""What says "the same numbers?": a study's fingerprint rules and the comparisons made with it.

A study's fingerprint (``ResolvedStudy.fingerprint()``, stored as ``mlrc_study.config``) is its
resolved configuration; this module holds what it leaves out and how two are compared:

- :data:`RUNTIME_ONLY`: preset fields that change speed, not numbers (left out always);
- :data:`LATER_FIELDS`: fields added after stores were written, left out while they hold the
  value that means "as before" (so an older study still matches its unchanged file);
- :data:`BUDGETS` and :func:`identity`: a fingerprint without its budgets (trials,
  reproductions), which may grow or shrink without changing a number;
- :func:`canonical_json` (equal values, equal strings: what hashes and comparisons use),
  :func:`first_difference` and :func:`identity_change`, the one "same configuration?" test of
  ``study run``, ``campaign run`` and ``--force-new``;
- the keys derived from it, all through :func:`key_of` (a short hash of the canonical JSON):
  :func:`params_hash` (a parameter set: 16 hex digits, keys fold runs), :func:`artifact_key`
  (what a fold computes besides its parameters, :func:`artifact_scope`: 12 hex digits, the
  ``p-<key>`` level of the artifact folders) and, in :mod:`mlrc.report.scopes`, the report's
  comparison key (8 hex digits); :func:`derive_seed` (a job's seed) and :func:`code_version`
  (what computed a result).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrc import __version__

__all__ = [
    "BUDGETS",
    "LATER_FIELDS",
    "RANKS",
    "RUNTIME_ONLY",
    "AnyOf",
    "artifact_key",
    "artifact_scope",
    "canonical_json",
    "code_version",
    "derive_seed",
    "drop_speed_and_later_defaults",
    "first_difference",
    "identity",
    "identity_change",
    "key_of",
    "params_hash",
    "random_augmentation",
]


# Preset fields that change speed, not the numbers (beyond float noise): not part of a study's
# identity, so a study can be resumed with them switched.
RUNTIME_ONLY = (
    "cudnn_benchmark",
    "pin_memory",
    "persistent_workers",
    "decoded_cache",
    "checkpoint_minutes",
    # the global batch is the study's; how many ranks share it is not — unless the training
    # input is drawn at random (random_augmentation): each rank draws its images' crops and
    # flips from its own stream, so K ranks compute other numbers than one process, and K ≠ 1
    # is then part of the identity (RANKS)
    "processes_per_trial",
)
RANKS = "processes_per_trial"


def random_augmentation(image: dict[str, Any] | None) -> bool:
    """The training input is drawn at random: a preset's ``image`` (as a fingerprint holds it)
    with flips, or a crop whose scale or aspect ratio is not fixed at 1 (the reference's
    RandomResizedCrop). Without it every rank computes what one process would."""
    image = image or {}
    fixed = [1.0, 1.0]
    scale, ratio = image.get("scale", [0.16, 1.0]), image.get("ratio", [0.75, 1.33])
    return bool(image.get("flip", True)) or list(scale) != fixed or list(ratio) != fixed


def _ranks_change_numbers(preset: dict[str, Any], k: Any) -> bool:
    """``k`` processes per trial compute other numbers than one (random augmentation)."""
    return k not in (None, 1) and random_augmentation(preset.get("image"))


@dataclass(frozen=True)
class AnyOf:
    """Several values of a later field that each mean "as before"."""

    values: tuple[Any, ...]


# Fields added in mlrc 0.2 (performance and pruning), with the value that means "as before".
LATER_FIELDS: dict[tuple[str, ...], Any] = {
    **{
        ("preset", k): v
        for k, v in {
            "amp": "off",
            "channels_last": False,
            "cudnn_benchmark": False,
            "pin_memory": False,
            "persistent_workers": False,
            "decoded_cache": False,
        }.items()
    },
    **{
        (part, "search", k): None
        for part in ("study", "preset")
        for k in ("pruner", "prune_startup", "prune_p", "stop", "prune_delta", "prune_alpha")
    },
    ("pruner",): "none",
    ("prune_startup",): 5,
    # Wilcoxon pruning and in-fold stopping (#25)
    ("prune_p",): 0.3,
    ("stop",): None,
    # the sequential pruner (#42)
    ("prune_delta",): 0.04,
    ("prune_alpha",): 0.05,
    # timm trunks and the modern preset
    ("preset", "freeze_layernorm"): False,
    ("preset", "normalize"): None,
    ("preset", "optimizer", "name"): "rmsprop",
    # custom splits (a study's ``split:``)
    ("split",): None,
    # the traditional protocol (#16): optimisers, schedules, selection
    ("preset", "loss_optimizer", "name"): "rmsprop",
    ("preset", "selection_metric"): "map_at_r",
    ("preset", "lr_schedule"): None,
    ("preset", "warmup_epochs"): 0,
    # GPU numerics and on-device augmentation (#22)
    # every fold before them ran on a CPU (no TF32 there): unset and off are what they computed
    ("preset", "tf32"): AnyOf((None, False)),
    ("preset", "deterministic"): False,
    ("preset", "augment_on_device"): False,
    # warm starts (#25): like ``search.enqueue``, part of the identity (they decide which
    # parameters are tried); left out where unset, as studies before them
    **{(part, "search", "warm_start"): None for part in ("study", "preset")},
    # search.stop's slack on the fold that trains (#25, the 50-trial corpus): 0 is the rule
    # before it; the default is not, so a study stopped by the older rule is not resumed by
    # the newer one unless its file says fold_slack: 0
    **{
        (*part, "stop", "fold_slack"): 0.0
        for part in ((), ("study", "search"), ("preset", "search"))
    },
}


# Where a fingerprint holds the budgets, by the field a user changes (the study file's
# ``search.trials``, ``test.reproductions``): the resolved value first, then the file's and the
# preset's. Budgets add work, they do not change a number: a study may grow or shrink.
BUDGETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "search.trials": (("trials",), ("study", "search", "trials"), ("preset", "search", "trials")),
    "test.reproductions": (
        ("reproductions",),
        ("study", "test", "reproductions"),
        ("preset", "test", "reproductions"),
    ),
}


def identity(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint without its budgets: two studies with equal identities compute the same
    numbers for the same work, whatever their numbers of trials and reproductions (and the
    :data:`RUNTIME_ONLY` fields a study file's ``overrides`` sets: the resolved preset has them
    dropped already)."""
    out = copy.deepcopy(fingerprint)
    for paths in BUDGETS.values():
        for *parents, key in paths:
            node = out
            for p in parents:
                node = node.get(p) or {}
            node.pop(key, None)
    overrides = (out.get("study") or {}).get("overrides") or {}
    for key in RUNTIME_ONLY:  # also where the study file sets them: how fast, not what
        if key != RANKS or not _ranks_change_numbers(out.get("preset") or {}, overrides.get(key)):
            overrides.pop(key, None)
    return out


def drop_speed_and_later_defaults(fingerprint: dict[str, Any]) -> None:
    """Remove, in place, the :data:`RUNTIME_ONLY` preset fields and every :data:`LATER_FIELDS`
    field that holds its "as before" value."""
    preset = fingerprint["preset"]
    for key in RUNTIME_ONLY:  # how fast, not what is computed: may change on resume
        if key != RANKS or not _ranks_change_numbers(preset, preset.get(key)):
            preset.pop(key, None)
    for path, default in LATER_FIELDS.items():
        *parents, key = path
        node = fingerprint
        for p in parents:
            node = node.get(p) or {}
        if key in node and (
            node[key] in default.values if isinstance(default, AnyOf) else node[key] == default
        ):
            del node[key]


def canonical_json(obj: Any) -> str:
    """``obj`` as JSON with sorted keys and no spaces: equal values give equal strings (hashes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def first_difference(a: Any, b: Any, where: str = "") -> str:
    """``"path.to.key: <a> in the store, <b> now"`` for the first key where ``a`` and ``b``
    differ (dictionaries compared recursively, keys in sorted order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{where}.{k}" if where else k)
    return f"{where}: {a!r} in the store, {b!r} now"


def identity_change(stored: dict[str, Any], fingerprint: dict[str, Any]) -> str | None:
    """``None`` when a stored study (its fingerprint ``stored``) and ``fingerprint`` compute the
    same numbers (equal :func:`identity`), else the first difference
    (:func:`first_difference`): the one comparison of ``study run``, ``campaign run`` and
    ``--force-new``."""
    old, new = identity(stored), identity(fingerprint)
    if canonical_json(old) == canonical_json(new):
        return None
    return first_difference(old, new)


# --- keys derived from a configuration -------------------------------------------------------


def key_of(obj: Any, digits: int) -> str:
    """The first ``digits`` hex digits of the SHA-256 of ``obj``'s :func:`canonical_json`:
    equal for equal values. Every key below (and the report's comparison key) is one."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:digits]


def params_hash(params: dict[str, Any]) -> str:
    """16 hex digits identifying a parameter set (fold runs are keyed by it)."""
    return key_of(params, 16)


def artifact_scope(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What defines a fold's numbers besides its parameters, fold, reproduction and seed, from
    a study's fingerprint (as stored in ``mlrc_study.config``): the dataset, the
    loss/miner/strategy/batch sampler *names* (their values are the parameters), the study
    seed, and the resolved preset without its budgets (``search``, ``test``: trials and
    reproductions add work, they do not change a fold). The search space, enqueued points, BO
    sampler and pruner decide which parameters are tried, not what a fold with given parameters
    computes. A custom split (the study's ``split:``) is part of it too; without one the scope
    is as before."""
    study, preset = fingerprint["study"], dict(fingerprint["preset"])
    for budget in ("search", "test"):
        preset.pop(budget, None)
    out = {
        "dataset": study["dataset"],
        "loss": study["loss"]["name"],
        "miner": (study.get("miner") or {}).get("name"),
        "strategy": (study.get("strategy") or {}).get("name"),
        "sampler": study["sampler"],
        "seed": study["search"]["seed"],
        "preset": preset,
    }
    if (
        fingerprint.get("split") is not None
    ):  # a custom split (absent from fingerprints without one)
        out["split"] = fingerprint["split"]
    return out


def artifact_key(fingerprint: dict[str, Any]) -> str:
    """12 hex digits of :func:`artifact_scope`: the ``p-<key>`` artifact folder level that
    keeps checkpoints of different configurations apart (a new store never adopts another
    configuration's folds)."""
    return key_of(artifact_scope(fingerprint), 12)


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from the study seed and the job's identity (stable across runs)."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


@functools.cache
def code_version() -> str:
    """mlrc's version, with the git commit when running from a checkout (``0.1.0+g1a2b3c4``,
    ``-dirty`` when it has uncommitted changes): recorded with every result it computes."""
    here = Path(__file__).resolve().parents[2]
    if not (here / ".git").exists():  # an installed package: its version says it
        return __version__
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{out}" if out else __version__
