"""How a campaign's wall-clock scales with its pool: 1, 2, 4, 8, 16 ``mlrc worker CAMPAIGN.yaml``
processes on a throwaway PostgreSQL, every fold a fixed simulated duration (a sleep), so that what
is measured is the store and the claims, not the training.

    python bench/campaign_scaling.py [--workers 1 2 4 8 16] [--fold-s 0.5] [--studies 8]
                                     [--trials 8] [--reproductions 2]

Each study is ``trials`` × 2 folds of search and ``reproductions`` × 2 test folds, each fold
``--fold-s`` seconds; a reproduction's rows are written as soon as its folds are done (metrics
drawn from its seed: no embedding). A sleeping fold holds no core, so 16 workers on 2 cores
measure the pool, not the CPU.

Columns: work = fold units × fold seconds (what one worker would spend); span = first fold start
to last fold end; efficiency = work ÷ (N × span), 1.0 being perfect; units/s = fold units ÷ span
(claims served per second over the campaign); wall = the whole command, process start-up and the
campaign's registration included. Writes ``bench/results/campaign_scaling.md`` with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
LOSSES = ["contrastive", "triplet", "ntxent", "multi_similarity", "margin", "cosface",
          "arcface", "fastap", "lifted_structure", "soft_triple"]  # fmt: skip
RESULTS = BENCH / "results"


def _patch(fold_s: float, log: Path) -> None:
    """In a worker: every fold sleeps ``fold_s`` and reports a value drawn from its seed (its
    start and end appended to ``log``); a reproduction's rows are recorded without embedding."""
    import mlrc.search.campaign_pool as pool
    import mlrc.search.folds as folds
    from mlrc.store import results
    from mlrc.train import FoldResult

    def train_fold(spec, on_validation=None):  # noqa: ANN001, ANN202 — FoldSpec → FoldResult
        start = time.time()
        time.sleep(fold_s)
        value = random.Random(spec.seed).random()
        with log.open("a") as f:
            f.write(f"{start} {time.time()}\n")
        metrics = {"map_at_r": value, "precision_at_1": value, "r_precision": value}
        return FoldResult("complete", None, 1, metrics, objective=value,
                          checkpoint=str(Path(spec.workdir) / "best.pt"))  # fmt: skip

    def finish_reproduction(ctx, params, rep):  # noqa: ANN001, ANN202
        m = {"map_at_r": 0.5, "precision_at_1": 0.5, "r_precision": 0.5}
        rows = [("separated", k, m) for k in range(len(ctx.split.folds))]
        rows += [("separated", -1, m), ("concatenated", -1, m)]
        results.record_reproduction(ctx.engine, ctx.study_id, rep, params, rows)

    folds.train_fold = train_fold
    folds.fold_slot = lambda *_a, **_k: contextlib.nullcontext()  # a sleep holds no core
    pool.finish_reproduction = finish_reproduction


def _campaign(tmp: Path, studies: int, trials: int, reproductions: int) -> Path:
    names = LOSSES[:studies]
    doc = {
        "name": "scaling",
        "datasets": [{"name": "glyphs"}],
        "losses": names,
        "preset": "cpu",
        "search": {"trials": trials, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": reproductions},
        "overrides": {"folds": 2},
    }
    path = tmp / "scaling.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(path: Path, url: str, n: int, fold_s: float, tmp: Path) -> dict:
    """N workers on the campaign; the figures of the run."""
    log = tmp / f"folds-{n}.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLRC_STORAGE": url}
    cmd = [sys.executable, __file__, "worker", "--fold-s", str(fold_s), "--log", str(log), "--",
           str(path), "--artifacts", str(tmp / f"art-{n}"), "--threads", "1", "--quiet",
           "--skip-checks"]  # fmt: skip
    t0 = time.monotonic()
    logs = [tmp / f"worker-{n}-{i}.log" for i in range(n)]
    procs = [subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
             for log in logs]  # fmt: skip
    for p, out in zip(procs, logs, strict=True):
        if p.wait() != 0:
            said = [ln for ln in out.read_text().splitlines() if " INFO " not in ln]
            raise SystemExit(f"a worker exited {p.returncode}:\n" + "\n".join(said[-30:]))
    wall = time.monotonic() - t0
    spans = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    work = len(spans) * fold_s
    return {"workers": n, "fold units": len(spans), "work s": work, "span s": span,
            "efficiency": work / (n * span), "units/s": len(spans) / span, "wall s": wall}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--fold-s", type=float, default=0.5)
    ap.add_argument("--studies", type=int, default=8, help=f"at most {len(LOSSES)}")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--reproductions", type=int, default=2)
    args = ap.parse_args()
    from mlrc.store.throwaway import throwaway_postgres

    rows = []
    with tempfile.TemporaryDirectory(prefix="mlrc-scaling-") as d, throwaway_postgres() as pg:
        tmp = Path(d)
        path = _campaign(tmp, args.studies, args.trials, args.reproductions)
        for n in args.workers:
            rows.append(_run(path, pg.new_database(), n, args.fold_s, tmp))
            print(json.dumps(rows[-1]), flush=True)
    _write(rows, args)


def _write(rows: list[dict], args: argparse.Namespace) -> None:
    import platform

    cols = list(rows[0])
    lines = [
        "# Campaign workers: scaling with the pool (sleeping folds, throwaway PostgreSQL)",
        "",
        f"`python bench/campaign_scaling.py --workers {' '.join(map(str, args.workers))} "
        f"--fold-s {args.fold_s} --studies {args.studies} --trials {args.trials} "
        f"--reproductions {args.reproductions}` — machine: {platform.node()} "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---:|" * len(cols),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r[c]) for c in cols) + " |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "campaign_scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cell(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":  # one pool worker, its folds simulated
        i = sys.argv.index("--")
        opts = dict(zip(sys.argv[2:i:2], sys.argv[3:i:2], strict=True))
        _patch(float(opts["--fold-s"]), Path(opts["--log"]))
        from mlrc.cli import app

        app(["worker", *sys.argv[i + 1 :]])
    else:
        main()
