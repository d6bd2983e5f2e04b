"""``mlrc demo``: a complete small study on the embedded default (glyphs × contrastive)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlrc.cli.interrupts import interrupts
from mlrc.cli.options import ArtifactsOpt, DeviceOpt, QuietOpt, StorageOpt, ThreadsOpt, fair_share
from mlrc.cli.terminal import (
    check_artifacts,
    check_device,
    console,
    print_report,
    print_status_by_name,
    user_errors,
)

if TYPE_CHECKING:
    from mlrc.config import ResolvedStudy

__all__ = ["demo", "demo_study"]


def demo(
    storage: StorageOpt = "sqlite:///mlrc-demo.db",
    artifacts: ArtifactsOpt = Path("mlrc-demo-artifacts"),
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    trials: Annotated[
        int | None, typer.Option(help="search trials (default: cpu preset, 4)")
    ] = None,
    reproductions: Annotated[
        int | None, typer.Option(help="test reproductions (default: cpu preset, 3)")
    ] = None,
    max_epochs: Annotated[
        int | None, typer.Option(help="epoch cap per fold (default: cpu preset, 16)")
    ] = None,
    threads: ThreadsOpt = None,
) -> None:
    """A complete small study on the embedded default: search, test stage, table with CIs."""
    import time

    from mlrc.cli.study import preflight
    from mlrc.search import open_study, run_search, run_test
    from mlrc.store import redact

    check_device(device)
    check_artifacts(artifacts)
    fair_share(threads, quiet)
    t0 = time.monotonic()
    with interrupts(), user_errors():
        resolved = demo_study(trials, reproductions, max_epochs)
        console.rule(f"[bold]mlrc demo[/bold]: {resolved.study.name}")
        console.print(
            f"glyphs × contrastive, preset cpu: {resolved.trials} trials × "
            f"{resolved.preset.folds} folds, then {resolved.reproductions} reproductions "
            f"× {resolved.preset.folds} folds",
            soft_wrap=True,
        )
        line = preflight(resolved, quiet)  # as every study's, before it is registered
        with open_study(resolved, storage, artifacts, device, progress=not quiet) as ctx:
            if line:
                console.print(line, soft_wrap=True, highlight=False)
            console.print(ctx.split.summary(), highlight=False)
            run_search(ctx)
            print_status_by_name(ctx.engine, ctx.name)
            for problem in run_test(ctx):
                console.print(f"[yellow]failed:[/yellow] {problem}", soft_wrap=True)
            print_report(ctx.engine, [ctx.name], "md")
    console.print(
        f"database: {redact(storage)}\nartifacts: {artifacts.resolve() / resolved.study.name}\n"
        f"wall time: {time.monotonic() - t0:.0f} s",
        soft_wrap=True,
    )


def demo_study(
    trials: int | None, reproductions: int | None, max_epochs: int | None
) -> ResolvedStudy:
    """The demo's study, resolved: glyphs × contrastive on the cpu preset (None: the preset's
    value), named ``demo-glyphs-contrastive-{hash of its configuration}``."""
    import hashlib

    from mlrc.config import StudyConfig, resolve, validate_model
    from mlrc.config.identity import canonical_json

    cfg = {
        "name": "demo",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"seed": 0, "trials": trials},
        "test": {"reproductions": reproductions},
        "overrides": {"max_epochs": max_epochs} if max_epochs else {},
    }
    resolved = resolve(validate_model(StudyConfig, cfg, "demo"), "demo")
    tag = hashlib.sha256(canonical_json(resolved.fingerprint()).encode()).hexdigest()[:8]
    resolved.study.name = f"demo-glyphs-contrastive-{tag}"
    return resolved
