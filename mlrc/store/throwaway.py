"""A throwaway local PostgreSQL server: initdb in a temporary directory, loopback only, trust
authentication (but for roles made by :meth:`PostgresServer.password_role`), removed on exit.
For the tests, the benchmarks and trying a worker pool on one machine; never for real studies
(no password, no persistence)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here (or no user to run them as)."""


def _bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


class PostgresServer:
    """``url`` (user ``mlrc``, database ``postgres``), ``restart()`` and ``stop()``."""

    def __init__(self, bindir: Path, base: Path, port: int, as_user: list[str]) -> None:
        self.bindir, self.base, self.port, self.as_user = bindir, base, port, as_user
        self.datadir = base / "data"
        self.url = f"postgresql+psycopg://mlrc@127.0.0.1:{port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args], check=True, capture_output=True
        )

    def init(self) -> None:
        self._run("initdb", "-D", str(self.datadir), "-U", "mlrc", "--auth=trust", "-E", "UTF8")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.base / "log"),
            "-w",
            "-o",
            opts,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        """Stop (every connection dropped), stay down ``down_s`` seconds, start again."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def _admin(self, *statements: str) -> None:
        """Run ``statements`` (SQL as written: no bind parameters) as the superuser, outside a
        transaction."""
        from sqlalchemy import create_engine

        engine = create_engine(self.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as c:
            for statement in statements:
                c.exec_driver_sql(statement)
        engine.dispose()

    def new_database(self, owner: str = "mlrc") -> str:
        """URL (as user ``mlrc``) of a new empty database on this server, owned by ``owner``."""
        import uuid

        name = f"t_{uuid.uuid4().hex[:12]}"
        self._admin(f"CREATE DATABASE {name} OWNER {owner}")
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def password_role(self, role: str, password: str) -> str:
        """A login role whose TCP connections must give ``password`` (SCRAM; the other roles keep
        trust authentication) and a new database it owns: its URL, without the password."""
        hba = self.datadir / "pg_hba.conf"
        line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
        text = hba.read_text()
        if line not in text:  # the first matching line wins: before the trust lines
            stat = hba.stat()
            hba.write_text(line + text)
            os.chown(hba, stat.st_uid, stat.st_gid)
        quoted = password.replace("'", "''")
        self._admin(
            f"DO $$ BEGIN CREATE ROLE {role}; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            f"ALTER ROLE {role} LOGIN PASSWORD '{quoted}'",
            "SELECT pg_reload_conf()",
        )
        self._wait_for_password_auth(role)
        url = self.new_database(owner=role)
        return url.replace("//mlrc@", f"//{role}@", 1)

    def _wait_for_password_auth(self, role: str, timeout_s: float = 10.0) -> None:
        """Until the server (which reloads its configuration asynchronously) refuses ``role``
        without its password."""
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conninfo = f"host=127.0.0.1 port={self.port} user={role} dbname=postgres"
                psycopg.connect(conninfo, password="not-the-password", connect_timeout=2).close()
            except psycopg.OperationalError as e:
                if "password authentication failed" in str(e):
                    return
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server still trusts role {role} after {timeout_s} s")
            time.sleep(0.05)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[PostgresServer]:
    """Start a server on a free port; stop it and delete its files on exit."""
    bindir = _bindir()
    if bindir is None:
        raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    base = Path(tempfile.mkdtemp(prefix="mlrc-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailable(
                "running as root and there is no 'postgres' user to run the server"
            ) from None
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = PostgresServer(bindir, base, port, as_user)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":  # python -m mlrc.store.throwaway: a server to try the pool on
    import signal

    with throwaway_postgres() as pg:
        print(pg.new_database(), flush=True)
        print("throwaway PostgreSQL running; Ctrl-C stops it and deletes its data", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
