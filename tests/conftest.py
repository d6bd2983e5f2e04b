"""Shared fixtures. Parts absent on a laptop skip with a reason; in CI they must exist."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OMNIGLOT_DEFAULT = REPO.parent / "shared" / "datasets" / "omniglot" / "images_background_small1.zip"


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


def _pg_bin() -> Path | None:
    import glob
    import shutil

    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


class PostgresServer:
    """A real throwaway PostgreSQL server: ``url`` (no password: trust auth on loopback),
    ``restart()`` (fast shutdown, all connections dropped, then start again)."""

    def __init__(self, bindir: Path, base: Path, port: int, as_user: list[str]) -> None:
        self.bindir, self.base, self.port, self.as_user = bindir, base, port, as_user
        self.datadir = base / "data"
        self.url = f"postgresql+psycopg://mlrc@127.0.0.1:{port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        import subprocess

        subprocess.run(
            [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
        self.pg_ctl("-l", str(self.base / "log"), "-w", "-o", opts, "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        import time

        self.stop()
        time.sleep(down_s)
        self.start()


@pytest.fixture(scope="session")
def postgres_server() -> PostgresServer:
    """A real throwaway PostgreSQL server on a free local port (as user `postgres` under root)."""
    import shutil
    import socket
    import subprocess
    import tempfile

    bindir = _pg_bin()
    require(bindir is not None, "PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    base = Path(tempfile.mkdtemp(prefix="mlrc-pg-"))  # not under pytest's 0700 root dir
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            require(False, "running as root and there is no 'postgres' user to run the server")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = PostgresServer(bindir, base, port, as_user)
    subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(server.datadir), "-U", "mlrc"]
        + ["--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    server.start()
    yield server
    with contextlib.suppress(Exception):
        server.stop("immediate")
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server) -> str:
    return postgres_server.url


@pytest.fixture
def fresh_database(postgres_server) -> str:
    """A new empty database on the throwaway server (isolates tests that share the server)."""
    import uuid

    from sqlalchemy import create_engine, text

    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(postgres_server.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return postgres_server.url.rsplit("/", 1)[0] + f"/{name}"


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
    **spec,
):
    """Fold 0 of the mlrc split, one epoch of ``iterations`` with the cpu preset; extra FoldSpec
    fields (miner, strategy, sampler, ...) pass through. Losses with parameters get lr 1e-3."""
    from mlrc.config import load_preset
    from mlrc.methods import losses
    from mlrc.protocol import mlrc_split
    from mlrc.train.fold import FoldSpec, train_fold

    fold = mlrc_split(ds.labels, scheme="mlrc").folds[0]
    preset = load_preset("cpu", {"iterations_per_epoch": iterations, "max_epochs": 1})
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
