"""The campaign file: a grid of studies — dataset × loss [× strategy] — with one preset and one
budget, validated (:func:`parse_campaign`, :func:`load_campaign`) and unfolded into its studies
(:func:`cells`), each resolved like a study file (:func:`resolve_campaign`).

Every cell of the grid is an ordinary study, named ``{campaign}-{dataset}-{loss}[-{strategy}]``
(:func:`study_name`). Running and watching a campaign is :mod:`mlrc.search.campaign_runner`'s job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from mlrc.config import (
    ConfigError,
    DatasetRef,
    LossRef,
    MinerRef,
    ResolvedStudy,
    SamplerRef,
    SearchSpec,
    StrategyRef,
    Strict,
    StudyConfig,
    TestSpec,
    format_error,
    load_yaml,
    not_a_mapping,
    resolve,
)
from mlrc.config.schema import ArtifactsSpec, TrackingSpec

__all__ = [
    "NAME_PATTERN",
    "CampaignConfig",
    "CampaignDataset",
    "CampaignLoss",
    "CampaignStrategy",
    "Cell",
    "cells",
    "is_campaign_file",
    "load_campaign",
    "parse_campaign",
    "resolve_campaign",
    "sanitize",
    "study_name",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


# --- the campaign file -------------------------------------------------------------------------


class CampaignDataset(DatasetRef):
    """A study's ``dataset`` plus an optional ``label`` (column title and name part) and the
    dataset's own preset ``overrides`` (its keys replace the campaign's: a batch the dataset's
    folds allow)."""

    label: str | None = None
    overrides: dict[str, Any] = {}


class CampaignLoss(LossRef):
    """A study's ``loss`` (``name``, ``params``, ``search``) plus an optional ``label`` (row title
    and name part: needed when one loss appears twice), the loss's own ``enqueue`` list and its
    own ``miner`` (instead of the campaign's: the reality check's "MS + miner" row)."""

    label: str | None = None
    enqueue: list[dict[str, Any]] = []
    miner: MinerRef | None = None


class CampaignStrategy(StrategyRef):
    """A study's ``strategy`` plus an optional ``label``."""

    label: str | None = None


def _named(items: Any) -> Any:
    """``[contrastive, {name: triplet}]`` → every plain name becomes ``{name: ...}``."""
    if isinstance(items, list):
        return [{"name": x} if isinstance(x, str) else x for x in items]
    return items


