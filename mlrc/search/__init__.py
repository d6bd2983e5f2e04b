"""A study end to end: Bayesian search over k-fold cross-validation, then the test stage.

Knows nothing of the loss it tunes: it draws parameters from the resolved search space and hands
them to the fold trainer. The Optuna study lives in the same database as mlrc's tables, under the
study's name. Re-running resumes: finished trials are kept, a trial left RUNNING by a dead process
is failed with the reason "interrupted" and re-enqueued with the same parameters, whose finished
folds are reused (``fold_run`` is keyed by a hash of the parameters) and whose interrupted fold
resumes from its ``last.pt``.

Modules: :mod:`~mlrc.search.context` (opening a study), :mod:`~mlrc.search.space` (search spaces
→ suggestions), :mod:`~mlrc.search.optuna_setup` (sampler, pruner, budget),
:mod:`~mlrc.search.objective` (a trial's folds → its value), :mod:`~mlrc.search.folds` (one
fold, idempotently), :mod:`~mlrc.search.heartbeat` (heartbeats, recovery of dead trials),
:mod:`~mlrc.search.backends` (local / worker pool, Ray), :mod:`~mlrc.search.test_stage` and
:mod:`~mlrc.search.baseline` (the test stage and its untrained row).
"""

from mlrc.search.backends.local import run_search
from mlrc.search.baseline import baseline_of, ensure_baseline
from mlrc.search.context import (
    Context,
    archive_study,
    build_context,
    code_version,
    derive_seed,
    fold_dir,
    open_study,
    params_hash,
    protocol_key,
    protocol_of,
    register_study,
)
from mlrc.search.errors import Interrupted, StudyError
from mlrc.search.folds import run_fold
from mlrc.search.heartbeat import HEARTBEAT_S, TrialHeartbeat, recover_interrupted
from mlrc.search.objective import PRUNED, finish_trial, run_objective, sequential_folds
from mlrc.search.optuna_setup import finished, make_pruner, optuna_study
from mlrc.search.test_stage import best_params, run_test

__all__ = [
    "HEARTBEAT_S",
    "PRUNED",
    "Context",
    "Interrupted",
    "StudyError",
    "TrialHeartbeat",
    "archive_study",
    "baseline_of",
    "best_params",
    "build_context",
    "code_version",
    "derive_seed",
    "ensure_baseline",
    "finish_trial",
    "finished",
    "fold_dir",
    "make_pruner",
    "open_study",
    "optuna_study",
    "params_hash",
    "protocol_key",
    "protocol_of",
    "recover_interrupted",
    "register_study",
    "run_fold",
    "run_objective",
    "run_search",
    "run_test",
    "sequential_folds",
]
