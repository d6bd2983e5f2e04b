"""A study end to end: Bayesian search over k-fold cross-validation, then the test stage.

Knows nothing of the loss it tunes: it draws parameters from the resolved search space and hands
them to the fold trainer. The Optuna study lives in the same database as mlrc's tables, under the
study's name. Re-running resumes: finished trials are kept, a trial left RUNNING by a dead process
is failed with the reason "interrupted" and re-enqueued with the same parameters, whose finished
folds are reused (``fold_run`` is keyed by a hash of the parameters) and whose interrupted fold
resumes from its ``last.pt``.

Modules: :mod:`~mlrc.search.session` (a study opened: :class:`StudySession`),
:mod:`~mlrc.search.artifacts` (its files on disk), :mod:`~mlrc.search.retention` (which of them
stay), :mod:`~mlrc.search.space` (search spaces
→ suggestions), :mod:`~mlrc.search.optuna_setup` (sampler, pruner, budget),
:mod:`~mlrc.search.objective` (a trial's folds → its value), :mod:`~mlrc.search.folds` (one
fold, idempotently), :mod:`~mlrc.search.heartbeat` (heartbeats, recovery of dead trials),
:mod:`~mlrc.search.backends` (local / worker pool, Ray), :mod:`~mlrc.search.reproductions` and
:mod:`~mlrc.search.baseline` (the test stage and its untrained row).
"""

from mlrc.search.artifacts import archive_study
from mlrc.search.backends.local import run_search
from mlrc.search.baseline import baseline_of, ensure_baseline
from mlrc.search.errors import Interrupted, StudyError
from mlrc.search.folds import run_fold
from mlrc.search.heartbeat import HEARTBEAT_S, TrialHeartbeat, recover_interrupted
from mlrc.search.objective import PRUNED, finish_trial, run_objective, sequential_folds
from mlrc.search.optuna_setup import finished, make_pruner, optuna_study
from mlrc.search.reproductions import best_params, run_test
from mlrc.search.session import StudySession, build_session, open_study, register_study

__all__ = [
    "HEARTBEAT_S",
    "PRUNED",
    "StudySession",
    "Interrupted",
    "StudyError",
    "TrialHeartbeat",
    "archive_study",
    "baseline_of",
    "best_params",
    "build_session",
    "ensure_baseline",
    "finish_trial",
    "finished",
    "make_pruner",
    "open_study",
    "optuna_study",
    "recover_interrupted",
    "register_study",
    "run_fold",
    "run_objective",
    "run_search",
    "run_test",
    "sequential_folds",
]
