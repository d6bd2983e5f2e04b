"""Shared fixtures. Parts absent on a laptop skip with a reason; in CI they must exist."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# The tests mirror the package (tests/<package>/test_<module>.py); a few share helpers and
# fixtures by module name across folders (test_dashboard's browser, test_session's study_file),
# so every folder is importable, as the flat folder was. Test file names are unique.
sys.path[1:1] = [
    str(d)
    for d in sorted(TESTS.iterdir())
    if d.is_dir() and any(d.glob("test_*.py")) and not (d / "__init__.py").exists()
]

# One cache per test session (unless the caller sets one): mlrc processes elsewhere on the host
# (another test session, a study) register in $MLRC_CACHE/workers and would change this
# session's fair CPU share — hence torch's thread count, hence the numbers tests compare — and
# tracebacks of failing commands stay out of ~/.cache/mlrc/logs.
if "MLRC_CACHE" not in os.environ:
    os.environ["MLRC_CACHE"] = tempfile.mkdtemp(prefix="mlrc-test-cache-")
    atexit.register(shutil.rmtree, os.environ["MLRC_CACHE"], ignore_errors=True)
# A suite started in the background of a script (`make test &`) inherits SIGINT ignored, and
# every mlrc it starts warns about that on stderr; the tests that expect one line of output
# would fail for the shell's reason. Ctrl-C works again in the suite and in its children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# One torch thread per process. The suite runs as two processes (pytest-xdist, `make test`)
# and many tests start more (pool workers, ranks): torch's default of one thread per core
# spins in OpenMP barriers, and two such threads beside one busy process ran 8x slower than
# one thread (tiny_cnn steps, 2 cores, measured). Set before torch is imported anywhere here;
# children inherit it. The tests of thread counts themselves set their own.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# The real Omniglot subset: a data part beside a developer's clone and in CI (never committed),
# absent from a user's clone, where its tests skip. Besides it, only the check that
# tests/fixtures/reference still copies the paper notes looks beside the clone.
OMNIGLOT_DEFAULT = REPO.parent / "shared" / "datasets" / "omniglot" / "images_background_small1.zip"


# The test files that take longest (40 s or more each in a two-process run on the 2-core VM,
# measured from a run's junit XML), heaviest first. `make test` runs files on its processes in
# collection order (--dist loadfile --no-loadscope-reorder: xdist's default reorder puts the
# files with the most tests first, which left the few-test load files to the end): these start
# first, so the processes end together. A file missing here only costs balance. The three files
# that start a local Ray are spaced apart: started together (three Ray clusters on 2 cores),
# their Ray tests took 230–320 s each instead of 45–120 s.
HEAVY_FIRST = [
    "load/test_ray.py",
    "e2e/test_invariants.py",
    "load/test_slurm.py",
    "search/test_retention.py",
    "load/test_campaign_pool.py",
    "search/test_settings.py",
    "search/test_session.py",
    "load/test_pool.py",
    "load/test_ranks_pool.py",
    "e2e/test_tutorial.py",
    "train/test_ranks.py",
    "e2e/test_wheel.py",
    "bad_inputs/test_stop_signals.py",
    "search/test_retrieval_views.py",
    "search/test_campaign_runner.py",
    "load/test_pool_load.py",
    "train/test_distributed.py",
    "search/test_certify.py",
    "bad_inputs/test_runtime.py",
    "bad_inputs/test_crash_consistency.py",
    "train/test_loop.py",
    "search/test_export.py",
    "train/test_gpu_check.py",
    "train/test_gpu_bench.py",
    "search/test_campaign_watch.py",
    "report/test_dashboard.py",
    "e2e/test_plugin_package.py",
    "bad_inputs/test_store.py",
    "search/test_rescore.py",
    "cli/test_cli.py",
    "search/test_tracking.py",
    "search/test_replay.py",
    "load/test_soak.py",
    "search/test_artifacts_found.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of HEAVY_FIRST first, in its order; the others keep theirs."""
    rank = {str(TESTS / name): i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


@functools.cache
def bench_module(name: str):  # noqa: ANN201 — the module
    """``bench/<name>.py`` as a module (bench/ is not a package), imported once."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def require(part_available: bool, why: str) -> None:
    """Skip (laptop) or fail (CI, MLRC_REQUIRE_ALL=1) when a real part the test needs is absent."""
    if part_available:
        return
    if os.environ.get("MLRC_REQUIRE_ALL") == "1":
        pytest.fail(f"required in CI but missing: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def omniglot_zip() -> Path:
    path = Path(os.environ.get("MLRC_OMNIGLOT_ZIP", OMNIGLOT_DEFAULT))
    require(path.is_file(), f"the real Omniglot subset is not at {path} (set MLRC_OMNIGLOT_ZIP)")
    return path


def _throwaway_server():  # noqa: ANN202 — a generator of one server
    from mlrc.store.throwaway import PostgresUnavailable, throwaway_postgres

    try:
        with throwaway_postgres() as server:
            yield server
    except PostgresUnavailable as e:
        require(False, str(e))


@pytest.fixture(scope="session")
def postgres_server():
    """A real throwaway PostgreSQL server on a free local port (as user `postgres` under root)."""
    yield from _throwaway_server()


@pytest.fixture
def own_postgres_server():
    """A server of the test's own, which it may stop (the session's is shared by the tests of
    one process)."""
    yield from _throwaway_server()


@pytest.fixture(scope="session")
def postgres_url(postgres_server) -> str:
    return postgres_server.url


@pytest.fixture
def fresh_database(postgres_server) -> str:
    """A new empty database on the throwaway server (isolates tests that share the server)."""
    return postgres_server.new_database()


@pytest.fixture(scope="session")
def omniglot_ds(omniglot_zip):
    """The real Omniglot subset, loaded once per test session."""
    from mlrc import data

    return data.build("omniglot", root=omniglot_zip)


@pytest.fixture(scope="session")
def glyphs_ds():
    from mlrc import data

    return data.build("glyphs")


def train_tiny_fold(
    ds,
    workdir,
    loss: str = "contrastive",
    *,
    iterations: int = 3,
    val_classes=None,
    loss_lr: float | None = None,
    preset_overrides: dict | None = None,
    **spec,
):
    """Fold 0 of the mlrc split, one epoch of ``iterations`` with the cpu preset; extra FoldSpec
    fields (miner, strategy, sampler, ...) pass through. Losses with parameters get lr 1e-3."""
    from mlrc.config import load_preset
    from mlrc.methods import losses
    from mlrc.protocol import mlrc_split
    from mlrc.train import FoldSpec, train_fold

    fold = mlrc_split(ds.labels, scheme="mlrc").folds[0]
    preset = load_preset(
        "cpu", {"iterations_per_epoch": iterations, "max_epochs": 1, **(preset_overrides or {})}
    )
    if loss_lr is None and losses.info(loss).has_parameters:
        loss_lr = 1e-3
    return train_fold(
        FoldSpec(
            ds,
            ds.name,
            fold.train_classes,
            val_classes or fold.val_classes,
            loss,
            {},
            loss_lr,
            preset,
            0,
            workdir,
            progress=False,
            **spec,
        )
    )


@pytest.fixture(autouse=True)
def _no_cpu_share_leaks():
    """A CLI command run in-process registers the test process as an mlrc worker and sets
    torch's threads (mlrc.train.threads): undone after each test."""
    import torch

    from mlrc.train import threads

    before = torch.get_num_threads()
    yield
    threads.reset()
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _no_child_process_left():
    """A test leaves no non-daemon ``multiprocessing`` child running: the interpreter joins
    those at exit, so one left behind (a rank of a failed launch, a lock holder) would hang the
    whole session after its summary. Killed here, and the test that left it fails, naming it.
    The SIGTERM and SIGINT handlers an in-process launch installed (torch elastic's) are put
    back too."""
    import multiprocessing

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
    # non-daemon ones only: daemons (DataLoader workers) are terminated at exit, not joined
    left = [c for c in multiprocessing.active_children() if not c.daemon]
    for child in left:
        child.join(10)  # one that is just exiting
    left = [c for c in left if c.is_alive()]
    for child in left:
        child.kill()
        child.join(10)
    assert not left, f"the test left child processes running (killed): {left}"


def rank_pids(launcher_pid: int) -> list[int]:
    """The rank processes a fold launched from process ``launcher_pid`` runs now: the children
    of its forkserver (``mlrc.train.launch`` forks the ranks from one), in the order they
    started (rank order). Read from ``/proc``."""
    from pathlib import Path

    stats: dict[int, list[str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            stats[int(stat.parent.name)] = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
    parent = {pid: int(fields[1]) for pid, fields in stats.items()}

    def descendants(pid: int) -> list[int]:
        kids = [c for c, p in parent.items() if p == pid]
        return kids + [d for k in kids for d in descendants(k)]

    def cmdline(pid: int) -> str:
        try:
            return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""

    servers = {p for p in descendants(launcher_pid) if "forkserver" in cmdline(p)}
    ranks = [c for c, p in parent.items() if p in servers]
    return sorted(ranks, key=lambda pid: (int(stats[pid][19]), pid))  # start time, then pid
