"""``mlrc report``: the table of test results, in Markdown, CSV, LaTeX or HTML."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlrc.cli.options import (
    DEFAULT_STORAGE,
    DeviceOpt,
    FoundArtifactsOpt,
    StorageOpt,
)
from mlrc.cli.terminal import check_device, check_out, fail, print_report, user_errors

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["metric_keys", "report"]

ArchivedOpt = Annotated[
    bool,
    typer.Option(
        "--archived",
        help="also the studies archived by --force-new (NAME.old-K) whose current study has "
        "test results (always marked archived)",
    ),
]
ReportMetricsOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        help="also these metrics, comma-separated (ndcg_at_k@10,mrr,…), computed from the "
        "stored test embeddings without training where not stored yet (marked *)",
    ),
]


def report(
    storage: StorageOpt = DEFAULT_STORAGE,
    campaign: Annotated[
        list[str] | None,
        typer.Option("--campaign", help="campaign name (repeat): its studies in campaign order"),
    ] = None,
    study: Annotated[list[str] | None, typer.Option("--study", help="study name (repeat)")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="md, csv, latex, html, json or stability-csv")
    ] = "md",
    out: Annotated[
        Path | None, typer.Option("--out", help="write to this file (its folder is created)")
    ] = None,
    standalone: Annotated[
        bool, typer.Option("--standalone", help="LaTeX: a complete document for pdflatex")
    ] = False,
    archived: ArchivedOpt = False,
    metrics: ReportMetricsOpt = None,
    artifacts: FoundArtifactsOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Test results with 95% CIs: separated (mean of the fold models) and concatenated, in %.

    Per dataset a block (one per protocol when its studies' protocols differ), its untrained
    baseline row first. Bold: best mean in its column. Underlined: highest concat. MAP@R.

    †: not significantly worse than the column's best (Welch's t-test, p ≥ 0.05).

    With neither --campaign nor --study: every study in the store, by name. A study archived by
    `study run --force-new` (NAME.old-K) is marked archived, and left out once the current
    study NAME has test results unless --archived (or --study names it).

    --metrics: columns computed after the fact from the stored test embeddings (marked *),
    found where the store recorded the artifacts of each study, or under --artifacts, without
    training: what `mlrc study rescore` has not stored yet is computed first and stored as it
    stores it. A study without embeddings (tested before they
    were kept), or whose file is missing or changed (refused), says so in one line."""
    from mlrc import store
    from mlrc.report.tables import FORMATS

    if fmt not in FORMATS:
        fail(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if standalone and fmt not in ("latex", "html"):
        fail("--standalone applies to --format latex (html is always a complete page)")
    if out is not None:
        check_out(out)
    asked = metric_keys(metrics) if metrics is not None else None
    check_device(device)
    with user_errors():
        engine = store.connect(storage, read_only=True)
        unreadable = (
            _rescore_first(engine, study, campaign, archived, asked, artifacts, device)
            if asked
            else {}
        )
        print_report(engine, study, fmt, out, campaign, standalone, archived, asked, unreadable)


def _rescore_first(
    engine: Engine,
    study: list[str] | None,
    campaign: list[str] | None,
    archived: bool,
    asked: dict[str, str],
    artifacts: Path | None,
    device: str,
) -> dict[str, str]:
    """The asked metrics the store lacks, computed from the stored embeddings and stored (one
    line on stderr per study re-scored, and per study that could not be); returns why each
    study that could not be was not, by name."""
    from mlrc.protocol.scoring import parse_metrics
    from mlrc.report.values import select_studies
    from mlrc.search.rescore import rescore_missing

    names = select_studies(engine, study, campaign, archived)
    chosen = parse_metrics(",".join(asked.values()))
    done, problems = rescore_missing(engine, names, artifacts, chosen, device)
    for name in done:
        typer.echo(f"computed from stored embeddings: {', '.join(asked)} of {name}", err=True)
    for line in problems.values():
        typer.echo(f"warning: {line}", err=True)
    return problems


def metric_keys(text: str) -> dict[str, str]:
    """``--metrics``: each metric's column key → the text that asked for it (a one-line exit
    for an unknown metric or a bad parameter, with "did you mean")."""
    from mlrc.protocol.scoring import parse_metrics

    out = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            fail(f"--metrics {text!r}: an empty metric name (names are comma-separated)")
        try:
            (metric,) = parse_metrics(part)
        except ValueError as e:  # "metrics: unknown metric …"
            fail(f"--{e}")
        stored = STORED_AS.get(metric.key)
        if stored is not None:  # the test stage's own value, not a float16 recomputation
            typer.echo(
                f"note: --metrics {part}: {stored[1]}, which the test stage stored: shown as "
                f"{stored[0]}, not computed again",
                err=True,
            )
            continue
        out[metric.key] = part
    return out


# columns --metrics may name that the test stage stores itself: column → (its name in the
# table, why); Recall@1 counts the queries whose nearest item is relevant, as P@1 does
STORED_AS = {
    "map_at_r": ("MAP@R", "a column of every table"),
    "precision_at_1": ("P@1", "a column of every table"),
    "r_precision": ("R-Prec", "a column of every table"),
    "recall_at_1": ("P@1", "Recall@1 is P@1 (a query's nearest item relevant or not)"),
}
