"""Terminal output shared by the two front ends, ``mlrc`` (:mod:`mlrc.cli`) and its campaigns
(:mod:`mlrc.search.campaign_runner`): the consoles, the one-line refusal (``error: …``, exit 2),
expected failures as one line. Also the checks of ``--device`` and ``--artifacts``, a study's
status, the report.

It sits below both front ends (the campaign must not import the CLI) and above what it shows
(:mod:`mlrc.search`, :mod:`mlrc.report`, :mod:`mlrc.store`)."""

from __future__ import annotations

import contextlib
import os
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mlrc.errors import worker_message

console = Console()
err_console = Console(stderr=True, soft_wrap=True, emoji=False)  # one line, as written


def print_table(table: Table) -> None:
    """Print ``table`` whole: piped (no terminal, no ``COLUMNS``) at its natural width, not cut
    to rich's 80 columns (``contra… (omnig…``); on a terminal at the terminal's width."""
    if console.is_terminal or os.environ.get("COLUMNS"):
        console.print(table)
        return
    wide = console.options.update(max_width=100_000)
    width = max(console.width, console.measure(table, options=wide).maximum)
    Console(file=console.file, width=width).print(table)  # console.print caps at its width


def fail(message: str) -> None:
    """One line on stderr, ``error: …`` (the message is printed as written, never as markup)."""
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(2)


DEVICE_FORMS = "cpu, cuda, cuda:N or mps"


def check_device(device: str) -> None:
    """Refuse (one line, exit 2) a ``--device`` this machine cannot run on, before any work:
    a form other than cpu, cuda, cuda:N, mps; CUDA or MPS absent; cuda:N past the GPU count."""
    import re

    match = re.fullmatch(r"(cpu|mps|cuda)(?::(\d+))?", device)
    if match is None or (match[2] is not None and match[1] != "cuda"):
        fail(f"--device {device}: not a device ({DEVICE_FORMS})")
    if match[1] == "cpu":
        return
    import torch

    if match[1] == "mps":
        if not torch.backends.mps.is_available():
            fail(
                f"--device {device}: no MPS device is available on this machine "
                "(torch.backends.mps.is_available() is False); use --device cpu"
            )
        return
    if not torch.cuda.is_available():
        fail(
            f"--device {device}: no CUDA device is available on this machine "
            "(torch.cuda.is_available() is False); use --device cpu"
        )
    count = torch.cuda.device_count()
    if match[2] is not None and int(match[2]) >= count:
        have = (
            "1 CUDA device (cuda:0)"
            if count == 1
            else f"{count} CUDA devices (cuda:0 to cuda:{count - 1})"
        )
        fail(f"--device {device}: this machine has {have}")


