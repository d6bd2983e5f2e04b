"""Fault-injection soak (issue #38): a pool of ``mlrc worker`` processes training tiny *real*
folds, each with a loader process, on a throwaway PostgreSQL, while a supervisor sends signals
and restarts the database; afterwards the store must hold every invariant.

    .venv/bin/python bench/soak.py [--workers 6] [--trials 200] [--signals 24] [--restarts 3]
        [--runs 3] [--seed 38]

The workers are forked from this process after it imported mlrc (as in ``bench/pool_load.py``,
whose worker, store checks and database tools this reuses), each the leader of its own process
group; every other one starts with SIGTERM blocked, as a launcher may leave it. The faults fall
at seeded random numbers of complete trials between 5 % and 90 % of the budget, each on a
worker that runs a trial, in turn:

- ``worker SIGTERM``, ``worker SIGINT``: the worker stops (exit 143, 130), its trial recorded
  interrupted at once; replaced at once, so the pool stays at N;
- ``group SIGTERM``: the same signal to the worker's whole process group, loaders included
  (they ignore it and end with their parent);
- ``worker SIGKILL``: the trial is found stale after the heartbeat's grace and retried;
- ``loader SIGKILL``: the trial is interrupted and retried, the worker goes on (a loader the
  fold no longer needs — the validation's after its last pass — ends with no effect);
- ``loader SIGTERM``: ignored; the fold goes on.

The database restarts (``pg_ctl stop -m fast``, 2 s down, start) fall right after a trial
completes, while its worker claims the next. Checks (:func:`soak_problems`): exactly the budget of
complete trials in Optuna and in ``mlrc_trial``, no parameters complete twice, one complete
fold row per (parameters, fold), nothing running, every failed trial interrupted and retried
(or a claim dropped and drawn again at its position), every worker not killed exiting 0, every
signalled one with its signal's code, and each stop answered — the worker's stopped line —
within one training step + 2 s (the issue's bound; the checkpoint write of these folds is
instant). Writes bench/results/soak.md.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import pool_load as P  # noqa: E402

RESULTS = BENCH / "results"
ITERATIONS = 4  # training steps per fold (one epoch)
FAULTS = (
    "worker SIGTERM",
    "loader SIGKILL",
    "group SIGTERM",
    "worker SIGKILL",
    "worker SIGINT",
    "loader SIGTERM",
)
STOPS = {"worker SIGTERM": 143, "group SIGTERM": 143, "worker SIGINT": 130}
STOPPED = "run the same command to resume"
BOUND_S = 2.0  # beyond one training step: the "+ 2 s"
# A stop that lands while the database is down may wait for the connection attempt in flight
# (libpq's connect cannot be interrupted; mlrc's shortest attempt timeout is 2 s).
OUTAGE_EXTRA_S = 2.0


@dataclass
class Fault:
    """One signal sent: its kind, the worker (and loader) it hit, when, and how it ended."""

    kind: str
    worker: P.Worker
    at: int  # complete trials when sent
    blocked: bool  # the worker started with SIGTERM blocked
    target: int  # the pid signalled (the worker's, a loader's, or the group's leader)
    sent: float = 0.0
    to_line_s: float | None = None  # the worker's stopped line (loader SIGKILL: its retry line)
    to_exit_s: float | None = None
    went_on: bool | None = None  # a loader's fault: the worker still ran 3 s later
    in_outage: bool = False  # sent while the database was down (or within 1 s of it)


def study_file(tmp: Path, name: str, trials: int, seed: int) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs", "params": P.GLYPHS},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": seed},
        "overrides": {
            "max_epochs": 1,
            "iterations_per_epoch": ITERATIONS,
            "patience": {"default": 1},
            "image": {"resize": 18, "crop": 16},
            "batch": {"size": 16},
            "eval_batch_size": 64,
            "num_workers": 1,
            "persistent_workers": True,  # one loader process per loader for the whole fold
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def new_soak(server: Any, tmp: Path, trials: int, seed: int) -> tuple[str, str, list[str]]:
    """A new database on ``server`` and the soak's study: (URL, name, the workers' arguments)."""
    url, name, args = P.new_pool(server, tmp, trials, seed)
    name = "soak"
    args[1] = str(study_file(tmp, name, trials, seed))
    return url, name, [*args, "--threads", "1"]  # one torch thread each: no oversubscription


def _own_group(blocked: bool, cache: Path) -> Any:
    """The forked worker's hook: its own process group and CPU-share directory (``cache``: on
    a 2-core machine the workers' folds would otherwise run one at a time — each asks for 2
    cores, its thread and its loader); SIGTERM blocked if ``blocked``."""

    def hook() -> None:
        os.setpgid(0, 0)
        os.environ["MLRC_CACHE"] = str(cache)
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    return hook


def loaders_of(pid: int) -> list[int]:
    """The worker's child processes now (its DataLoader processes), the newest first: the
    current fold's (an earlier fold's may live until the garbage collector ends them)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return sorted(children, key=_start_time, reverse=True)


