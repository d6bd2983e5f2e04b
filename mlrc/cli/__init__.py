"""The ``mlrc`` command."""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from mlrc import data
from mlrc.data.base import DatasetError
from mlrc.errors import first_line, worker_message
from mlrc.protocol import SplitError, confidence_interval, mlrc_split, retrieval_metrics
from mlrc.registry import RegistryError
from mlrc.terminal import (
    check_artifacts,
    check_device,
    console,
    err_console,
    fail,
    print_report,
    print_status_by_name,
    user_errors,
)

# --- the boundary: any unexpected exception becomes one line ----------------------------------

_run = {"debug": False}  # this invocation's global options (set by the app's callback)


class _Boundary(TyperGroup):
    """The ``mlrc`` command group, and the one place where an exception that no command turned
    into a one-line message ends: ``error: mlrc COMMAND: Type: first line (full traceback in
    FILE; --debug prints it)``, exit code 1. The traceback goes to a file under
    ``$MLRC_CACHE/logs`` (default ``~/.cache/mlrc/logs``, else the system's temporary folder);
    ``mlrc --debug`` or ``MLRC_DEBUG=1`` prints it instead. Exits, usage errors, Ctrl-C and a
    closed pipe (``mlrc report | head``) pass through to typer as before."""

    def invoke(self, ctx: typer.Context) -> Any:
        import errno

        words = [*vars(ctx).get("_protected_args", []), *ctx.args]  # before typer empties them
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, EOFError):
            raise  # an exit code, a usage error, Ctrl-C: typer's own handling
        except Exception as e:  # noqa: BLE001 — this is the boundary
            if isinstance(e, OSError) and e.errno == errno.EPIPE:
                raise  # typer ends quietly on a closed pipe
            _unexpected(e, self._command(ctx, words), bool(ctx.params.get("debug")))

    def _command(self, ctx: typer.Context, words: list[str]) -> str:
        """``mlrc study run``: the names of the (sub)commands at the start of ``words``."""
        names, group = ["mlrc"], self  # also under `python -m mlrc.cli`
        for word in words:
            sub = group.get_command(ctx, word) if isinstance(group, TyperGroup) else None
            if sub is None:
                break
            names.append(word)
            group = sub
        return " ".join(names)


def debugging() -> bool:
    """``mlrc --debug`` or ``MLRC_DEBUG`` set (not empty, 0, false, no or off)."""
    env = os.environ.get("MLRC_DEBUG", "").strip().lower()
    return _run["debug"] or env not in ("", "0", "false", "no", "off")


def traceback_folder() -> Path:
    """Where the boundary writes tracebacks: ``$MLRC_CACHE/logs`` (``~/.cache/mlrc/logs``)."""
    from mlrc.data.download import cache_dir

    return cache_dir() / "logs"


def _save_traceback(text: str) -> Path | None:
    """Write ``text`` to ``mlrc-YYYYmmdd-HHMMSS-PID.log`` in :func:`traceback_folder`, else in
    the system's temporary folder (readable by this user only); None if neither can be written."""
    import tempfile
    import time

    name = f"mlrc-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    folders = []
    with suppress(Exception):  # no home folder, a bad MLRC_CACHE: the fallback below
        folders.append(traceback_folder())
    folders.append(Path(tempfile.gettempdir()))
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            return path
        except (OSError, ValueError):
            continue
    return None


