"""The fault-injection soak (issue #38), bounded for CI: ``bench/soak.py`` at small size — a
pool of ``mlrc worker`` processes training tiny real folds with a loader process each, on a
real PostgreSQL, takes every kind of signal once (workers, loaders, a whole process group,
workers started with SIGTERM blocked) and a database restart timed into a claim; the store and
the workers must hold every invariant the benchmark checks at full size (200 trials, 24
signals, 3 restarts, three runs: ``docs/guide/robustness.md``) — each stop answered, its time
being the benchmark's figure, not asserted on a loaded test machine."""

from __future__ import annotations

import argparse

import pytest
from conftest import bench_module


@pytest.mark.slow
def test_every_signal_and_a_restart_leave_every_invariant_held(tmp_path, postgres_server):
    bench = bench_module("soak")
    a = argparse.Namespace(
        workers=3, trials=14, signals=len(bench.FAULTS), restarts=1, seed=38, timeout=300.0
    )
    r, faults = bench.soak(postgres_server, tmp_path, a)
    f = bench.P.verify(r)
    wrong = bench.soak_problems(r, faults, f, a, timed=False)  # the bound is the bench's figure
    print(bench.markdown([{"run": r, "faults": faults, "facts": f, "wrong": wrong}], "here", ""))
    assert sorted(x.kind for x in faults) == sorted(bench.FAULTS)  # each kind once
    assert wrong == [], "\n".join(wrong)
    assert f["optuna_complete"] == f["mlrc_complete"] == a.trials
