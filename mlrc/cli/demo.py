"""``mlrc demo``: a small reality check on the embedded default: one complete study per loss
(glyphs × contrastive and glyphs × multi-similarity), then the report that compares them."""

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

__all__ = ["DEMO_LOSSES", "demo", "demo_study"]

# The demo compares two losses of the reality check (its method 1 and the multi-similarity loss).
DEMO_LOSSES = ("contrastive", "multi_similarity")


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
    losses: Annotated[
        str, typer.Option(help="losses compared, comma-separated: one study each")
    ] = ",".join(DEMO_LOSSES),
    threads: ThreadsOpt = None,
) -> None:
    """A small reality check on the embedded default: per loss a complete study (search, test
    stage), then one table with CIs and the ranking's stability."""
    import time

    from mlrc.store import connect, redact

    check_device(device)
    check_artifacts(artifacts)
    fair_share(threads, quiet)
    t0 = time.monotonic()
    with interrupts(), user_errors():
        studies = [demo_study(trials, reproductions, max_epochs, loss) for loss in _losses(losses)]
        for resolved in studies:
            _run_one(resolved, storage, artifacts, device, quiet)
        print_report(connect(storage), [r.study.name for r in studies], "md")
    console.print(
        f"database: {redact(storage)}\nartifacts: {artifacts.resolve()}\n"
        f"wall time: {time.monotonic() - t0:.0f} s",
        soft_wrap=True,
    )


def _losses(text: str) -> list[str]:
    """The comma-separated loss names, each registered (one line naming an unknown one)."""
    from mlrc.methods import losses as registry

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise typer.BadParameter("name at least one loss", param_hint="--losses")
    for name in names:
        try:
            registry.info(name)
        except KeyError as e:  # RegistryError: "unknown loss 'x'; did you mean ...?"
            raise typer.BadParameter(str(e), param_hint="--losses") from None
    return list(dict.fromkeys(names))


def _run_one(
    resolved: ResolvedStudy, storage: str, artifacts: Path, device: str, quiet: bool
) -> None:
    """One demo study: preflight, search, status, test stage."""
    from mlrc.cli.study import preflight
    from mlrc.search import open_study, run_search, run_test

    console.rule(f"[bold]mlrc demo[/bold]: {resolved.study.name}")
    console.print(
        f"glyphs × {resolved.study.loss.name}, preset cpu: {resolved.trials} trials × "
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


def demo_study(
    trials: int | None,
    reproductions: int | None,
    max_epochs: int | None,
    loss: str = "contrastive",
) -> ResolvedStudy:
    """A demo study, resolved: glyphs × ``loss`` on the cpu preset (None: the preset's value),
    named ``demo-glyphs-{loss}-{hash of its configuration}``."""
    import hashlib

    from mlrc.config import StudyConfig, resolve, validate_model
    from mlrc.config.identity import canonical_json

    cfg = {
        "name": "demo",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": loss},
        "search": {"seed": 0, "trials": trials},
        "test": {"reproductions": reproductions},
        "overrides": {"max_epochs": max_epochs} if max_epochs else {},
    }
    resolved = resolve(validate_model(StudyConfig, cfg, "demo"), "demo")
    tag = hashlib.sha256(canonical_json(resolved.fingerprint()).encode()).hexdigest()[:8]
    resolved.study.name = f"demo-glyphs-{loss.replace('_', '-')}-{tag}"
    return resolved