def _unexpected(e: Exception, command: str, debug: bool = False) -> None:
    """End ``command`` on an exception nobody expected: one line (or the traceback with
    ``--debug``), exit code 1."""
    import datetime as dt
    import platform
    import sys
    import traceback

    line = first_line(worker_message(str(e)), default="")
    what = f"{type(e).__name__}: {line}" if line else type(e).__name__
    trace = "".join(traceback.format_exception(e))
    if debug or debugging():
        sys.stderr.write(trace)
        err_console.print(f"[red]error:[/red] {escape(f'{command}: {what}')}", highlight=False)
        raise typer.Exit(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        mlrc_version = version("mlrc")
    except PackageNotFoundError:
        mlrc_version = "unknown"
    header = (
        f"{command} failed at {dt.datetime.now().astimezone().isoformat(timespec='seconds')}\n"
        f"mlrc {mlrc_version}, Python {platform.python_version()}, {platform.platform()}, "
        f"pid {os.getpid()}\n\n"
    )
    path = _save_traceback(header + trace)
    where = (
        f"full traceback in {path}; --debug prints it"
        if path is not None
        else "the traceback could not be saved; --debug prints it"
    )
    err_console.print(
        f"[red]error:[/red] {escape(f'{command}: {what} ({where})')}", highlight=False
    )
    raise typer.Exit(1)


app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, cls=_Boundary)


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="an unexpected error prints its full traceback (also MLRC_DEBUG=1) instead of "
            "writing it to a file under $MLRC_CACHE/logs",
        ),
    ] = False,
) -> None:
    _run["debug"] = debug


data_app = typer.Typer(no_args_is_help=True, help="Datasets: list, summarise, check.")
app.add_typer(data_app, name="data")

DatasetOpt = Annotated[str, typer.Option("--dataset", "-d", help="dataset name (mlrc data list)")]
RootOpt = Annotated[Path | None, typer.Option("--root", help="dataset root (folder or zip)")]
SchemeOpt = Annotated[str, typer.Option(help="fold scheme: kfold or mlrc")]


def _load(name: str, root: Path | None) -> data.ImageDataset:
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


@data_app.command("summary")
def data_summary(
    name: Annotated[str, typer.Argument(help="dataset name")] = "glyphs",
    root: RootOpt = None,
    scheme: SchemeOpt = "kfold",
    folds: Annotated[int, typer.Option(help="number of folds")] = 4,
) -> None:
    """Print class counts and the MLRC split of a dataset."""
    ds = _load(name, root)
    counts = ds.class_counts()
    console.print(
        f"{ds.name}: {len(ds)} images, {ds.num_classes} classes, "
        f"{counts.min()}–{counts.max()} images per class"
    )
    try:
        console.print(
            mlrc_split(ds.labels, n_folds=folds, scheme=scheme).summary(), highlight=False
        )
    except SplitError as e:
        fail(str(e))


@data_app.command("check")
def data_check(
    name: Annotated[str, typer.Argument(help="dataset name")], root: RootOpt = None
) -> None:
    """Decode every image once and list the ones that cannot be read (exit 1 if any)."""
    from tqdm import tqdm

    ds = _load(name, root)
    bad = []
    for i in tqdm(range(len(ds)), desc=f"checking {ds.name}", unit="img"):
        try:
            ds.load_image(i)
        except DatasetError as e:
            bad.append(str(e))
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
) -> None:
    """Untrained baselines on the test half: raw pixels and random 128-D linear embedders (95% CIs)."""
    from mlrc.models.baselines import pixel_features, random_embedder

    check_device(device)
    ds = _load(dataset, root)
    console.rule(f"[bold]{ds.name}[/bold]: {len(ds)} images, {ds.num_classes} classes")
    try:
        split = mlrc_split(ds.labels, n_folds=4, scheme=scheme)
    except SplitError as e:
        fail(str(e))
    console.print(split.summary(), highlight=False)
    if reproductions < 2:
        fail("--reproductions must be at least 2 for a confidence interval")

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
    console.print(table)
    console.print("± is the half-width of the 95% t-interval over the random embedders.")


# --- studies -----------------------------------------------------------------------------------

study_app = typer.Typer(no_args_is_help=True, help="Studies: run the search, test, status.")
app.add_typer(study_app, name="study")
StorageOpt = Annotated[
    str, typer.Option("--storage", envvar="MLRC_STORAGE", help="SQLAlchemy URL of the store")
]
ArtifactsOpt = Annotated[Path, typer.Option("--artifacts", help="checkpoint directory")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="no progress bars")]
DEFAULT_STORAGE = "sqlite:///mlrc.db"
DEFAULT_ARTIFACTS = Path("mlrc-artifacts")


