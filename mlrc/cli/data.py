"""``mlrc data``: list, summarise and check the registered datasets; their untrained baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlrc import data
from mlrc.config import ConfigError
from mlrc.config.splits import build_split, resolve_split
from mlrc.data.base import DatasetError
from mlrc.protocol import Split, SplitError
from mlrc.registry import RegistryError
from mlrc.terminal import check_device, console, fail

__all__ = ["data_app", "data_baselines", "data_check", "data_list", "data_summary"]

data_app = typer.Typer(no_args_is_help=True, help="Datasets: list, summarise, check.")

DatasetOpt = Annotated[str, typer.Option("--dataset", "-d", help="dataset name (mlrc data list)")]
RootOpt = Annotated[Path | None, typer.Option("--root", help="dataset root (folder or zip)")]
SchemeOpt = Annotated[str, typer.Option(help="fold scheme: kfold, mlrc or traditional")]
SplitOpt = Annotated[
    str | None,
    typer.Option(
        "--split",
        help="a split file (YAML/JSON: test classes, fold validation classes or a scheme) or "
        "'predefined' (the dataset's own train/test lists); default: MLRC's halves",
    ),
]


def _load(name: str, root: Path | None) -> data.ImageDataset:
    if root is None and name in data.NEEDS_ROOT:
        fail(f"--root: dataset {name!r} needs a root directory (--root PATH)")
    try:
        return data.build(name, root=root)
    except (DatasetError, RegistryError) as e:
        fail(str(e))


@data_app.command("list")
def data_list() -> None:
    """List the registered datasets."""
    for name in data.available():
        doc = (data.DATASETS.get(name).__doc__ or "").strip().splitlines()[0]
        console.print(f"[bold]{name:13}[/bold] {doc}", highlight=False)


def _split(ds: data.ImageDataset, split: str | None, folds: int, scheme: str) -> Split:
    """MLRC's split of ``ds``, or the one ``--split`` names (``scheme``/``folds``: defaults)."""
    try:
        spec = resolve_split(split, ds.name, folds, scheme, "--split")
        return build_split(spec, ds, folds, scheme, "--split")
    except (ConfigError, SplitError) as e:
        fail(str(e))


def _names(ds: data.ImageDataset, ids: tuple[int, ...], limit: int = 20) -> str:
    """The class names of ``ids`` (the first ``limit``, then how many more)."""
    names = ", ".join(ds.class_names[c] for c in ids[:limit])
    return names + (f", … ({len(ids) - limit} more)" if len(ids) > limit else "")


@data_app.command("summary")
def data_summary(
    name: Annotated[str, typer.Argument(help="dataset name")] = "glyphs",
    root: RootOpt = None,
    scheme: Annotated[
        str,
        typer.Option(
            help="fold scheme: mlrc (a study's default: the presets' split_scheme), kfold or "
            "traditional (no folds: the test classes validate)"
        ),
    ] = "mlrc",
    folds: Annotated[int, typer.Option(help="number of folds")] = 4,
    split: SplitOpt = None,
) -> None:
    """Print class counts and the folds a study trains on a dataset: MLRC's split with the
    presets' defaults (scheme mlrc, 4 folds), or the split --split/--scheme/--folds give."""
    ds = _load(name, root)
    counts = ds.class_counts()
    console.print(
        f"{ds.name}: {len(ds)} images, {ds.num_classes} classes, "
        f"{counts.min()}–{counts.max()} images per class"
    )
    parts = _split(ds, split, folds, scheme)
    console.print(parts.summary(), highlight=False)
    if split is not None:  # the classes by name, per part
        console.print(f"test classes: {_names(ds, parts.test_classes)}", highlight=False)
        for f in parts.folds:
            console.print(
                f"fold {f.index} validation classes: {_names(ds, f.val_classes)}", highlight=False
            )


@data_app.command("check")
def data_check(
    name: Annotated[str, typer.Argument(help="dataset name")], root: RootOpt = None
) -> None:
    """Decode every image once and list every file that cannot be read — missing, empty,
    corrupt, too large — (exit 1 if any)."""
    from mlrc.data.base import listing_bad_files
    from mlrc.data.verify import decode_failures  # the pre-flight of a study decodes the same

    with listing_bad_files() as found:  # missing and empty files: listed, not the first only
        ds = _load(name, root)
    listed = {origin for origin, _ in found}
    rest = [i for i in range(len(ds)) if ds.origins[i] not in listed]
    bad = [message for _, message in found]
    bad += [message for _, message in decode_failures(ds, rest)]
    for msg in bad:
        console.print(f"[red]bad:[/red] {msg}", highlight=False, soft_wrap=True)
    console.print(f"{len(ds) - len(bad)} of {len(ds)} images readable")
    if bad:
        raise typer.Exit(1)


@data_app.command("baselines")
def data_baselines(
    dataset: DatasetOpt = "glyphs",
    root: RootOpt = None,
    scheme: SchemeOpt = "mlrc",
    reproductions: Annotated[int, typer.Option(help="random embedders for the CI")] = 5,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N")] = "cpu",
    split_file: SplitOpt = None,
) -> None:
    """Untrained baselines on the test half: raw pixels and random 128-D linear embedders (95% CIs)."""
    check_device(device)
    ds = _load(dataset, root)
    console.rule(f"[bold]{ds.name}[/bold]: {len(ds)} images, {ds.num_classes} classes")
    split = _split(ds, split_file, 4, scheme)
    console.print(split.summary(), highlight=False)
    if reproductions < 2:
        fail("--reproductions must be at least 2 for a confidence interval")
    console.print(_baselines_table(ds, split, reproductions, device))
    console.print("± is the half-width of the 95% t-interval over the random embedders.")


def _baselines_table(ds: data.ImageDataset, split: Split, reproductions: int, device: str) -> Table:
    """The table of ``mlrc data baselines``: raw pixels, then ``reproductions`` random 128-D
    linear embedders as mean ± half-width of the 95% CI, on the test half of ``split``."""
    import numpy as np

    from mlrc.models.baselines import pixel_features, random_embedder
    from mlrc.protocol import confidence_interval, retrieval_metrics

    test_idx = np.flatnonzero(np.isin(ds.labels, split.test_classes))
    pixels = pixel_features(ds, test_idx)
    labels = ds.labels[test_idx]
    table = Table(title=f"Test half ({len(split.test_classes)} classes, {len(test_idx)} images), %")
    for col in ("embedder", "dim", "n", "MAP@R", "P@1", "R-Precision"):
        table.add_column(col, justify="right" if col != "embedder" else "left")
    m = retrieval_metrics(pixels, labels, device=device)
    table.add_row(
        "raw pixels",
        str(pixels.shape[1]),
        "1",
        *(f"{100 * m[k]:.2f}" for k in ("map_at_r", "precision_at_1", "r_precision")),
    )
    runs = [
        retrieval_metrics(random_embedder(pixels, 128, seed=s), labels, device=device)
        for s in range(reproductions)
    ]
    cells = []
    for k in ("map_at_r", "precision_at_1", "r_precision"):
        mean, hw = confidence_interval([100 * r[k] for r in runs])
        cells.append(f"{mean:.2f} ± {hw:.2f}")
    table.add_row("untrained linear (random)", "128", str(reproductions), *cells)
    return table