def _start_time(pid: int) -> int:
    """The process's start time (clock ticks since boot; 0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def send(kind: str, w: P.Worker, at: int, blocked: bool) -> Fault | None:
    """Send fault ``kind`` to worker ``w`` (None: no loader to hit, or it ended meanwhile)."""
    who, _, sig = kind.partition(" ")
    target = w.pid
    if who == "loader":
        children = loaders_of(w.pid)
        if not children:
            return None
        target = children[0]
    f = Fault(kind, w, at, blocked, target, time.monotonic())
    try:
        if who == "group":
            os.killpg(w.pid, signal.Signals[sig])
        else:
            os.kill(target, signal.Signals[sig])
    except ProcessLookupError:
        return None
    if sig == "SIGKILL" and who == "worker":
        w.kill()  # reaped now
    return f


LOADER_LOST = "interrupted (data loader process"


def _follow(f: Fault) -> None:
    """Note when the signalled worker printed its stopped line and exited (a loader's fault:
    the worker's retry line, and whether it went on)."""
    now = time.monotonic() - f.sent
    if f.kind.startswith("loader"):
        if f.to_line_s is None and f"{LOADER_LOST} {f.target} " in f.worker.output():
            f.to_line_s = now
        if f.went_on is None and now > 3:
            f.went_on = f.worker.alive() or f.worker.killed  # killed: by a later fault
        return
    if f.to_line_s is None and f.worker.log.is_file() and STOPPED in f.worker.output():
        f.to_line_s = now
    if f.to_exit_s is None and not f.worker.alive():
        f.to_exit_s = now
        if f.to_line_s is None and STOPPED in f.worker.output():
            f.to_line_s = now


class Supervisor:
    """The pool (kept at N workers), the fault schedule and the restarts of one soak run."""

    def __init__(self, server: Any, tmp: Path, a: argparse.Namespace, say: Any) -> None:
        self.server, self.tmp, self.say = server, tmp, say
        self.url, name, self.args = new_soak(server, tmp, a.trials, a.seed)
        self.rng = random.Random(a.seed)
        lo, hi = max(1, a.trials // 20), max(2, a.trials * 9 // 10)
        self.fault_at = sorted(self.rng.choices(range(lo, hi), k=a.signals))
        self.restart_at = [a.trials * (i + 1) // (a.restarts + 1) for i in range(a.restarts)]
        self.run = P.Run(name, self.url, a.workers, a.trials)
        self.faults: list[Fault] = []
        self.outages: list[tuple[float, float]] = []
        self.blocked: set[int] = set()
        self.live = [self.fork() for _ in range(a.workers)]
        self.complete, self.last_complete = 0, 0

    def fork(self) -> P.Worker:
        index = len(self.run.pool)
        blocked = index % 2 == 1
        hook = _own_group(blocked, self.tmp / f"cache{index}")
        w = P.fork_worker(index, self.args, self.tmp, hook, noop=False)
        if blocked:
            self.blocked.add(w.pid)
        self.run.pool.append(w)
        return w

    def poll(self) -> None:
        sample = P.query(P.conninfo(self.url), P.LOAD_SQL)
        if sample:
            self.run.connections.append(sample[0][0])
            self.last_complete, self.complete = self.complete, sample[0][1]
        for f in self.faults:
            _follow(f)
        ended = [w for w in self.live if not w.alive()]
        self.live = [w for w in self.live if w.code is None]
        for w in ended:
            if w.killed or w.code != 0:  # a signalled worker (or a bad exit): replaced
                self.live.append(self.fork())

    def maybe_fault(self) -> None:
        if not self.fault_at or self.complete < self.fault_at[0]:
            return
        running = P.running_by_pid(P.conninfo(self.url)) or {}
        busy = [w for w in self.live if running.get(w.pid) and not w.killed]  # not signalled
        if not busy:
            return
        kind = FAULTS[len(self.faults) % len(FAULTS)]
        w = self.rng.choice(busy)
        f = send(kind, w, self.complete, w.pid in self.blocked)
        if f is None:
            return  # no loader at this moment: the next poll tries again
        self.fault_at.pop(0)
        self.faults.append(f)
        if kind in STOPS or kind == "worker SIGKILL":
            w.killed = True  # ended by the soak: its exit code is checked against its signal
        self.say(
            f"  {kind} → worker {w.pid} at {self.complete} complete (running {running[w.pid]})"
        )

    def maybe_restart(self) -> None:
        # right after a trial completes: its worker is claiming the next one
        if not self.restart_at or self.complete < self.restart_at[0]:
            return
        if self.complete == self.last_complete:
            return
        self.restart_at.pop(0)
        t0 = time.monotonic()
        self.server.restart(down_s=2.0)
        self.outages.append((t0, time.monotonic() + 1.0))
        self.say(
            f"  restarted the database at {self.complete} complete ({time.monotonic() - t0:.1f} s)"
        )
        self.run.facts.setdefault("restarts", []).append(self.complete)


def soak(
    server: Any, tmp: Path, a: argparse.Namespace, say: Any = print
) -> tuple[P.Run, list[Fault]]:
    """One soak run on a new database of ``server``; the caller checks it (:func:`soak_problems`)."""
    s = Supervisor(server, tmp, a, say)
    t0 = time.monotonic()
    while s.live or any(f.to_exit_s is None and f.kind in STOPS for f in s.faults):
        time.sleep(P.POLL_S)
        s.poll()
        s.maybe_fault()
        s.maybe_restart()
        if time.monotonic() - t0 > a.timeout:
            s.run.timed_out = True
            for w in s.live:
                if w.alive():
                    w.kill()
            break
    s.run.wall_s = time.monotonic() - t0
    for f in s.faults:
        f.in_outage = any(down - 1.0 <= f.sent <= up for down, up in s.outages)
    s.run.logs = P.log_events(s.run.pool)
    s.run.facts["step_s"] = step_seconds(s.url)
    return s.run, s.faults


def step_seconds(url: str) -> float:
    """The longest complete fold's wall time ÷ its training steps (validation included)."""
    rows = P.query(
        P.conninfo(url), "select wall_time_s from mlrc_fold_run where status = 'complete'"
    )
    walls = [w for (w,) in rows or [] if w is not None]
    return max(walls) / ITERATIONS if walls else float("nan")


def soak_problems(
    r: P.Run, faults: list[Fault], f: dict[str, Any], a: Any, timed: bool = True
) -> list[str]:
    """What the run broke: the pool bench's store checks, then the soak's own (``timed``: each
    stop answered within the bound; the suite checks only that it was answered — a figure of
    a loaded test machine is not asserted)."""
    wrong = P.problems(r, f)
    bound = r.facts["step_s"] + BOUND_S
    for x in faults:
        code = x.worker.code
        if x.kind in STOPS and code != STOPS[x.kind]:
            wrong.append(f"{x.kind} to worker {x.worker.pid}: exit {code}, not {STOPS[x.kind]}")
        limit = bound + (OUTAGE_EXTRA_S if x.in_outage else 0.0) if timed else float("inf")
        if x.kind in STOPS and not (x.to_line_s is not None and x.to_line_s <= limit):
            wrong.append(f"{x.kind} to worker {x.worker.pid}: stopped line after {x.to_line_s} s")
        if x.kind.startswith("loader") and x.went_on is False:
            wrong.append(f"{x.kind}: worker {x.worker.pid} exited {code}")
    if len(faults) < a.signals:
        wrong.append(f"{len(faults)} signals sent, not {a.signals}")
    if len(r.facts.get("restarts", [])) < a.restarts:
        wrong.append(f"{len(r.facts.get('restarts', []))} restarts, not {a.restarts}")
    return wrong


def _outcome(x: Fault) -> str | int | None:
    """The worker's exit code; for a loader's fault, whether the worker went on (and retried
    its trial: the loader was in use)."""
    if not x.kind.startswith("loader"):
        return x.worker.code
    if not x.went_on:
        return "stopped"
    return "went on, trial retried" if x.to_line_s is not None else "went on"


def fault_table(faults: list[Fault], r: P.Run) -> str:
    """Markdown: per kind of fault, how many, blocked at start, exit codes, slowest answers."""
    lines = [
        "| fault | sent | to workers started with SIGTERM blocked | worker's exit "
        "| max to stopped (or retry) line, s | max to exit, s |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for kind in FAULTS:
        xs = [x for x in faults if x.kind == kind]
        if not xs:
            continue
        codes = Counter(_outcome(x) for x in xs)
        line_s = [x.to_line_s for x in xs if x.to_line_s is not None]
        exit_s = [x.to_exit_s for x in xs if x.to_exit_s is not None and x.kind in STOPS]
        lines.append(
            f"| {kind} | {len(xs)} | {sum(x.blocked for x in xs)} "
            f"| {', '.join(f'{c}: {n}' for c, n in sorted(codes.items(), key=str))} "
            f"| {max(line_s) if line_s else float('nan'):.2f} "
            f"| {max(exit_s) if exit_s else float('nan'):.2f} |"
        )
    return "\n".join(lines)


def markdown(runs: list[dict[str, Any]], machine: str, command: str) -> str:
    out = [
        "# Fault-injection soak (real folds, loader processes, PostgreSQL)",
        "",
        f"`{command}` — machine: {machine}",
        "",
    ]
    for i, x in enumerate(runs, 1):
        r, f = x["run"], x["facts"]
        out += [
            f"## Run {i}: {'all invariants held' if not x['wrong'] else 'FAILED'}",
            "",
            f"{r.trials} trials, {r.workers} workers, {len(x['faults'])} signals, "
            f"{len(r.facts.get('restarts', []))} database restarts (at "
            f"{', '.join(map(str, r.facts.get('restarts', [])))} complete trials); "
            f"{len(r.pool)} workers started; wall {r.wall_s:.0f} s; Optuna states "
            f"{dict(f['optuna_states'])}; longest step (fold wall ÷ steps) "
            f"{r.facts['step_s']:.3f} s, so the bound is {r.facts['step_s'] + BOUND_S:.2f} s "
            f"(+ {OUTAGE_EXTRA_S:g} s for the {sum(f.in_outage for f in x['faults'])} stops "
            "sent while the database was down).",
            "",
            fault_table(x["faults"], r),
            "",
        ]
        out += [f"- {w}" for w in x["wrong"]] or ["Every invariant held."]
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--signals", type=int, default=24)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (worker logs)")
    a = ap.parse_args()
    from common import machine

    from mlrc.store.throwaway import throwaway_postgres

    runs = []
    with throwaway_postgres() as pg:
        for i in range(a.runs):
            run_args = argparse.Namespace(**{**vars(a), "seed": a.seed + i})
            with tempfile.TemporaryDirectory(prefix="mlrc-soak-") as d:
                tmp = (a.keep / f"run{i + 1}") if a.keep else Path(d)
                tmp.mkdir(parents=True, exist_ok=True)
                print(f"run {i + 1}: {a.workers} workers, {a.trials} trials", flush=True)
                r, faults = soak(pg, tmp, run_args)
                f = P.verify(r)
                wrong = soak_problems(r, faults, f, run_args)
                runs.append({"run": r, "faults": faults, "facts": f, "wrong": wrong})
                print("\n".join(wrong) or "every invariant held", flush=True)
    command = f"python bench/soak.py {' '.join(sys.argv[1:])}".strip()
    text = markdown(runs, machine(), command)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.md").write_text(text)
    raise SystemExit(1 if any(x["wrong"] for x in runs) else 0)


if __name__ == "__main__":
    main()