@contextmanager
def _interrupts():
    """Ctrl-C and SIGTERM stop a study command the same way: the running trial is recorded as
    interrupted (retried, not counted), one line on stderr, exit code 128 + signal number
    (130 for SIGINT, 143 for SIGTERM, as a shell reports them); re-running the same command
    resumes. A second SIGTERM during that cleanup is ignored (SIGKILL still ends it)."""
    import signal
    import threading

    got: list[int] = []

    def on_sigterm(signum: int, _frame: object) -> None:
        got.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    try:
        yield
    except Exception as e:  # raised while a Ctrl-C unwound (torch.save's zip writer does)?
        if isinstance(e, typer.Exit) or _interrupt_behind(e) is None:
            raise
        sig = signal.Signals(got[0] if got else signal.SIGINT)
        err_console.print(
            f"interrupted ({sig.name}): run the same command to resume", highlight=False
        )
        raise typer.Exit(128 + sig.value) from None
    except KeyboardInterrupt as e:
        sig = signal.Signals(got[0] if got else signal.SIGINT)
        trial = getattr(e, "trial", None)
        what = f"trial {trial} marked interrupted; " if trial is not None else ""
        err_console.print(
            f"interrupted ({sig.name}): {what}run the same command to resume", highlight=False
        )
        raise typer.Exit(128 + sig.value) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt that ``e`` was raised while handling, if any."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _open(
    study_file: Path,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    force_new: bool = False,
):
    from mlrc.config import load_study
    from mlrc.search.study import open_study

    return open_study(
        load_study(study_file), storage, artifacts, device, progress=not quiet, force_new=force_new
    )


@study_app.command("run")
def study_run(
    study_file: Annotated[Path, typer.Argument(help="study YAML")],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    backend: Annotated[str, typer.Option(help="local (this process) or ray")] = "local",
    address: Annotated[
        str | None, typer.Option(help="ray: auto, HOST:PORT, or none for a local Ray")
    ] = None,
    max_concurrent: Annotated[int, typer.Option(help="ray: trials running at once")] = 1,
    cpus_per_trial: Annotated[float, typer.Option(help="ray: CPUs reserved per trial")] = 1.0,
    gpus_per_trial: Annotated[float, typer.Option(help="ray: GPUs per trial (0.25 packs 4)")] = 0.0,
    fold_parallel: Annotated[
        bool, typer.Option(help="ray: the folds of a trial as parallel tasks sharing its resources")
    ] = False,
    scheduler: Annotated[
        str, typer.Option(help="ray: none (protocol), asha or median (prunes; not MLRC)")
    ] = "none",
    force_new: Annotated[
        bool,
        typer.Option(
            "--force-new", help="a stored study of this name with another config: archive, rerun"
        ),
    ] = False,
) -> None:
    """Run (or resume) the Bayesian search: trials × 4 folds, objective = mean val MAP@R."""
    from mlrc.search.study import run_search

    if backend not in ("local", "ray"):
        fail(f"unknown backend {backend!r} (local or ray; for a worker pool use `mlrc worker`)")
    if scheduler not in ("none", "asha", "median"):
        fail(f"unknown scheduler {scheduler!r} (none, asha or median)")
    if backend == "local" or address is None:  # a remote Ray cluster's GPUs are not ours to see
        check_device(device)
    check_artifacts(artifacts)
    with (
        _interrupts(),
        user_errors(),
        _open(study_file, storage, artifacts, device, quiet, force_new) as ctx,
    ):
        if backend == "ray":
            if address is None:  # a local Ray listens on 127.0.0.1 only (set before import)
                os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            from mlrc.search.ray_backend import run_search_ray, scheduler_named

            run_search_ray(
                ctx,
                address=address,
                max_concurrent=max_concurrent,
                cpus_per_trial=cpus_per_trial,
                gpus_per_trial=gpus_per_trial,
                fold_parallel=fold_parallel,
                scheduler=scheduler_named(scheduler, len(ctx.split.folds)),
            )
        else:
            run_search(ctx)
        _print_status(ctx)


