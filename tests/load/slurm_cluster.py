"""A real single-node Slurm cluster in a temporary folder, for the tests (run as root).

``munged`` (its own key, socket and pid file), ``slurmctld`` and ``slurmd`` from the
distribution's packages (Debian: ``slurmctld slurmd munge slurm-client``), on free local ports,
with a minimal ``slurm.conf``: one node (this host, its CPUs declared as ``CPUS`` so that three
one-CPU jobs run at once on 2 cores), one default partition ``debug``, no accounting (``sacct``
has nothing to say; ``squeue`` shows the running jobs). The clients find it through
``SLURM_CONF`` (set in this process, inherited by ``sbatch`` and its jobs).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
CPUS = 6


class SlurmUnavailable(RuntimeError):
    """A part of the single-node cluster is missing or did not start."""


@dataclass
class Cluster:
    conf: Path
    root: Path
    node: str
    partition: str = "debug"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True) -> str:
        out = subprocess.run(
            list(cmd), env=self.env(), capture_output=True, text=True, timeout=30, check=False
        )
        if check and out.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted((self.root / "log").glob("*.log"))
        )


def missing() -> str | None:
    """Why a cluster cannot be started here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"Slurm is not installed (no {', '.join(absent)}: apt-get install slurmctld slurmd munge slurm-client)"
    if os.geteuid() != 0:
        return "the single-node Slurm cluster of the tests runs as root"
    return None


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(root: Path, node: str, socket_path: Path) -> str:
    port_ctld, port_d = _free_port(), _free_port()
    return f"""\
ClusterName=mlrctest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={port_ctld}
SlurmdPort={port_d}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=30
MinJobAge=600
SchedulerType=sched/backfill
SlurmctldTimeout=30
SlurmdTimeout=30
PlugStackConfig={root}/plugstack.conf
NodeName={node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def single_node_slurm(root: Path) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd under ``root``; wait for the node to be idle; stop
    them all (and any job still running) at the end."""
    why = missing()
    if why:
        raise SlurmUnavailable(why)
    node = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "run", "log", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key, sock = root / "munge" / "munge.key", root / "munge" / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "plugstack.conf").write_text("")
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, node, sock))
    cluster = Cluster(conf=conf, root=root, node=node)
    env = cluster.env()
    procs: list[subprocess.Popen] = []
    try:
        munged = [
            "munged",
            "--foreground",
            "--force",  # root-owned key and folders under a temporary folder
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={root / 'munge' / 'munged.pid'}",
            f"--log-file={root / 'log' / 'munged.log'}",
            f"--seed-file={root / 'munge' / 'munged.seed'}",
        ]
        procs.append(
            subprocess.Popen(munged, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        )
        _wait(lambda: sock.exists(), 10, "munged did not create its socket", cluster)
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", node]):
            log = (root / "log" / f"{daemon[0]}.out").open("w")
            procs.append(
                subprocess.Popen(
                    [*daemon, "-f", str(conf)], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
        _wait(lambda: _idle(cluster), 60, "the node did not become idle", cluster, procs)
        yield cluster
    finally:
        if procs and shutil.which("scancel"):
            subprocess.run(
                ["scancel", "--full", "--user=root"],
                env=env,
                capture_output=True,
                check=False,
                timeout=30,
            )
            time.sleep(1)
        for proc in reversed(procs):
            _stop(proc)


def _idle(cluster: Cluster) -> bool:
    try:
        out = cluster.run("sinfo", "-h", "-N", "-o", "%T")
    except (SlurmUnavailable, subprocess.TimeoutExpired):
        return False
    return out.strip().startswith("idle")


def _wait(ready, timeout: float, why: str, cluster: Cluster, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        dead = [p.args[0] for p in procs if p.poll() is not None]
        if dead:
            raise SlurmUnavailable(f"{', '.join(dead)} exited at start:\n{_out(cluster)}")
        time.sleep(0.5)
    raise SlurmUnavailable(f"{why} within {timeout:.0f} s:\n{_out(cluster)}")


def _out(cluster: Cluster) -> str:
    outs = sorted(cluster.root.glob("log/*"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in outs)