class CampaignConfig(Strict):
    """A campaign file, validated (study-level checks happen in :func:`resolve_campaign`)."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    datasets: list[CampaignDataset] = Field(min_length=1)
    losses: list[CampaignLoss] = Field(min_length=1)
    strategies: list[CampaignStrategy | None] = Field([None], min_length=1)
    preset: str = "cpu"
    miner: MinerRef | None = None
    sampler: SamplerRef = SamplerRef()
    search: SearchSpec = SearchSpec()
    test: TestSpec = TestSpec()
    tracking: TrackingSpec | None = None  # passed to every study; not in their fingerprints
    artifacts: ArtifactsSpec = ArtifactsSpec()  # retention of every study; not in fingerprints
    overrides: dict[str, Any] = {}

    @field_validator("datasets", "losses", "strategies", mode="before")
    @classmethod
    def _plain_names(cls, v: Any) -> Any:
        return _named(v)

    @model_validator(mode="after")
    def _no_shared_enqueue(self) -> CampaignConfig:
        if self.search.enqueue:
            raise ValueError(
                "search.enqueue: parameters differ per loss; give `enqueue` in a loss item "
                "({name: contrastive, enqueue: [{pos_margin: 0, neg_margin: 0.5}]})"
            )
        return self


def parse_campaign(
    data: Any, source: str = "campaign", base: Path | None = None, check_roots: bool = True
) -> CampaignConfig:
    """Validate a campaign mapping. Relative dataset roots resolve as in a study file: the
    working directory, then ``base`` (the campaign file's folder); ``check_roots=False`` leaves
    them as written (for ``status``, which trains nothing)."""
    if not isinstance(data, dict):
        raise ConfigError(not_a_mapping(data, source))
    try:
        cfg = CampaignConfig.model_validate(data)
    except ValidationError as e:
        # one line naming the file and key; unknown keys get a "did you mean" (also in lists)
        raise ConfigError(format_error(source, e, CampaignConfig)) from None
    if check_roots:
        _find_roots(cfg, source, base)
    cells(cfg, source)  # derived names: valid and distinct
    return cfg


def _find_roots(cfg: CampaignConfig, source: str, base: Path | None) -> None:
    """Replace each dataset ``root`` by the absolute path it names: relative to the working
    directory, else to ``base``; a root found in neither is a :class:`ConfigError`."""
    from mlrc import data
    from mlrc.config.checks import check_root

    for i, ds in enumerate(cfg.datasets):
        if ds.name in data.available():  # an unknown name: resolving its studies says so
            check_root(ds.name, ds.root, f"{source}: datasets.{i}.root")
        if ds.root is None:
            continue
        candidates = [Path(ds.root).expanduser()]
        if base is not None:
            candidates.append(base / ds.root)
        found = next((c for c in candidates if c.exists()), None)
        if found is None:
            looked = " and ".join(dict.fromkeys(str(c.resolve()) for c in candidates))
            raise ConfigError(
                f"{source}: datasets.{i}.root: {ds.root} does not exist (looked in {looked})"
            )
        ds.root = str(found.resolve())


def load_campaign(path: str | Path, check_roots: bool = True) -> CampaignConfig:
    """Read and validate a campaign file (its studies are resolved by :func:`resolve_campaign`)."""
    path = Path(path)
    return parse_campaign(load_yaml(path), str(path), path.parent, check_roots)


def is_campaign_file(path: str | Path) -> bool:
    """Does ``path`` hold a campaign (``datasets:`` and ``losses:``) rather than a study? False
    for a file that cannot be read or parsed: the study's loader then says why."""
    try:
        doc = load_yaml(Path(path))
    except ConfigError:
        return False
    return isinstance(doc, dict) and "losses" in doc and "datasets" in doc


# --- the grid ----------------------------------------------------------------------------------


def sanitize(part: str) -> str:
    """A name part with every run of characters outside ``[A-Za-z0-9._-]`` replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", part).strip("-") or "x"


def study_name(campaign: str, dataset: str, loss: str, strategy: str | None = None) -> str:
    """``{campaign}-{dataset}-{loss}`` plus ``-{strategy}`` when a strategy is set, sanitised."""
    parts = [campaign, dataset, loss] + ([strategy] if strategy else [])
    return "-".join(sanitize(p) for p in parts)


@dataclass(frozen=True)
class Cell:
    """One study of the grid: its position (order of the campaign), column and row titles."""

    position: int
    column: str  # dataset label
    row: str  # loss label [+ strategy label]
    where: tuple[int, int, int]  # indices into datasets, losses, strategies
    study: StudyConfig

    @property
    def name(self) -> str:
        """The study's name."""
        return self.study.name


def _label(item: Any) -> str:
    return item.label or item.name


def _cell_study(
    cfg: CampaignConfig,
    name: str,
    ds: CampaignDataset,
    loss: CampaignLoss,
    strategy: CampaignStrategy | None,
) -> StudyConfig:
    """The study file of one cell: the campaign's shared keys, the cell's dataset, loss (with
    its own ``enqueue`` list and ``miner``, if any) and strategy."""
    miner = loss.miner if loss.miner is not None else cfg.miner
    return StudyConfig.model_validate(
        {
            "name": name,
            "dataset": ds.model_dump(by_alias=True, exclude={"label", "overrides"}),
            "preset": cfg.preset,
            "loss": loss.model_dump(by_alias=True, exclude={"label", "enqueue", "miner"}),
            "miner": miner.model_dump(by_alias=True) if miner else None,
            "strategy": (
                strategy.model_dump(by_alias=True, exclude={"label"})
                if strategy is not None
                else None
            ),
            "sampler": cfg.sampler.model_dump(by_alias=True),
            "search": {**cfg.search.model_dump(by_alias=True), "enqueue": loss.enqueue},
            "test": cfg.test.model_dump(by_alias=True),
            "tracking": cfg.tracking.model_dump() if cfg.tracking is not None else None,
            "artifacts": cfg.artifacts.model_dump(),
            "overrides": {**cfg.overrides, **ds.overrides},
        }
    )


def _same_name(source: str, name: str, a: tuple[int, int, int], b: tuple[int, int, int]) -> str:
    """The error for two cells (at ``a`` and ``b``) that derive the same study name."""
    what = next(
        f"{key}.{b[n]} and {key}.{a[n]}"
        for n, key in enumerate(("datasets", "losses", "strategies"))
        if a[n] != b[n]
    )
    return (
        f"{source}: {what} give the same study name {name!r}; set a distinct `label` on one of them"
    )


def cells(cfg: CampaignConfig, source: str = "campaign") -> list[Cell]:
    """The studies of the campaign in order: datasets, then losses, then strategies."""
    out: list[Cell] = []
    seen: dict[str, tuple[int, int, int]] = {}
    for i, ds in enumerate(cfg.datasets):
        for j, loss in enumerate(cfg.losses):
            for k, strategy in enumerate(cfg.strategies):
                s_label = _label(strategy) if strategy is not None else None
                name = study_name(cfg.name, _label(ds), _label(loss), s_label)
                if name in seen:
                    raise ConfigError(_same_name(source, name, seen[name], (i, j, k)))
                seen[name] = (i, j, k)
                study = _cell_study(cfg, name, ds, loss, strategy)
                row = _label(loss) + (f" + {s_label}" if s_label else "")
                out.append(Cell(len(out), _label(ds), row, (i, j, k), study))
    return out


# --- resolving every study ---------------------------------------------------------------------

_SHARED = ("overrides", "preset", "unknown preset", "sampler", "test")
_STUDY_FIELDS = (("loss", "losses", 1), ("dataset", "datasets", 0), ("strategy", "strategies", 2))


def _in_campaign(message: str, source: str, cell: Cell, own_miner: bool = False) -> str:
    """A study-level error of :func:`resolve` with its key written as the campaign's key
    (``loss.name`` → ``losses.3.name``), or with the study named when the key is shared."""
    rest = message.removeprefix(f"{source}: ")
    if rest.startswith("search.enqueue."):  # a loss item's own enqueue list
        return f"{source}: losses.{cell.where[1]}.enqueue.{rest.removeprefix('search.enqueue.')}"
    if own_miner and rest.startswith(("miner.", "miner:", "miner ")):  # a loss item's own miner
        return f"{source}: losses.{cell.where[1]}.{rest}"
    for key, campaign_key, n in _STUDY_FIELDS:
        item = f"{campaign_key}.{cell.where[n]}"
        if rest.startswith((f"{key}.", f"{key}:")):
            return f"{source}: {item}{rest[len(key) :].replace(f'{key}.', f'{item}.')}"
        if rest.startswith(f"{key} "):
            return f"{source}: {item}: {rest}"
    if rest.startswith(_SHARED):  # a key every study shares: the campaign's own key
        return message
    return f"{message} (study {cell.name})"


def resolve_campaign(
    cfg: CampaignConfig, source: str = "campaign"
) -> list[tuple[Cell, ResolvedStudy]]:
    """Every study of the campaign resolved (preset, search space, names checked), so that a
    mistake in the last loss stops the campaign before the first study trains."""
    plan = []
    for cell in cells(cfg, source):
        try:
            resolved = resolve(cell.study, source)
        except ConfigError as e:
            own_miner = cfg.losses[cell.where[1]].miner is not None
            raise ConfigError(_in_campaign(str(e), source, cell, own_miner)) from None
        plan.append((cell, resolved))
    return plan