@app.command()
def worker(
    study_file: Annotated[Path, typer.Argument(help="study YAML")],
    storage: Annotated[
        str,
        typer.Option("--storage", envvar="MLRC_STORAGE", help="PostgreSQL URL shared by the pool"),
    ] = DEFAULT_STORAGE,
    artifacts: Annotated[
        Path,
        typer.Option("--artifacts", envvar="MLRC_ARTIFACTS", help="shared checkpoint directory"),
    ] = DEFAULT_ARTIFACTS,
    device: Annotated[
        str, typer.Option("--device", envvar="MLRC_DEVICE", help="cpu, cuda, cuda:N (one GPU)")
    ] = "cpu",
    heartbeat: Annotated[int, typer.Option(help="heartbeat interval of a running trial, s")] = 30,
    grace: Annotated[
        int | None, typer.Option(help="a trial without heartbeat this long is retried, s (4×)")
    ] = None,
    per_gpu: Annotated[
        int,
        typer.Option(
            "--per-gpu", min=1, help="N worker processes sharing --device (packs small trials)"
        ),
    ] = 1,
    quiet: QuietOpt = False,
) -> None:
    """One worker of a pool: run trials of the study until its budget of finished trials is
    reached by the whole pool, then exit 0. Start any number, on any machines, against one
    PostgreSQL database (SQLite allows a single worker). ``--per-gpu N`` starts N such workers
    on the same device as separate processes (the exit code is the first non-zero one)."""
    import logging
    import os

    from mlrc.search.study import run_search

    if heartbeat < 1 or (grace is not None and grace <= heartbeat):
        fail("--heartbeat must be ≥ 1 s and --grace longer than --heartbeat")
    check_device(device)
    check_artifacts(artifacts)
    if per_gpu > 1:
        args = [str(study_file), "--artifacts", str(artifacts), "--device", device]
        args += ["--heartbeat", str(heartbeat)] + (["--grace", str(grace)] if grace else [])
        raise typer.Exit(_packed_workers(per_gpu, args + (["--quiet"] if quiet else []), storage))
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker {os.getpid()} %(levelname)s %(message)s"
    )
    with _interrupts(), user_errors(), _open(study_file, storage, artifacts, device, quiet) as ctx:
        from mlrc.store import redact

        logging.getLogger("mlrc").info(
            "study %s on %s, device %s, artifacts %s",
            ctx.name,
            redact(storage),
            device,
            ctx.artifacts,
        )
        run_search(ctx, heartbeat_s=heartbeat, grace_s=grace)
        _print_status(ctx)