def check_artifacts(path: Path) -> None:
    """Refuse (one line, exit 2) an ``--artifacts`` folder that cannot be written or created,
    before any work; nothing is created here."""
    text = str(path)
    if "\x00" in text:
        fail(f"--artifacts {text!r}: not a usable folder name (it contains a NUL character)")
    full = os.path.abspath(os.path.expanduser(text))
    if os.path.lexists(full):
        if not os.path.isdir(full):
            fail(f"--artifacts {text}: not a folder (a file of that name exists)")
        if not os.access(full, os.W_OK | os.X_OK):
            fail(f"--artifacts {text}: this folder is not writable")
        return
    ancestor = os.path.dirname(full)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        fail(f"--artifacts {text}: cannot create this folder ({ancestor} is a file, not a folder)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"--artifacts {text}: cannot create this folder ({ancestor} is not writable)")


def check_out(path: Path, *, overwrite: bool = True, inputs: tuple[str | Path, ...] = ()) -> None:
    """Refuse (one line, exit 2) an ``--out`` file that cannot be written, before any work: one
    of ``inputs`` (the file a command reads: never overwritten), a folder, an existing file
    unless ``overwrite`` (``--force``), a missing folder that cannot be created. Missing folders
    are created by :func:`write_out`, not here."""
    text = str(path)
    if "\x00" in text or not text:
        fail(f"--out {text!r}: not a usable file name")
    full = os.path.abspath(os.path.expanduser(text))
    for source in inputs:
        if os.path.isfile(full) and os.path.isfile(source) and os.path.samefile(full, source):
            fail(f"--out {text}: that is the input file {source}; write to another file")
    if os.path.isdir(full):
        fail(f"--out {text}: is a folder; name a file in it")
    if os.path.lexists(full) and not overwrite:
        fail(f"--out {text}: the file exists; pass --force to overwrite it")
    ancestor = os.path.dirname(full)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        fail(f"--out {text}: cannot create its folder ({ancestor} is a file, not a folder)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"--out {text}: cannot write there ({ancestor} is not writable)")


def write_out(path: Path, write) -> None:
    """Write ``--out`` through ``write(tmp)`` (a temporary file beside it, same suffix), then
    rename it over ``path``: a failure leaves no partial file. Missing folders are created
    (and removed again, if still empty, when the write fails); an OS error is one line."""
    full = Path(os.path.expanduser(str(path)))
    created = []
    folder = full.parent
    while not folder.exists():
        created.append(folder)
        folder = folder.parent
    tmp = full.with_name(f".{full.stem}.tmp-{os.getpid()}{full.suffix}")
    try:
        full.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, full)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        for d in created:  # deepest first
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(e, OSError):
            fail(f"--out {path}: {e.strerror or e}")
        raise


@contextmanager
def user_errors():
    """Turn every expected failure into one line on stderr and exit code 2."""
    from mlrc.search.errors import USER_ERRORS

    try:
        yield
    except USER_ERRORS as e:
        fail(worker_message(str(e)))


TRADITIONAL_NOTE = (
    "§ traditional protocol: one model on all training classes, its epoch chosen on the test "
    "classes (test-set selection, a leakage); not comparable with the reality check's numbers"
)


def print_status_by_name(engine, name: str) -> None:
    from mlrc import store
    from mlrc.config.presets import is_traditional, objective_label
    from mlrc.store import studies
    from mlrc.store import trials as stored

    status = studies.study_status(engine, name)
    if status is None:
        fail(f"no study {name!r} in {store.redact(str(engine.url))}")
    st, trials, folds, tests = status
    label = objective_label(st.config)
    print_table(
        _trials_table(f"study {name} ({st.dataset}, {st.loss}, preset {st.preset})", trials, label)
    )
    _print_reasons(trials)
    folds_run = sorted(stored.fold_runs(engine, st.id), key=lambda f: (f.reproduction, f.fold))
    _print_failed_test_folds(folds_run)
    _print_summary(trials, folds, tests, label)
    if is_traditional(st.config):
        console.print(TRADITIONAL_NOTE, soft_wrap=True, highlight=False, markup=False)
    print_compute([f.provenance for f in folds_run if f.status == "complete"])
    print_budget(engine, st)


def _trials_table(title: str, trials: list, label: str) -> Table:
    """A row per trial: number, state, objective ± SEM, parameters and reason."""
    table = Table(title=title)
    for col in ("trial", "state", label, "± SEM", "params", "reason"):
        table.add_column(col)
    for t in trials:
        table.add_row(
            str(t.number),
            t.state,
            f"{t.value:.4f}" if t.value is not None else "",
            f"{t.sem:.4f}" if t.sem is not None else "",
            Text(
                ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in t.params.items()
                )
            ),
            Text(reason(t)),  # as written: "[enforce fail at …]" is no markup, ":x:" no emoji
        )
    return table


def _print_reasons(trials: list) -> None:
    """Each trial's reason below the table too: a narrow terminal wraps the reason column."""
    for t in trials:
        if t.reason and t.state == "complete":  # e.g. scored 0 after a non-finite loss
            value = f"{t.value:.4f}" if t.value is not None else "-"
            line = f"trial {t.number} complete  {value}  ({reason(t)})"
        elif t.reason:
            line = f"trial {t.number} {state_and_reason(t.state, t.reason)}"
        else:
            continue
        console.print(line, soft_wrap=True, highlight=False, markup=False, emoji=False)


def _print_failed_test_folds(folds_run: list) -> None:
    """The test stage's failed or interrupted folds, with their reasons."""
    for f in folds_run:
        if f.kind == "test" and f.status in ("failed", "interrupted"):
            line = f"reproduction {f.reproduction}, fold {f.fold} {state_and_reason(f.status, f.reason)}"
            console.print(line, soft_wrap=True, highlight=False, markup=False, emoji=False)


