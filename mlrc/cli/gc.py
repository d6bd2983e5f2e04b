"""``mlrc gc``: free the artifacts no study needs (archived studies, checkpoints that the
retention policy drops)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlrc.cli.options import DEFAULT_ARTIFACTS, DEFAULT_STORAGE, ArtifactsOpt, StorageOpt
from mlrc.cli.terminal import console, fail, user_errors

__all__ = ["gc", "human_bytes"]


def gc(
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    study: Annotated[
        list[str] | None, typer.Option("--study", help="only this study (repeatable)")
    ] = None,
    keep: Annotated[
        str | None,
        typer.Option(
            "--keep",
            help="apply this policy instead of each study's own (resume, best or all)",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list what would be freed, delete nothing")
    ] = False,
) -> None:
    """Free disk: the artifacts of archived studies (NAME.old-K) and the checkpoints of finished
    folds that each study's retention (artifacts.keep, as last run; default resume) no longer
    needs. Running folds and other stores' folders are never touched. Stored test embeddings
    (read by `mlrc study rescore`) stay under every policy; their size is shown."""
    from mlrc import store
    from mlrc.config import KEEP_POLICIES
    from mlrc.search.retention import gc as collect

    if keep is not None and keep not in KEEP_POLICIES:
        fail(f"--keep: expected one of {', '.join(KEEP_POLICIES)} (got {keep!r})")
    if not Path(artifacts).is_dir():
        fail(f"--artifacts {artifacts}: no such directory")
    with user_errors():
        engine = store.connect(storage, read_only=True)  # an existing store (never created)
        done = collect(engine, Path(artifacts), study or None, keep, dry_run)
    verb = "would free" if dry_run else "freed"
    table = Table(title=f"mlrc gc{' --dry-run' if dry_run else ''}: {artifacts}")
    for col in ("study", "policy", "files", verb, "embeddings kept"):
        table.add_column(col, justify="left" if col in ("study", "policy") else "right")
    for d in done:
        kept = human_bytes(d.embeddings_size)
        table.add_row(d.study, d.policy, str(len(d.freed)), human_bytes(d.size), kept)
    console.print(table)
    total = sum(d.size for d in done)
    files = sum(len(d.freed) for d in done)
    console.print(f"{verb} {human_bytes(total)} in {files} files", highlight=False)
    kept = sum(d.embeddings_size for d in done)
    n_kept = sum(len(d.embeddings) for d in done)
    console.print(
        f"kept {human_bytes(kept)} of stored test embeddings in {n_kept} files", highlight=False
    )


def human_bytes(n: int) -> str:
    """``1.2 GB``-style size (powers of 1000, as ``du --si``)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"
