"""A SIGTERM whose KeyboardInterrupt a library swallows still stops ``mlrc study run``.

The command line turns SIGTERM into KeyboardInterrupt and then ignores further SIGTERMs (so its
cleanup is not cut short). Code that catches and drops that KeyboardInterrupt — a third-party
``except BaseException`` — would otherwise let the run go on to the end and exit 0, with nothing
recorded as interrupted. The handler also notes the signal, and the run raises KeyboardInterrupt
again at the next epoch or before the next trial. Here the child swallows the interrupt on
purpose: it sends itself SIGTERM inside ``try: … except KeyboardInterrupt: pass`` at an exact
point (the signal's handler runs there, in the main thread, before the ``try`` ends).
"""

from __future__ import annotations

import os
import signal

from .test_runtime import INTERRUPTED, Child, optuna_trials, trials, write_study


def _swallow_sigterm_after(module, name: str, when=lambda *a, **k: True) -> None:  # noqa: ANN001
    """In the child: after ``module.name`` runs (and ``when(*args)`` holds, once), SIGTERM this
    process and drop the KeyboardInterrupt it raises."""
    original = getattr(module, name)
    done = []

    def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = original(*args, **kwargs)
        if not done and when(*args, **kwargs):
            done.append(True)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler runs between these bytecodes
                    pass
            except KeyboardInterrupt:
                pass  # what a careless library does
        return out

    setattr(module, name, wrapped)


def _run(tmp_path, hook) -> tuple[Child, int, str]:
    path = write_study(tmp_path, "swallow", trials=2, over={"max_epochs": 2})
    db = tmp_path / "db.sqlite"
    args = ["study", "run", path, "--storage", f"sqlite:///{db}", "--artifacts", tmp_path / "a"]
    child = Child([[*args, "--quiet"]], tmp_path / "run", hook=hook)
    return child, child.wait(), db


def test_swallowed_mid_fold_the_next_epoch_stops_and_the_trial_is_interrupted(tmp_path):
    def hook() -> None:
        from mlrc.store import trials as store_trials

        _swallow_sigterm_after(store_trials, "record_epoch")  # epoch 0 of trial 0's first fold

    child, code, db = _run(tmp_path, hook)
    assert code == 143, child.output()
    assert child.stderr_lines() == [
        f"interrupted (SIGTERM): trial 0 marked interrupted; {INTERRUPTED}"
    ]
    assert {n: t[:2] for n, t in trials(db).items()} == {0: ("interrupted", "interrupted")}
    [t0, retry] = optuna_trials(f"sqlite:///{db}", "swallow")
    assert (t0.state.name, retry.state.name) == ("FAIL", "WAITING")


def test_swallowed_as_a_trial_ends_no_next_trial_starts(tmp_path):
    def hook() -> None:
        from mlrc.search import objective

        _swallow_sigterm_after(objective, "finish_trial")  # trial 0 complete, recorded

    child, code, db = _run(tmp_path, hook)
    assert code == 143, child.output()
    assert child.stderr_lines() == [f"interrupted (SIGTERM): {INTERRUPTED}"]
    assert [t[0] for t in trials(db).values()] == ["complete"]  # counted; trial 1 never began
    assert [t.state.name for t in optuna_trials(f"sqlite:///{db}", "swallow")] == ["COMPLETE"]


def test_swallowed_after_the_last_trial_the_command_still_exits_143(tmp_path):
    def hook() -> None:
        from mlrc.cli import study

        _swallow_sigterm_after(study, "print_status_by_name")  # the search is over

    child, code, db = _run(tmp_path, hook)
    assert code == 143, child.output()
    assert child.stderr_lines() == [f"interrupted (SIGTERM): {INTERRUPTED}"]
    assert [t[0] for t in trials(db).values()] == ["complete", "complete"]  # nothing lost
