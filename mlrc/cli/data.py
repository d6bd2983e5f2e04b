"""``mlrc data``: list, summarise and check the registered datasets; their untrained baselines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from mlrc import data
from mlrc.cli.terminal import check_device, console, fail
from mlrc.config import ConfigError
from mlrc.config.splits import build_split, resolve_split
from mlrc.data.base import DatasetError
from mlrc.protocol import Split, SplitError
from mlrc.registry import RegistryError

if TYPE_CHECKING:
    from mlrc.config import Preset
    from mlrc.train.throughput import PlainComparison, Throughput

__all__ = [
    "data_app",
    "data_baselines",
    "data_bench",
    "data_check",
    "data_list",
    "data_summary",
]

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


def _roles_line(ds: data.ImageDataset) -> str | None:
    """How a dataset with query/gallery roles or super-classes is tested (None: neither)."""
    import numpy as np

    parts = []
    if getattr(ds, "roles", None) is not None:
        roles = np.asarray(ds.roles)
        n = {r: int((roles == r).sum()) for r in ("train", "query", "gallery")}
        parts.append(
            f"roles: {n['train']} train, {n['query']} query, {n['gallery']} gallery images "
            "(tested query→gallery)"
        )
    if getattr(ds, "super_labels", None) is not None:
        parts.append(f"{len(np.unique(ds.super_labels))} super-classes")
    return "; ".join(parts) or None


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
    preset: Annotated[
        str, typer.Option(help="preset name or path: the decoded cache's size at its image size")
    ] = "reference",
) -> None:
    """Print class counts, the disk the preset's decoded cache takes (decoded images and
    evaluation crops, from the image headers: where it goes and the free space there) and the
    folds a study trains on a dataset: MLRC's split with the presets' defaults (scheme mlrc,
    4 folds), or the split --split/--scheme/--folds give."""
    from mlrc.config import load_preset

    try:
        p = load_preset(preset, source="--preset")
    except ConfigError as e:
        fail(str(e))
    ds = _load(name, root)
    counts = ds.class_counts()
    console.print(
        f"{ds.name}: {len(ds)} images, {ds.num_classes} classes, "
        f"{counts.min()}–{counts.max()} images per class"
    )
    for line in data.ignored_warning(ds):
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)
    console.print(_cache_line(ds, p, preset), highlight=False, soft_wrap=True)
    if (line := _roles_line(ds)) is not None:
        console.print(line, highlight=False, soft_wrap=True)
    parts = _split(ds, split, folds, scheme)
    console.print(parts.summary(), highlight=False)
    if split is not None:  # the classes by name, per part
        console.print(f"test classes: {_names(ds, parts.test_classes)}", highlight=False)
        for f in parts.folds:
            console.print(
                f"fold {f.index} validation classes: {_names(ds, f.val_classes)}", highlight=False
            )


def _cache_line(ds: data.ImageDataset, p: Preset, name: str) -> str:
    """One line: the bytes of ``ds``'s decoded cache + evaluation crops at the preset's image
    size, where they go, the free disk there."""
    from mlrc.data.cache import default_cache_dir, free_bytes, size_text
    from mlrc.data.estimate import estimate_cache_bytes

    im = p.image
    try:
        est = estimate_cache_bytes(ds, im.resize, im.crop)
    except DatasetError as e:
        fail(str(e))
    folder = default_cache_dir()
    total, images, crops = (size_text(n) for n in (est.total, est.decoded, est.eval_crops))
    off = "" if p.decoded_cache else f"; off in preset {name} (decoded_cache: false)"
    return (
        f"decoded cache (preset {name}, resize {im.resize}, crop {im.crop}): {total} ({images} "
        f"images + {crops} evaluation crops) in {folder}, {size_text(free_bytes(folder))} free "
        f"there{off}"
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
    for line in data.ignored_warning(ds):
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)
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


@data_app.command("bench")
def data_bench(
    dataset: Annotated[
        str, typer.Argument(help="a dataset name (mlrc data list) or a folder of <class>/<image>")
    ],
    root: RootOpt = None,
    preset: Annotated[str, typer.Option(help="preset name or path (its pipeline)")] = "reference",
    workers: Annotated[
        int | None, typer.Option(help="loader workers (default: the preset's num_workers)")
    ] = None,
    seconds: Annotated[float, typer.Option(help="seconds per measurement")] = 10.0,
    folds: Annotated[
        int | None,
        typer.Option(
            help="folds of the split whose first fold is measured (default: the preset's; "
            "2 for a folder of few classes)"
        ),
    ] = None,
    plain: Annotated[
        bool,
        typer.Option(
            "--plain",
            help="also time a plain PIL + torchvision chain of the same transforms, per core",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON only")] = False,
) -> None:
    """Measure a fold's input pipeline on this machine's CPUs: the decoded cache (built first,
    timed on its own), then images/s of training and evaluation (in total and per core) and the
    time to the first batch, against the images/s a GPU takes for the preset's trunk."""
    from mlrc.config import load_preset

    if workers is not None and workers < 0:
        fail(f"--workers: {workers} loader workers; give 0 (the main process) or more")
    if not seconds > 0:
        fail(f"--seconds: {seconds}; give a positive number of seconds")
    if folds is not None and folds < 2:
        fail(f"--folds: {folds}; give 2 or more")
    try:
        p = load_preset(preset, source="--preset")
    except ConfigError as e:
        fail(str(e))
    if workers is not None:
        p = p.model_copy(update={"num_workers": workers})
    if folds is not None:
        p = p.model_copy(update={"folds": folds})
    ds = _bench_dataset(dataset, root)
    parts = _split(ds, None, p.folds, p.split_scheme)
    train, val = _first_fold(parts)
    if not json_out:
        console.print(
            f"{ds.name}: {len(ds)} images; preset {preset}, fold 0 ({len(train)} training, "
            f"{len(val)} validation classes), {p.num_workers} loader workers",
            highlight=False,
        )
    result = _measure(p, ds, train, val, seconds, not json_out, plain)
    if json_out:
        print(json.dumps(result.to_json(), indent=2))
        return
    _print_bench(result, p)