def _packed_workers(n: int, args: list[str], storage: str) -> int:
    """Run ``mlrc worker ARGS`` n times as child processes (the storage URL goes by environment,
    never on a command line); SIGINT/SIGTERM are passed on; returns the first non-zero exit."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "MLRC_STORAGE": storage, **({"MLRC_DEBUG": "1"} if debugging() else {})}
    cmd = [sys.executable, "-m", "mlrc.cli", "worker", *args]
    children = [subprocess.Popen(cmd, env=env) for _ in range(n)]
    console.print(f"started {n} workers on one device: pids {[c.pid for c in children]}")

    def forward(signum: int, _frame: object) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    codes = [c.wait() for c in children]
    return next((c for c in codes if c != 0), 0)


@study_app.command("test")
def study_test(
    study_file: Annotated[Path, typer.Argument(help="study YAML")],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
) -> None:
    """Retrain the best parameters N times × 4 folds and test on the unseen classes."""
    from mlrc.search.study import run_test

    check_device(device)
    check_artifacts(artifacts)
    with _interrupts(), user_errors(), _open(study_file, storage, artifacts, device, quiet) as ctx:
        for problem in run_test(ctx):
            console.print(f"[yellow]failed:[/yellow] {problem}", soft_wrap=True)
        print_report(ctx.engine, [ctx.name], "md")


@study_app.command("status")
def study_status(
    study: Annotated[str, typer.Argument(help="study YAML or study name")],
    storage: StorageOpt = DEFAULT_STORAGE,
) -> None:
    """Trials (complete/running/failed with reasons), best so far, folds done."""
    from mlrc import store
    from mlrc.config import load_study

    with user_errors():
        name = load_study(study).study.name if study.endswith((".yaml", ".yml")) else study
        engine = store.connect(storage, read_only=True)
        print_status_by_name(engine, name)


def _print_status(ctx) -> None:
    print_status_by_name(ctx.engine, ctx.name)


@app.command()
def report(
    storage: StorageOpt = DEFAULT_STORAGE,
    campaign: Annotated[
        list[str] | None,
        typer.Option("--campaign", help="campaign name (repeat): its studies in campaign order"),
    ] = None,
    study: Annotated[list[str] | None, typer.Option("--study", help="study name (repeat)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="md, csv, latex or html")] = "md",
    out: Annotated[Path | None, typer.Option("--out", help="write to this file")] = None,
    standalone: Annotated[
        bool, typer.Option("--standalone", help="LaTeX: a complete document for pdflatex")
    ] = False,
) -> None:
    """Test results with 95% CIs: separated (128-D) and concatenated (512-D), in percent.

    Per dataset a block (one per protocol when its studies' protocols differ), its untrained
    baseline row first. Bold: best mean in its column. Underlined: highest concat. MAP@R.

    †: not significantly worse than the column's best (Welch's t-test, p ≥ 0.05).

    With neither --campaign nor --study: every study in the store, by name."""
    from mlrc import store
    from mlrc.report.tables import FORMATS

    if fmt not in FORMATS:
        fail(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if standalone and fmt not in ("latex", "html"):
        fail("--standalone applies to --format latex (html is always a complete page)")
    with user_errors():
        print_report(store.connect(storage, read_only=True), study, fmt, out, campaign, standalone)


@app.command()
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
) -> None:
    """A complete small study on the embedded default: search, test stage, table with CIs."""
    import time

    from mlrc.config import StudyConfig, resolve, validate_model
    from mlrc.search.study import open_study, run_search, run_test
    from mlrc.store import canonical_json, redact

    check_device(device)
    check_artifacts(artifacts)
    t0 = time.monotonic()
    cfg = {
        "name": "demo",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"seed": 0, "trials": trials},
        "test": {"reproductions": reproductions},
        "overrides": {"max_epochs": max_epochs} if max_epochs else {},
    }
    with _interrupts(), user_errors():
        resolved = resolve(validate_model(StudyConfig, cfg, "demo"), "demo")
        tag = hashlib.sha256(canonical_json(resolved.fingerprint()).encode()).hexdigest()[:8]
        resolved.study.name = f"demo-glyphs-contrastive-{tag}"
        console.rule(f"[bold]mlrc demo[/bold]: {resolved.study.name}")
        console.print(
            f"glyphs × contrastive, preset cpu: {resolved.trials} trials × "
            f"{resolved.preset.folds} folds, then {resolved.reproductions} reproductions "
            f"× {resolved.preset.folds} folds",
            soft_wrap=True,
        )
        with open_study(resolved, storage, artifacts, device, progress=not quiet) as ctx:
            console.print(ctx.split.summary(), highlight=False)
            run_search(ctx)
            _print_status(ctx)
            for problem in run_test(ctx):
                console.print(f"[yellow]failed:[/yellow] {problem}", soft_wrap=True)
            print_report(ctx.engine, [ctx.name], "md")
    console.print(
        f"database: {redact(storage)}\nartifacts: {artifacts.resolve() / resolved.study.name}\n"
        f"wall time: {time.monotonic() - t0:.0f} s",
        soft_wrap=True,
    )


def _add_subapps() -> None:
    from mlrc.campaign import campaign_app
    from mlrc.report.dashboard import dashboard_app

    app.add_typer(campaign_app, name="campaign")
    app.add_typer(dashboard_app, name="dashboard")


_add_subapps()


def command_paths() -> list[str]:
    """Every visible command and sub-command as typed (``mlrc study run``), for the docs."""
    paths: list[str] = []

    def walk(command: object, prefix: str) -> None:
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                paths.append(f"{prefix} {name}")
                walk(sub, f"{prefix} {name}")

    walk(typer.main.get_command(app), "mlrc")
    return paths


if __name__ == "__main__":
    app()
