"""Load and faults at pool scale (issue #15): N ``mlrc worker`` processes with no-op folds on one
throwaway PostgreSQL run a study of T trials while a supervisor SIGKILLs random workers (each
replaced at once, so the pool stays at N) and restarts the database once.

    .venv/bin/python bench/pool_load.py [--workers 8] [--trials 200] [--kills 10] [--no-restart]

The workers are children forked from this process after it imported mlrc (no Python + torch
start-up per worker); in each child only the fold trainer is replaced (``folds.train_fold``: one
"epoch", a value drawn from the fold's seed, which is a function of the trial's parameters, and
an empty ``best.pt``), so everything else is real: claims under the advisory lock, Optuna's
storage and sampler (TPE), heartbeats (1 s, grace 4 s), mlrc's rows, reconnects. The kills
fall at seeded random numbers of complete trials between 5 % and 85 % of the budget, each on a
worker that is running a trial; the restart (``pg_ctl stop -m fast``, 2 s down, start) at 50 %.

Afterwards the store is checked (:func:`verify`): exactly T complete trials in Optuna and in
``mlrc_trial``, no parameters complete twice, one fold row per (parameters, fold), all complete,
no trial RUNNING, every killed trial interrupted and retried, every worker not killed exited 0.
``tests/load/test_pool_load.py`` runs this at full size (8 workers, 200 trials, 10 kills, the restart)
and asserts the same, and plants kills between a claim's ask and its first heartbeat.

Figures: wall time; overhead per trial = wall × workers ÷ T (worker-seconds per complete trial)
and the median Optuna duration of a trial (claimed → told); where the surviving workers' time
went per trial they ran (waiting for the study's lock, Optuna's storage calls, mlrc's rows); the
database's connections in use (``pg_stat_activity``, this database, the poller excluded),
sampled every 0.2 s; the restart's recovery (server back → next complete trial). Writes
bench/results/pool_load.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import logging
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
GLYPHS = {"size": 24}
HEARTBEAT_S, GRACE_S = 1, 4
POLL_S = 0.2


# --- the worker children -------------------------------------------------------------------------


def noop_train_fold(spec: Any, on_validation: Any = None) -> Any:
    """A fold that trains nothing: one validated epoch whose metrics are drawn from the fold's
    seed (derived from the trial's parameters and the fold), and an empty ``best.pt`` so a
    retried trial reuses its finished folds as after a real fold."""
    from mlrc.train import EpochRecord, FoldResult

    value = random.Random(spec.seed).random()
    rec = EpochRecord(1, 1.0 - value, value, value, value)
    if on_validation is not None:
        on_validation(rec)
    workdir = Path(spec.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    best = workdir / "best.pt"
    best.touch()
    metrics = {"map_at_r": value, "precision_at_1": value, "r_precision": value}
    return FoldResult("complete", None, 1, metrics, [rec], str(best), objective=value)


class Timers:
    """Seconds the worker's main thread spends in each kind of database work (the outermost
    timed call only: a storage call made inside another is not counted twice)."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.depth = 0
        self.trials = 0  # started in this worker (mlrc's start_trial)

    def wrap(self, kind: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth or threading.current_thread() is not threading.main_thread():
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[kind] += time.perf_counter() - t0
                self.calls[kind] += 1
                self.depth -= 1

        return timed

    def install(self, noop: bool = True) -> None:
        """(``noop``: the fold trainer that trains nothing.) Time mlrc's row writes (``mlrc.store.studies``, ``trials``, ``results``), Optuna's storage (RDBStorage) and the
        wait for the study's advisory lock; count the trials started (``start_trial``)."""
        import optuna

        import mlrc.search.folds as folds
        import mlrc.store
        from mlrc.store import results, studies, trials

        if noop:
            folds.train_fold = noop_train_fold
        for module in (studies, trials, results):
            for name in dir(module):
                fn = getattr(module, name)
                if (
                    inspect.isfunction(fn)
                    and not name.startswith("_")
                    and fn.__module__ == module.__name__
                ):
                    setattr(module, name, self.wrap("mlrc rows", fn))
        start_trial = trials.start_trial

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.trials += 1
            return start_trial(*args, **kwargs)

        trials.start_trial = counted
        rdb = optuna.storages.RDBStorage
        for name, fn in list(vars(rdb).items()):
            if inspect.isfunction(fn) and not name.startswith("_"):
                setattr(rdb, name, self.wrap("optuna storage", fn))
        lock = mlrc.store.advisory_lock

        @contextlib.contextmanager
        def timed_lock(engine: Any, name: str, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            with lock(engine, name, **kwargs) as held:  # the HeldLock its claims check (#38)
                if threading.current_thread() is threading.main_thread():
                    self.seconds["lock wait"] += time.perf_counter() - t0
                yield held

        mlrc.store.advisory_lock = timed_lock

    def dump(self) -> dict[str, Any]:
        return {
            "seconds": dict(self.seconds),
            "trials": self.trials,
        }


def _child_main(
    args: list[str], log: Path, stats: Path, cache: Path, hook: Any = None, noop: bool = True
) -> None:
    """The forked worker: fresh signal dispositions and logging, the no-op trainer (unless not
    ``noop``) and the timers, ``hook()`` if given (a test plants a kill with it, the soak blocks
    SIGTERM), then ``mlrc ARGS``; writes its timers to ``stats`` and never returns."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 — the child's own
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        logging.root.handlers.clear()  # a parent's handlers (pytest's capture): the worker's own
        os.environ["MLRC_CACHE"] = str(cache)  # this run's worker lock files (cpu shares)
        timers = Timers()
        timers.install(noop)
        if hook is not None:
            hook()
        code = _mlrc(args)
        stats.write_text(json.dumps(timers.dump()))
    except BaseException:  # noqa: BLE001 — shown in the child's log
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _mlrc(args: list[str]) -> int:
    from mlrc.cli import app

    try:
        app(args, prog_name="mlrc")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    return 0


@dataclass
class Worker:
    """One forked ``mlrc worker``: its pid, log and timers file; ``code`` once reaped."""

    index: int
    pid: int
    log: Path
    stats: Path
    code: int | None = None
    killed: bool = False

    def alive(self) -> bool:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code is None

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        self.code, self.killed = os.waitstatus_to_exitcode(status), True

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def fork_worker(
    index: int, args: list[str], tmp: Path, hook: Any = None, noop: bool = True
) -> Worker:
    """``mlrc ARGS`` in a child forked from this process (log and timers in ``tmp``)."""
    log, stats = tmp / f"worker{index}.log", tmp / f"worker{index}.json"
    pid = os.fork()
    if pid == 0:
        _child_main(args, log, stats, tmp / "cache", hook, noop)
    return Worker(index, pid, log, stats)


# --- the supervisor ------------------------------------------------------------------------------


def study_file(tmp: Path, name: str, trials: int, seed: int) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs", "params": GLYPHS},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": seed},
        "test": {"reproductions": 2},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def new_pool(server: Any, tmp: Path, trials: int, seed: int) -> tuple[str, str, list[str]]:
    """A new database on ``server`` and a study of ``trials`` trials: (URL, study name, the
    arguments of its workers). Imports what the workers need here, before they are forked."""
    import mlrc.cli  # noqa: F401 — imported here once, inherited by every forked worker
    import mlrc.search  # noqa: F401
    from mlrc.data import build

    build("glyphs", **GLYPHS)  # rendered once here (lru_cache), inherited by every worker
    url = server.new_database()
    name = "pool-load"
    path = study_file(tmp, name, trials, seed)
    args = ["worker", str(path), "--storage", url, "--artifacts", str(tmp / "art")]
    args += ["--heartbeat", str(HEARTBEAT_S), "--grace", str(GRACE_S), "--quiet"]
    return url, name, args


def conninfo(url: str) -> str:
    """A libpq connection string for the SQLAlchemy ``url`` (the poller's own connections)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return (
        f"host={u.host} port={u.port} user={u.username} dbname={u.database} connect_timeout=2"
        + (f" password={u.password}" if u.password else "")
    )


def query(dsn: str, sql: str) -> list[tuple] | None:
    """``sql`` on a connection of its own, closed at once (never held across a fork); None
    while the server is down."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            return c.execute(sql).fetchall()
    except psycopg.Error:
        return None


LOAD_SQL = (
    "select (select count(*) from pg_stat_activity where datname = current_database()"
    " and pid <> pg_backend_pid()),"
    " (select count(*) from trials where state = 'COMPLETE')"
)
RUNNING_SQL = (
    "select t.number, a.value_json from trials t join trial_user_attributes a"
    " on a.trial_id = t.trial_id and a.key = 'worker' where t.state = 'RUNNING'"
)


def running_by_pid(dsn: str) -> dict[int, list[int]] | None:
    """pid → numbers of the RUNNING trials its worker claimed (this host's workers)."""
    rows = query(dsn, RUNNING_SQL)
    if rows is None:
        return None
    out: dict[int, list[int]] = {}
    host = socket.gethostname()
    for number, value in rows:
        who = json.loads(value)
        h, _, pid = who.rpartition(":")
        if h == host:
            out.setdefault(int(pid), []).append(number)
    return out


@dataclass
class Run:
    """What happened during one run and what it left (see :func:`run` and :func:`verify`)."""

    name: str
    url: str
    workers: int
    trials: int
    wall_s: float = 0.0
    kills: list[dict] = field(default_factory=list)  # {"pid", "at", "trials" (RUNNING then)}
    restart: dict | None = None  # {"at", "down_s", "recovery_s"}
    connections: list[int] = field(default_factory=list)
    pool: list[Worker] = field(default_factory=list)  # every worker, killed ones included
    timed_out: bool = False
    stats: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)


def run(
    server: Any,
    tmp: Path,
    *,
    workers: int = 8,
    trials: int = 200,
    kills: int = 10,
    restart: bool = True,
    seed: int = 15,
    timeout_s: float = 900.0,
    say: Any = print,
) -> Run:
    """One run on a new database of ``server`` (a :class:`mlrc.store.throwaway.PostgresServer`);
    the caller verifies it (:func:`verify`)."""
    url, name, args = new_pool(server, tmp, trials, seed)
    dsn = conninfo(url)
    rng = random.Random(seed)
    kill_at = sorted(rng.sample(range(max(1, trials // 20), max(2, trials * 85 // 100)), kills))
    restart_at = trials // 2 if restart else None
    out = Run(name, url, workers, trials)
    t0 = time.monotonic()
    live = [fork_worker(i, args, tmp) for i in range(workers)]
    out.pool.extend(live)
    complete, restarted_at_complete, back_at = 0, None, None
    while live:
        time.sleep(POLL_S)
        sample = query(dsn, LOAD_SQL)
        if sample:
            out.connections.append(sample[0][0])
            complete = sample[0][1]
        if back_at is not None and complete > restarted_at_complete:
            out.restart["recovery_s"] = time.monotonic() - back_at
            back_at = None
        live = [w for w in live if w.alive()]
        if kill_at and complete >= kill_at[0] and live:
            running = running_by_pid(dsn) or {}
            busy = [w for w in live if running.get(w.pid)]
            victim = rng.choice(busy or live)
            victim.kill()
            kill_at.pop(0)
            left = (running_by_pid(dsn) or {}).get(victim.pid, [])  # its trials, orphaned now
            out.kills.append({"pid": victim.pid, "at": complete, "trials": left})
            say(f"  killed worker {victim.pid} at {complete} complete trials (running {left})")
            new = fork_worker(len(out.pool), args, tmp)
            out.pool.append(new)
            live = [w for w in live if w is not victim] + [new]
        if restart_at is not None and complete >= restart_at:
            restart_at, restarted_at_complete = None, complete
            r0 = time.monotonic()
            server.restart(down_s=2.0)
            back_at = time.monotonic()
            out.restart = {"at": complete, "down_s": back_at - r0, "recovery_s": None}
            say(f"  restarted the database at {complete} complete trials ({back_at - r0:.1f} s)")
        if time.monotonic() - t0 > timeout_s:
            out.timed_out = True
            for w in live:
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    w.kill()
            break
    out.wall_s = time.monotonic() - t0
    out.stats = _worker_stats(out.pool)
    out.logs = log_events(out.pool)
    return out


LOG_EVENTS = {  # the workers' warnings, counted over the pool
    "trials retried after a missed heartbeat": "no heartbeat for more than",
    "claims that died before their first heartbeat": "stopped before its first heartbeat",
    "results dropped (trial declared lost while it ran)": "was declared lost",
    "database calls retried after a lost connection": "connection lost",
    "failed reconnection attempts": "unreachable",
}


def log_events(pool: list[Worker]) -> dict[str, int]:
    lines = [
        line
        for w in pool
        if w.log.is_file()
        for line in w.output().splitlines()
        if " WARNING " in line
    ]
    return {k: sum(marker in line for line in lines) for k, marker in LOG_EVENTS.items()}


def _worker_stats(pool: list[Worker]) -> dict[str, Any]:
    """The surviving workers' timers, summed: seconds per kind and the trials they ran."""
    seconds: Counter[str] = Counter()
    n = 0
    for w in pool:
        if w.killed or not w.stats.is_file():
            continue
        d = json.loads(w.stats.read_text())
        seconds.update(d["seconds"])
        n += d["trials"]
    return {"seconds": dict(seconds), "trials": n}


# --- what the run left ---------------------------------------------------------------------------


def verify(r: Run) -> dict[str, Any]:
    """Facts about the store the run left (the test asserts on them; the bench prints them)."""
    import optuna
    from optuna.trial import TrialState

    from mlrc.search.backends.local import LOST_CLAIM

    dsn = conninfo(r.url)
    storage = optuna.storages.RDBStorage(r.url)
    try:
        ts = optuna.load_study(study_name=r.name, storage=storage).get_trials(deepcopy=False)
    finally:
        storage.engine.dispose()
    states = Counter(t.state.name for t in ts)
    by_number = {t.number: t for t in ts}
    retries: dict[int, list[int]] = {}
    for t in ts:
        if "retry_of" in t.user_attrs:
            retries.setdefault(t.user_attrs["retry_of"], []).append(t.number)
    rows = query(dsn, "select number, state, reason, params_hash, value from mlrc_trial") or []
    mlrc = {n: (state, reason, h, v) for n, state, reason, h, v in rows}
    complete_hashes = [h for state, _, h, _ in mlrc.values() if state == "complete"]
    folds = query(dsn, "select params_hash, fold, status from mlrc_fold_run") or []
    dup_folds = query(
        dsn,
        "select count(*) from (select 1 from mlrc_fold_run group by study_id, kind, params_hash,"
        " reproduction, fold having count(*) > 1) d",
    )
    dup_epochs = query(
        dsn,
        "select count(*) from (select 1 from mlrc_epoch_metric group by fold_run_id, epoch"
        " having count(*) > 1) d",
    )

    def ends_complete(number: int, seen: int = 0) -> bool:
        """The trial, or a retry of it (of a retry ...), is COMPLETE."""
        if by_number[number].state == TrialState.COMPLETE:
            return True
        return seen < 20 and any(ends_complete(n, seen + 1) for n in retries.get(number, []))

    failed = [t for t in ts if t.state == TrialState.FAIL]

    def lost_claim(t: optuna.trial.FrozenTrial) -> bool:
        """Drawn while the study's lock was lost: not counted, never started (no mlrc row)."""
        return t.user_attrs.get("reason") == LOST_CLAIM and t.number not in mlrc

    # every parameter of the space: those of any complete trial (all of them are drawn there)
    space = set().union(*(t.params for t in ts if t.state == TrialState.COMPLETE))
    killed = [n for k in r.kills for n in k["trials"]]
    values_match = all(
        abs(mlrc[t.number][3] - t.value) < 1e-12
        for t in ts
        if t.state == TrialState.COMPLETE and t.number in mlrc and mlrc[t.number][3] is not None
    )
    return {
        "optuna_states": dict(states),
        "optuna_complete": states.get("COMPLETE", 0),
        "mlrc_complete": len(complete_hashes),
        "complete_numbers_agree": sorted(n for n, m in mlrc.items() if m[0] == "complete")
        == sorted(t.number for t in ts if t.state == TrialState.COMPLETE),
        "values_agree": values_match,
        "params_complete_twice": len(complete_hashes) - len(set(complete_hashes)),
        "fold_rows": len(folds),
        "fold_rows_not_complete": sum(s != "complete" for _, _, s in folds),
        "fold_params_not_complete_trials": len({h for h, _, _ in folds} ^ set(complete_hashes)),
        "duplicate_fold_rows": dup_folds[0][0] if dup_folds else None,
        "duplicate_epoch_rows": dup_epochs[0][0] if dup_epochs else None,
        "running_or_waiting": states.get("RUNNING", 0) + states.get("WAITING", 0),
        "failed": len(failed),
        "failed_not_interrupted": [
            t.number
            for t in failed
            if mlrc.get(t.number, ("?",))[0] != "interrupted" and not lost_claim(t)
        ],
        # A claim that died while drawing (a lost connection mid-suggest, retried by asking
        # again), or that lost the study's lock after it drew (the database restarted), is not
        # retried with its draw: the next claim draws at its position.
        "failed_not_retried": [
            t.number
            for t in failed
            if set(t.params) >= space and not ends_complete(t.number) and not lost_claim(t)
        ],
        "failed_while_drawing": [
            t.number for t in failed if set(t.params) < space or lost_claim(t)
        ],
        "killed_trials": killed,
        "killed_not_interrupted_and_retried": [
            n
            for n in killed
            if by_number[n].state != TrialState.FAIL
            or mlrc.get(n, ("?",))[0] != "interrupted"
            or not ends_complete(n)
        ],
        "bad_exits": [
            (w.pid, w.code) for w in r.pool if not w.killed and (w.code != 0 or w.code is None)
        ],
        "median_trial_s": statistics.median(
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in ts
            if t.state == TrialState.COMPLETE
        )
        if states.get("COMPLETE")
        else None,
    }


def problems(r: Run, f: dict[str, Any]) -> list[str]:
    """What is wrong with the run (empty: all is as it must be)."""
    wrong = []
    if r.timed_out:
        wrong.append("the pool did not finish in time")
    if not (f["optuna_complete"] == f["mlrc_complete"] == r.trials):
        wrong.append(f"complete trials: Optuna {f['optuna_complete']}, mlrc {f['mlrc_complete']}")
    for key in ("complete_numbers_agree", "values_agree"):
        if not f[key]:
            wrong.append(key.replace("_", " ") + ": no")
    zero = (
        "params_complete_twice",
        "fold_rows_not_complete",
        "fold_params_not_complete_trials",
        "duplicate_fold_rows",
        "duplicate_epoch_rows",
        "running_or_waiting",
    )
    wrong += [f"{k}: {f[k]}" for k in zero if f[k] != 0]
    if f["fold_rows"] != 4 * r.trials:
        wrong.append(f"fold rows: {f['fold_rows']}, not {4 * r.trials}")
    lists = ("failed_not_interrupted", "failed_not_retried", "killed_not_interrupted_and_retried")
    wrong += [f"{k}: {f[k]}" for k in (*lists, "bad_exits") if f[k]]
    return wrong


def figures(r: Run, f: dict[str, Any]) -> dict[str, Any]:
    """The run's figures, for the table."""
    s = r.stats
    per = {k: v / s["trials"] for k, v in s["seconds"].items()} if s["trials"] else {}
    conns = r.connections or [0]
    return {
        "workers": r.workers,
        "trials": r.trials,
        "wall_s": r.wall_s,
        "overhead_s": r.wall_s * r.workers / r.trials,
        "median_trial_s": f["median_trial_s"],
        "lock_wait_s": per.get("lock wait"),
        "optuna_storage_s": per.get("optuna storage"),
        "mlrc_rows_s": per.get("mlrc rows"),
        "timed_trials": s["trials"],
        "connections_max": max(conns),
        "connections_mean": statistics.fmean(conns),
        "kills": len(r.kills),
        "killed_trials": len(f["killed_trials"]),
        "failed": f["failed"],
        "failed_while_drawing": len(f["failed_while_drawing"]),
        "restart_down_s": r.restart["down_s"] if r.restart else None,
        "restart_recovery_s": r.restart["recovery_s"] if r.restart else None,
        "logs": r.logs,
    }


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown(g: dict[str, Any], wrong: list[str], machine: str, command: str = "") -> str:
    rows = [
        ("workers", g["workers"]),
        ("complete trials (budget)", g["trials"]),
        ("wall time, s", _fmt(g["wall_s"], 1)),
        ("overhead per trial (wall × workers ÷ trials), worker-s", _fmt(g["overhead_s"])),
        ("median Optuna duration of a trial (claimed → told), s", _fmt(g["median_trial_s"])),
        ("per trial: waiting for the study's lock, s", _fmt(g["lock_wait_s"], 3)),
        ("per trial: Optuna storage calls, s", _fmt(g["optuna_storage_s"], 3)),
        ("per trial: mlrc rows (trial, folds, epochs), s", _fmt(g["mlrc_rows_s"], 3)),
        ("trials timed (workers not killed)", g["timed_trials"]),
        ("database connections in use, max", g["connections_max"]),
        ("database connections in use, mean", _fmt(g["connections_mean"], 1)),
        (
            "database connections in use, mean per worker",
            _fmt(g["connections_mean"] / g["workers"], 1),
        ),
        ("SIGKILLs (each worker replaced at once)", g["kills"]),
        ("trials left RUNNING by a kill", g["killed_trials"]),
        ("Optuna FAIL trials (interrupted or lost: retried, or drawn again)", g["failed"]),
        (
            "… of which died while drawing or lost the lock (drawn again at their position)",
            g["failed_while_drawing"],
        ),
        ("database restart: down (stop -m fast, 2 s, start), s", _fmt(g["restart_down_s"], 1)),
        ("database restart: back up → next complete trial, s", _fmt(g["restart_recovery_s"], 1)),
        *[(f"worker logs: {k}", v) for k, v in g["logs"].items()],
    ]
    lines = [
        "# Worker pool under load and faults (no-op folds, PostgreSQL)",
        "",
        "`bench/pool_load.py`: the pool's orchestration alone (every fold trains nothing), "
        f"heartbeat {HEARTBEAT_S} s, grace {GRACE_S} s, 4 folds per trial, TPE. Per-trial "
        "database times are the main thread's, summed over the workers that were not killed "
        "and divided by the trials they ran; connections are sampled every 0.2 s.",
        "",
        f"Machine: {machine}",
        "",
        *([f"Command: `{command}`", ""] if command else []),
        "| figure | value |",
        "|---|---:|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
        "Checks: "
        + ("all passed" if not wrong else "; ".join(wrong))
        + " (exactly the budget of complete trials in Optuna and mlrc_trial, no parameters "
        "complete twice, one complete fold row per (parameters, fold), no duplicate epoch row, "
        "nothing RUNNING, every killed trial interrupted and retried, every other worker "
        "exited 0).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--no-restart", dest="restart", action="store_false")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (worker logs)")
    a = ap.parse_args()
    sys.path.insert(0, str(BENCH))
    from common import machine

    from mlrc.store.throwaway import throwaway_postgres

    with (
        tempfile.TemporaryDirectory(prefix="mlrc-pool-load-") as d,
        throwaway_postgres() as pg,
    ):
        tmp = a.keep or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        print(f"{a.workers} workers, {a.trials} trials, {a.kills} kills, restart {a.restart}")
        r = run(
            pg,
            tmp,
            workers=a.workers,
            trials=a.trials,
            kills=a.kills,
            restart=a.restart,
            seed=a.seed,
        )
        f = verify(r)
        wrong = problems(r, f)
        for w in r.pool:
            if not w.killed and w.code != 0:
                print(f"--- worker {w.pid} exited {w.code}:\n{w.output()[-3000:]}")
                for tb in (tmp / "cache" / "logs").glob(f"*-{w.pid}.log"):
                    print(tb.read_text()[-6000:])
        g = figures(r, f)
    command = f"python bench/pool_load.py {' '.join(sys.argv[1:])}".strip()
    text = markdown(g, wrong, machine(), command)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pool_load.md").write_text(text)
    print(f"wrote {RESULTS / 'pool_load.md'}")
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