def _print_summary(trials: list, folds: dict, tests: int, label: str) -> None:
    """Trials by state, folds done, reproductions tested, and the best trial so far."""
    counts = {
        state: sum(t.state == state for t in trials)
        for state in ("complete", "running", "failed", "interrupted", "pruned")
    }
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    best = max(done, key=lambda t: t.value) if done else None
    console.print(
        ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; folds done: {folds.get('search', 0)} search, {folds.get('test', 0)} test; "
        f"reproductions tested: {tests}",
        soft_wrap=True,
    )
    if best is not None:
        sem = f" ± {best.sem:.4f} (SEM over folds)" if best.sem is not None else ""
        console.print(
            f"best so far: trial {best.number}, {label} {best.value:.4f}{sem}", soft_wrap=True
        )


def print_compute(provenances: list) -> None:
    """One line: what computed the study's complete fold runs (device, CUDA/cuDNN, TF32,
    deterministic; :mod:`mlrc.store.provenance`) and what differs between them; nothing when
    none recorded it (runs before schema 7)."""
    from mlrc.store.provenance import compute_of

    compute = compute_of(provenances)
    if not compute.kinds:
        return
    mixed = f" — mixed {', '.join(compute.mixed)}" if compute.mixed else ""
    console.print(
        f"computed on: {compute.text()}{mixed}", soft_wrap=True, highlight=False, markup=False
    )


def print_budget(engine, st) -> None:
    """The study's budgets, retention and torch threads per fold, then its history of changes
    (oldest first)."""
    from mlrc.report.legend import pruning_label, risk_text
    from mlrc.store import history

    rows = history.study_history(engine, st.id)
    settings = st.settings or {}  # None: a study from before schema 6
    keep = next((h.new for h in reversed(rows) if h.field == "artifacts.keep"), "resume")
    keep = settings.get("artifacts.keep", keep)
    threads = settings.get("threads")
    trials, reps = st.config.get("trials"), st.config.get("reproductions")
    per_fold = f"; threads per fold: {threads}" if threads else "; threads per fold: not fixed"
    console.print(
        f"budget: {trials} trials, {reps} reproductions; checkpoints kept: {keep}{per_fold}",
        soft_wrap=True,
        highlight=False,
    )
    if (label := pruning_label(st.config, settings)) != "none":
        risk = risk_text(settings.get("pruning_risk"))
        console.print(
            f"pruning: {label} (not the protocol's search){'; ' + risk if risk else ''}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    print_warm_start(st.config, rows)
    for h in rows:
        when = h.time.strftime("%Y-%m-%d %H:%M")
        console.print(
            f"  {when}  {h.field} {h.old} → {h.new}  ({h.code_version})",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )


def print_warm_start(config, rows) -> None:
    """One line for a warm-started study (``search.warm_start``): where its first trials came
    from; its search is not the reference's."""
    from mlrc.report.values import warm_start

    text = warm_start(config, rows)
    if text:
        console.print(
            f"warm-started from {text}: not the reference's search",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )


def state_and_reason(state: str, reason: str | None) -> str:
    """``failed: out of memory``, but ``pruned after 1 of 2 folds: …`` and ``interrupted: rank 1
    of 2 ended by SIGKILL`` where the reason starts with the state's word (not ``pruned: pruned
    after …``), and ``interrupted`` alone where the reason is the state."""
    if not reason or reason == state:
        return state
    if reason.split(":")[0].split()[0] == state:
        return reason
    return f"{state}: {reason}"


def reason(t) -> str:
    """A trial's reason; a complete trial with one was given its value for it ("scored 0: …")."""
    if t.reason and t.state == "complete" and t.value is not None:
        return f"scored {t.value:g}: {t.reason}"
    return t.reason or ""


def print_report(
    engine,
    studies: list[str] | None,
    fmt: str,
    out: Path | None = None,
    campaigns: list[str] | None = None,
    standalone: bool = False,
    archived: bool = False,
    metrics: dict[str, str] | None = None,
    unreadable: dict[str, str] | None = None,
) -> None:
    """The report of ``studies`` and ``campaigns`` (``archived``: with archived studies) on
    stdout, or written to ``out`` (its folder created); ``metrics``: also these, as ``mlrc
    study rescore`` stored them (column key → how ``--metrics`` asks for it); ``unreadable``:
    why a study's stored embeddings could not be re-scored, by name."""
    from mlrc.report.tables import ReportError, collect, render, summarize

    try:
        values = collect(
            engine, studies, campaigns, archived=archived, metrics=metrics, unreadable=unreadable
        )
        text = render(summarize(values), fmt, standalone=standalone)
    except ReportError as e:
        fail(str(e))
    if out is not None:
        write_out(out, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        console.print(f"wrote {out}", soft_wrap=True, highlight=False)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