def _bench_dataset(name: str, root: Path | None) -> data.ImageDataset:
    """A registered dataset (``--root`` as for the other data commands), or a folder of
    ``<class>/<image>`` (the ``image_folder`` dataset)."""
    if name in data.available():
        return _load(name, root)
    folder = Path(name)
    if folder.is_dir():
        if root is not None:
            fail(f"--root: {name} is a folder already; --root goes with a dataset name")
        return _load("image_folder", folder)
    if folder.exists() or "/" in name or name.startswith("."):
        fail(f"DATASET: {name}: no such folder (a folder of <class>/<image>, or a dataset name)")
    return _load(name, root)  # an unknown name: the registry's error, with the closest names


def _first_fold(parts: Split) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(training, validation) classes of the first fold; with no folds (the traditional
    scheme) the training half and the test classes that validate it."""
    if parts.folds:
        return parts.folds[0].train_classes, parts.folds[0].val_classes
    return parts.trainval_classes, parts.test_classes


def _measure(
    p: Preset,
    ds: data.ImageDataset,
    train: tuple[int, ...],
    val: tuple[int, ...],
    seconds: float,
    progress: bool,
    plain: bool,
) -> Throughput:
    """:func:`mlrc.train.throughput.measure`; an unreadable image or a fold the sampler cannot
    batch is one line."""
    from mlrc.errors import first_line, worker_message
    from mlrc.train.throughput import measure

    try:
        return measure(p, ds, train, val, seconds, progress, plain=plain)
    except (DatasetError, ValueError) as e:  # from a loader worker: its original message
        fail(first_line(worker_message(str(e))))


def _print_bench(result: Throughput, p: Preset) -> None:
    """The tables of ``mlrc data bench``: the CPU pipelines, the cache, the GPU, the verdict."""
    table = Table(title="Input pipeline on this machine's CPUs")
    for col in ("pipeline", "img/s", "per core", "first batch, first epoch", "later epoch"):
        table.add_column(col, justify="left" if col == "pipeline" else "right")
    for name, r in (("training", result.train), ("evaluation", result.eval)):
        table.add_row(
            name,
            f"{r.img_per_s:,.0f}",
            f"{r.per_core:,.0f}",
            f"{r.first_batch_s:.3f} s",
            f"{r.later_first_batch_s:.3f} s",
        )
    console.print(table)
    console.print(f"per core: over {result.cores} core(s) ({result.workers} loader workers)")
    c = result.cache
    if c.bytes:
        what = "built" if c.built else "opened (built before)"
        console.print(f"decoded cache {what} in {c.build_s:.1f} s, {c.bytes / 1e6:,.0f} MB")
    else:
        console.print(f"no decoded cache (preset decoded_cache: {p.decoded_cache})")
    if result.gpu is not None:
        g = result.gpu
        gpu = Table(title="What a GPU takes (training)")
        for col in ("trunk", "batch", "img/s", "GPU", "figure"):
            gpu.add_column(col, justify="right" if col in ("batch", "img/s") else "left")
        kind = "estimate †" if g.estimate else g.source
        gpu.add_row(g.trunk, str(g.batch), f"{g.img_per_s:,.0f}", g.gpu, kind)
        console.print(gpu)
        if g.estimate:
            console.print(f"† {g.source}; bench/gpu_fold.py measures it", highlight=False)
    if result.plain is not None:
        _print_plain(result.plain)
    console.print(result.verdict(), highlight=False)


def _print_plain(plain: PlainComparison) -> None:
    """Per core, the fold's pipeline against the plain chain (issue #22's goals: 3× and 10×)."""
    table = Table(title="Per core (main process, 1 thread): the fold's vs a plain PIL chain")
    for col in ("pipeline", "fold img/s", "plain img/s", "×", "goal"):
        table.add_column(col, justify="left" if col == "pipeline" else "right")
    for name, goal, fold, other in (
        ("training", "≥ 3×", plain.train_fold, plain.train_plain),
        ("evaluation", "≥ 10×", plain.eval_fold, plain.eval_plain),
    ):
        ratio = fold / other if other > 0 else 0.0
        table.add_row(name, f"{fold:,.0f}", f"{other:,.0f}", f"{ratio:.1f}", goal)
    console.print(table)
