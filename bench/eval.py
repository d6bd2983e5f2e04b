"""Retrieval metrics: ``mlrc.protocol.metrics.retrieval_metrics`` vs PML's AccuracyCalculator.

    .venv/bin/python bench/eval.py            # all sets below, best of 3 each
    .venv/bin/python bench/eval.py --quick    # small sets, one run each, no CSV (smoke test)
    .venv/bin/python bench/eval.py --only "CUB-128 identical" --repeats 1

Data: clustered synthetic embeddings (class centres ~ N(0, I), items = centre + spread·N(0, I),
rows shuffled) at the test-set sizes of CUB-200-2011 (5,924 items, 100 classes of 41..60) in
128-D and 512-D and of Stanford Online Products (60,502 items, 11,316 classes of 2..12) in
128-D; the spreads put MAP@R in the range trained models reach. Tie-heavy variants of the
128-D sets, with the same labels: "identical" (every row the same vector, as from identical
inputs or a fully collapsed model), "collapsed" (that vector + 1e-6·N(0, I), a nearly collapsed
model) and "quantised" (the clustered set rounded to integers, like a low-bit quantised head).
These are where an exact ranking meets its ties, and where it used to be slowest.

Both sides compute MAP@R, P@1 and R-Precision the MLRC way: PML 2.9 as its tester does (rows
L2-normalised with torch, then ``AccuracyCalculator(k="max_bin_count")``, faiss ranking on CPU)
and ours with ``retrieval_metrics`` (exact float64 ranking, ties to the lower index). Each
(method, set) runs in its own subprocess with default threading (all cores for torch, numpy's
BLAS and faiss), interleaved ours/PML and repeated; the table shows the best wall time of each,
their ratio (ours/PML), the largest absolute difference of the three values, and the peak
resident memory each needed above its own baseline (VmHWM after ``/proc/self/clear_refs``,
taken after imports, data generation and a small warm-up call, so one-time library set-up is
not counted). On the clustered sets the values must agree within 1e-6; on the tie-heavy ones
PML's float32 ranking orders ties and near-ties its own way, so the difference is only shown.
Writes ``bench/results/eval.csv`` with the machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from common import machine, write_csv  # noqa: E402

PML_KEYS = {
    "map_at_r": "mean_average_precision_at_r",
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
}
TOLERANCE = 1e-6  # largest accepted |ours − PML| of any value (clustered sets)
KINDS = ("clustered", "identical", "collapsed", "quantised")


@dataclass(frozen=True)
class Config:
    """One synthetic test set: n items in ``classes`` classes of lo..hi items, d dimensions,
    embeddings of one of ``KINDS``."""

    name: str
    n: int
    d: int
    classes: int
    lo: int
    hi: int
    spread: float  # noise standard deviation per dimension, relative to the centres'
    kind: str = "clustered"

    def variant(self, kind: str) -> Config:
        """The same layout and labels with embeddings of another kind."""
        return replace(self, name=f"{self.name} {kind}", kind=kind)


def _with_tie_heavy(configs: list[Config]) -> list[Config]:
    """Each config, then after them the tie-heavy variants of the 128-D ones."""
    tied = [c.variant(kind) for c in configs if c.d == 128 for kind in KINDS[1:]]
    return configs + tied


CONFIGS = {
    "full": _with_tie_heavy(
        [
            Config("CUB-128", 5924, 128, 100, 41, 60, 2.1),
            Config("CUB-512", 5924, 512, 100, 41, 60, 3.1),
            Config("SOP-128", 60502, 128, 11316, 2, 12, 1.4),
        ]
    ),
    "quick": _with_tie_heavy(
        [
            Config("CUB-128/4", 1481, 128, 25, 41, 60, 2.1),
            Config("SOP-128/8", 7563, 128, 1414, 2, 12, 1.4),
        ]
    ),
}


def class_sizes(c: Config, rng: np.random.Generator) -> np.ndarray:
    """``c.classes`` sizes in [lo, hi] summing to n, binomially spread around their mean."""
    p = (c.n / c.classes - c.lo) / (c.hi - c.lo)
    sizes = c.lo + rng.binomial(c.hi - c.lo, p, c.classes)
    while (gap := c.n - int(sizes.sum())) != 0:
        i = int(rng.integers(c.classes))
        if gap > 0 and sizes[i] < c.hi:
            sizes[i] += 1
        elif gap < 0 and sizes[i] > c.lo:
            sizes[i] -= 1
    return sizes


def embeddings(c: Config, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Float32 embeddings (n × d) and int64 labels of the synthetic set ``c``."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(c.classes), class_sizes(c, rng))
    centres = rng.standard_normal((c.classes, c.d), dtype=np.float32)
    x = centres[labels] + c.spread * rng.standard_normal((c.n, c.d), dtype=np.float32)
    order = rng.permutation(c.n)
    x, labels = x[order], labels[order]
    if c.kind == "identical":
        x = np.repeat(x[:1], c.n, axis=0)
    elif c.kind == "collapsed":
        x = x[:1] + 1e-6 * rng.standard_normal((c.n, c.d), dtype=np.float32)
    elif c.kind == "quantised":
        x = np.round(x)
    elif c.kind != "clustered":
        raise ValueError(f"unknown kind {c.kind!r}, expected one of {KINDS}")
    return x, labels


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


Method = Callable[[np.ndarray, np.ndarray], dict[str, float]]


def _ours() -> Method:
    from mlrc.protocol.metrics import retrieval_metrics

    def run(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        out = retrieval_metrics(x, y)
        return {k: out[k] for k in PML_KEYS}

    return run


def _pml() -> Method:
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(include=tuple(PML_KEYS.values()), k="max_bin_count")

    def run(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        q = torch.nn.functional.normalize(torch.from_numpy(x), p=2, dim=1)
        out = calc.get_accuracy(q, torch.from_numpy(y))
        return {k: float(out[v]) for k, v in PML_KEYS.items()}

    return run


def worker(method: str, config: Config) -> dict[str, object]:
    """Run one method once on one set; wall time (s) and peak RSS growth (MB) of the call."""
    x, y = embeddings(config)
    run = _ours() if method == "ours" else _pml()
    run(x[:500], y[:500])  # warm-up: imports, thread pools, BLAS buffers
    exact = _reset_peak()
    base = _status_mb("VmRSS")
    start = time.perf_counter()
    values = run(x, y)
    seconds = time.perf_counter() - start
    if exact:
        peak = _status_mb("VmHWM") - base
    else:  # ru_maxrss (KiB) is the peak since start: growth is at least this
        peak = max(0.0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)
    return {"values": values, "seconds": seconds, "peak_mb": peak}


def run_worker(method: str, config: Config, quick: bool) -> dict[str, object]:
    cmd = [sys.executable, __file__, "--worker", method, "--config", config.name]
    done = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{method} on {config.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(config: Config, repeats: int, quick: bool, console: Console) -> dict[str, object]:
    """Interleaved runs (ours, PML, then PML, ours, …): best time, largest peak, value gap."""
    runs: dict[str, list[dict]] = {"ours": [], "pml": []}
    for rep in range(repeats):
        for method in ("ours", "pml") if rep % 2 == 0 else ("pml", "ours"):
            r = run_worker(method, config, quick)
            runs[method].append(r)
            console.log(f"{config.name} {method} run {rep + 1}: {r['seconds']:.2f} s")
    ours, pml = runs["ours"][0]["values"], runs["pml"][0]["values"]
    best = {m: min(r["seconds"] for r in rs) for m, rs in runs.items()}
    peak = {m: max(r["peak_mb"] for r in rs) for m, rs in runs.items()}
    return {
        "set": config.name,
        "n": config.n,
        "d": config.d,
        "classes": config.classes,
        "kind": config.kind,
        **{f"ours_{k}": v for k, v in ours.items()},
        "max_abs_diff": max(abs(ours[k] - pml[k]) for k in PML_KEYS),
        "ours_s": best["ours"],
        "pml_s": best["pml"],
        "ratio": best["ours"] / best["pml"],
        "ours_peak_mb": peak["ours"],
        "pml_peak_mb": peak["pml"],
        "ours_all_s": " ".join(f"{r['seconds']:.2f}" for r in runs["ours"]),
        "pml_all_s": " ".join(f"{r['seconds']:.2f}" for r in runs["pml"]),
        "repeats": repeats,
    }


def table(rows: list[dict[str, object]]) -> Table:
    t = Table(title="retrieval_metrics vs PML AccuracyCalculator (best of interleaved runs)")
    t.add_column("set")
    for col in ("n × d", "MAP@R", "max |Δ|", "ours s", "PML s", "ours/PML", "peak MB ours / PML"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r["set"]),
            f"{r['n']:,} × {r['d']}",
            f"{r['ours_map_at_r']:.4f}",
            f"{r['max_abs_diff']:.1e}",
            f"{r['ours_s']:.2f}",
            f"{r['pml_s']:.2f}",
            f"{r['ratio']:.3f}",
            f"{r['ours_peak_mb']:.0f} / {r['pml_peak_mb']:.0f}",
        )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sets, one run each")
    ap.add_argument(
        "--repeats", type=int, default=None, help="runs per method (default 3, quick 1)"
    )
    ap.add_argument("--only", nargs="+", metavar="SET", help="run only these sets (names above)")
    ap.add_argument("--worker", choices=("ours", "pml"), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    configs = CONFIGS["quick" if args.quick else "full"]
    if args.worker:
        config = next(c for c in configs if c.name == args.config)
        print(json.dumps(worker(args.worker, config)))
        return
    if args.only:
        configs = [c for c in configs if c.name in args.only]
    console = Console(width=max(Console().width, 110))  # the table fits when piped
    console.log(machine())
    repeats = args.repeats or (1 if args.quick else 3)
    rows = [measure(c, repeats, args.quick, console) for c in configs]
    console.print(table(rows))
    if args.quick:
        console.log("quick run: bench/results/eval.csv left as it is")
    else:
        console.log(f"wrote {write_csv(pd.DataFrame(rows), 'eval')}")
    worst = max((r["max_abs_diff"] for r in rows if r["kind"] == "clustered"), default=0.0)
    if worst > TOLERANCE:
        raise SystemExit(f"values differ from PML by {worst:.2e} > {TOLERANCE:.0e}")


if __name__ == "__main__":
    main()
