"""The GPU check's driver (run by ``bench/gpu_check.sh``): its parts in order of value, each in
its own process group under its own time limit, every figure written as soon as it exists.

    bash bench/gpu_check.sh [--out DIR] [--quick] [--rehearse]

Standard library only at the top (the parts import torch and mlrc in their own processes), so
that this process holds no CUDA context and nothing a part does can take it down. Parts:

0. ``env``: GPU name, driver, CUDA, torch, torchvision, Python, free memory, MPS control
   (printed and saved first; where it finds no GPU and this is no rehearsal, the check stops);
1. ``wheels``: installs the carried wheels (``bench/gpu_wheels/``) the machine lacks into a
   private folder put first on the parts' PYTHONPATH (skipped in a rehearsal);
2. ``fold``: one reference fold through ``train_fold`` and its synthetic-input upper bound
   (``bench/gpu_fold.py --part fold``), then ``fold_lowsync``: the same with the loss the sync
   census finds with the fewest host syncs beside contrastive (:data:`LOW_SYNC_LOSS`);
3. ``tests``: ``tests/train/test_gpu.py`` and every CUDA test under ``tests/protocol/``;
4. ``packed``: 2 and 4 folds packed on one GPU; 5. ``mps``: 4 of them under CUDA MPS;
6. ``ranks``: ``bench/ranks.py`` (one fold as K processes) where there are ≥ 2 GPUs.

A part that fails or overruns is recorded with its reason and the next one runs. After each
part its process group is ended (SIGTERM, then SIGKILL), an MPS daemon it started is told to
quit, and any process still carrying this run's tag (``MLRC_GPU_CHECK_RUN`` in its
environment: one that left the group) is killed. The output folder holds at most 7 files:
``env.json``, ``results.jsonl`` (one line per part, appended as it ends), ``junit.xml``,
``gpu_fold.csv`` (``bench/gpu_fold.py``'s rows of every part: copy it to ``bench/results/`` for
``mlrc data bench``), ``table.md``, ``table.json`` and ``log.txt`` (every part's output).
Exit status 0 when every part ran, whatever it found: failures are data.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RUN_TAG = "MLRC_GPU_CHECK_RUN"
#: The registered loss with the fewest host syncs per step beside contrastive (the census:
#: tests/train/test_sync_census.py, docs/guide/performance.md).
LOW_SYNC_LOSS = "normalized_softmax"
#: Each part's time limit in seconds: (full, --quick, --rehearse). Full: 420 s in all, so that
#: a --quick rerun (240 s) fits in the same 15 minutes of a borrowed GPU.
LIMITS: dict[str, tuple[int, int, int]] = {
    "env": (20, 15, 90),
    "wheels": (20, 20, 10),
    "fold": (110, 60, 150),
    "fold_lowsync": (40, 25, 150),
    "tests": (80, 55, 150),
    "packed": (70, 35, 90),
    "mps": (50, 20, 90),
    "ranks": (30, 10, 150),
}  # the rehearsal's: caps generous enough for a loaded 2-core machine (≈ 40 s of CPU in all)
FILES = ("env.json", "results.jsonl", "junit.xml", "gpu_fold.csv", "table.md", "table.json")
LOG = "log.txt"


@dataclass
class Check:
    """One run of the check: where it writes, how big, and what it found so far."""

    out: Path
    tmp: Path
    mode: str  # "full", "quick" or "rehearse"
    python: str
    tag: str
    records: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def limit_index(self) -> int:
        return ("full", "quick", "rehearse").index(self.mode)

    def child_env(self, **extra: str) -> dict[str, str]:
        """The parts' environment: this run's tag, mlrc and the wheels first on the path."""
        path = [str(self.tmp / "site"), str(REPO)]
        if os.environ.get("PYTHONPATH"):
            path.append(os.environ["PYTHONPATH"])
        return {
            **os.environ,
            RUN_TAG: self.tag,
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "140",
            **extra,
        }


# --- running one part ---------------------------------------------------------------------


def run_part(
    check: Check,
    name: str,
    cmd: list[str],
    env: dict[str, str] | None = None,
    after: Any = None,
) -> dict[str, Any]:
    """``cmd`` in a new session (its own process group) with its output appended to the log;
    ended at the part's limit; ``after()`` then (an MPS daemon told to quit), and everything
    it left behind killed. The part's record."""
    limit = LIMITS[name][check.limit_index]
    log = check.out / LOG
    with log.open("a") as f:
        f.write(f"\n=== {name} (limit {limit:.0f} s): {' '.join(cmd)}\n")
        f.flush()
        start_at = f.tell()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env or check.child_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = None
        seconds = time.monotonic() - t0
        end_group(proc)
    if after is not None:
        after()
    left = sweep(check.tag)
    record = {"part": name, "seconds": round(seconds, 1), "limit_s": limit, "rc": rc}
    if rc is None:
        record.update(status="timeout", reason=f"over its {limit:.0f} s limit: ended")
    elif rc == 0:
        record.update(status="ok", reason="")
    else:
        record.update(status="failed", reason=tail_of(log, start_at))
    if left:
        record["killed_after"] = left
    return record


def end_group(proc: subprocess.Popen) -> None:
    """End ``proc``'s process group: SIGTERM, then SIGKILL to whatever is still in it."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and group_alive(pgid):
            proc.poll()  # reaps the leader once it exits
            time.sleep(0.05)
        if not group_alive(pgid):
            break
    if proc.poll() is None:
        proc.wait(timeout=10)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False  # only zombies left: their parent reaps them


def sweep(tag: str) -> int:
    """SIGKILL every process but this one and its ancestors whose environment carries this
    run's tag (one that left its part's process group, as a daemon does), and wait (≤ 3 s)
    until they are gone; how many."""
    mine = {os.getpid(), *ancestors()}
    want = f"{RUN_TAG}={tag}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if want in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    deadline = time.monotonic() + 3.0
    while killed and time.monotonic() < deadline and any(running(pid) for pid in killed):
        time.sleep(0.05)
    return len(killed)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ancestors() -> list[int]:
    """The parent, grandparent, … of this process (pids)."""
    out, pid = [], os.getppid()
    while pid > 1:
        out.append(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def tail_of(log: Path, start: int, lines: int = 1) -> str:
    """The last ``lines`` non-empty lines the part wrote (from byte ``start`` of the log): an
    exception's message, pytest's summary."""
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-400:] or "no output"


def stop_mps(check: Check) -> None:
    """Tell a private MPS daemon of the ``mps`` part to quit (its pipe folder in ``tmp``)."""
    pipe = check.tmp / "mps" / "mps-pipe"
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None or not pipe.exists():
        return
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(check.tmp / "mps" / "mps-log"),
    }
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        subprocess.run([exe], input="quit\n", env=env, text=True, timeout=10, check=False)


# --- the parts ------------------------------------------------------------------------------


def part_wheels(check: Check) -> dict[str, Any]:
    """The carried wheels this Python lacks (or has older), into ``tmp/site``."""
    if check.mode == "rehearse":
        return skipped("wheels", "rehearsal: this Python's own packages")
    wheels = Path(os.environ.get("MLRC_GPU_WHEELS") or BENCH / "gpu_wheels")
    if not (wheels / "MANIFEST.txt").exists():
        why = f"no {wheels}/MANIFEST.txt (bench/gpu_wheels.sh --python X.Y where pip works)"
        return skipped("wheels", why)
    cmd = [check.python, __file__, "--install-wheels", str(wheels), str(check.tmp / "site")]
    return run_part(check, "wheels", cmd)


def part_env(check: Check) -> dict[str, Any]:
    """What the check runs on, into ``env.json`` and printed."""
    path = check.tmp / "env.json"
    rec = run_part(check, "env", [check.python, __file__, "--env-json", str(path)])
    check.env = json.loads(path.read_text()) if path.exists() else {"error": rec["reason"]}
    check.env["mode"] = check.mode
    text = json.dumps(check.env, indent=1)
    (check.out / "env.json").write_text(text + "\n")
    print(text, flush=True)
    return rec


def part_fold(check: Check, name: str, part: str, loss: str = "contrastive") -> dict[str, Any]:
    """``bench/gpu_fold.py --part PART`` on the run's shared images; its rows."""
    rows = check.tmp / f"{name}.json"
    cmd = [check.python, str(BENCH / "gpu_fold.py"), "--part", part, "--loss", loss]
    cmd += ["--work", str(check.tmp / "work"), "--rows", str(rows)]
    cmd += ["--out", str(check.tmp / f"{name}.csv")]
    if check.mode == "rehearse":
        cmd += ["--device", "cpu"]
    elif check.mode == "quick":
        cmd += ["--quick"]
    if part in ("packed", "mps"):
        # 4 under MPS: against 4 without it, within the part's limit
        cmd += ["--workers", "2" if check.mode == "rehearse" else "4" if part == "mps" else "2,4"]
    env = check.child_env(MLRC_MPS_DIR=str(check.tmp / "mps"))
    rec = run_part(check, name, cmd, env, after=lambda: stop_mps(check))
    if rows.exists():
        rec["rows"] = json.loads(rows.read_text())
    return rec


def part_tests(check: Check) -> dict[str, Any]:
    """The GPU tests: tests/train/test_gpu.py (marked ``gpu``) and every test with ``cuda`` in
    its name in the files of tests/protocol that use it; JUnit XML into the output folder."""
    junit = check.out / "junit.xml"
    cmd = [check.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    cmd += ["--continue-on-collection-errors", f"--junitxml={junit}", "-k", "gpu or cuda"]
    cmd += ["tests/train/test_gpu.py", *cuda_test_files()]
    rec = run_part(check, "tests", cmd)
    if junit.exists():
        rec["tests"] = junit_counts(junit)
        if rec["status"] == "failed":
            bad = rec["tests"]["failed"]
            rec["reason"] = f"{len(bad)} failed: {', '.join(bad)[:300]}" if bad else rec["reason"]
    return rec


def cuda_test_files() -> list[str]:
    """The test files of tests/protocol that mention cuda (the others may import what the GPU
    image lacks, e.g. faiss, and their collection error would fail the part)."""
    files = sorted((REPO / "tests" / "protocol").glob("test_*.py"))
    return [str(f.relative_to(REPO)) for f in files if "cuda" in f.read_text()]


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed, failed (failures and errors), skipped, and the failed tests' names."""
    counts = {"passed": 0, "failed": [], "skipped": 0}
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"].append(case.get("name", "?"))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def part_ranks(check: Check) -> dict[str, Any]:
    """``bench/ranks.py``: one fold as K processes, where there are ≥ 2 GPUs (the rehearsal:
    K = 1, 2 with gloo on the CPU)."""
    gpus = len(check.env.get("gpus") or [])
    if check.mode != "rehearse" and gpus < 2:
        return skipped("ranks", f"needs ≥ 2 GPUs, found {gpus}")
    out = check.tmp / "ranks.csv"
    cmd = [check.python, str(BENCH / "ranks.py"), "--out", str(out)]
    if check.mode == "rehearse":
        cmd += ["--device", "cpu", "--procs", "2", "--iterations", "2"]
    else:
        cmd += ["--device", "cuda", "--quick"]
    rec = run_part(check, "ranks", cmd)
    if out.exists():
        with out.open() as f:
            rec["rows"] = list(csv.DictReader(f))
    return rec


def skipped(name: str, why: str) -> dict[str, Any]:
    return {"part": name, "status": "skipped", "reason": why, "seconds": 0.0, "rc": None}


PARTS = (
    ("env", part_env),
    ("wheels", part_wheels),
    ("fold", lambda c: part_fold(c, "fold", "fold")),
    ("fold_lowsync", lambda c: part_fold(c, "fold_lowsync", "fold", LOW_SYNC_LOSS)),
    ("tests", part_tests),
    ("packed", lambda c: part_fold(c, "packed", "packed")),
    ("mps", lambda c: part_fold(c, "mps", "mps")),
    ("ranks", part_ranks),
)


def run_all(check: Check) -> None:
    """Every part in order; each record written and the table rewritten as soon as it ends.
    A fault of this driver in one part is recorded as that part's failure."""
    for name, run in PARTS:
        if check.env and not check.env.get("gpus") and check.mode != "rehearse":
            return  # env has run and found no GPU: nothing else to run here
        try:
            rec = run(check)
        except Exception as e:  # noqa: BLE001 - one part's trouble must not stop the rest
            rec = {"part": name, "status": "failed", "reason": f"gpu_check: {e!r}", "rc": None}
        check.records.append(rec)
        with (check.out / "results.jsonl").open("a") as f:
            f.write(json.dumps(rec) + "\n")
        mark = {"ok": "ok", "skipped": "skipped"}.get(rec["status"], rec["status"].upper())
        took = f" in {rec.get('seconds', 0):.0f} s" if rec.get("seconds") else ""
        why = f": {rec['reason']}" if rec.get("reason") else ""
        print(f"gpu_check: {name} {mark}{took}{why}", flush=True)
        write_tables(check)


# --- what it writes -------------------------------------------------------------------------


def write_tables(check: Check) -> None:
    """``table.md``, ``table.json`` and ``gpu_fold.csv`` from the records so far."""
    sys.path.insert(0, str(BENCH))
    import gpu_table

    table = gpu_table.build(check.records, check.env, LOW_SYNC_LOSS)
    (check.out / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    (check.out / "table.md").write_text(gpu_table.markdown(table))
    rows = [
        row
        for rec in check.records
        if rec["part"] in ("fold", "fold_lowsync", "packed", "mps")
        for row in rec.get("rows") or []
    ]
    if rows:
        columns = list(dict.fromkeys(k for row in rows for k in row))
        with (check.out / "gpu_fold.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, columns)
            w.writeheader()
            w.writerows(rows)


def environment() -> dict[str, Any]:
    """The machine: Python, torch, torchvision, CUDA, cuDNN, driver, each GPU's name and free
    memory, whether MPS control exists, CPUs; the checkout's commit where git can tell."""
    import platform

    import torch

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpus": os.cpu_count(),
        "mps_control": shutil.which("nvidia-cuda-mps-control") is not None,
        "driver": command_out(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        ),
        "commit": command_out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "gpus": [],
    }
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError as e:
        env["torchvision"] = f"missing: {e}"
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        free, total = torch.cuda.mem_get_info(i)
        env["gpus"].append(
            {
                "name": torch.cuda.get_device_name(i),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                "free_gib": round(free / 2**30, 1),
                "total_gib": round(total / 2**30, 1),
            }
        )
    return env


def command_out(cmd: list[str]) -> str | None:
    """The first line ``cmd`` prints, or None where it is missing or fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def install_wheels(wheels: Path, site: Path) -> int:
    """Install into ``site`` (--no-deps, --no-index) the wheels of ``wheels`` that this Python
    lacks or has at an older version and whose tags it accepts; print what and why not."""
    import importlib.metadata as md

    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import parse_wheel_filename
    from pip._vendor.packaging.version import Version

    here, need = set(sys_tags()), []
    for wheel in sorted(wheels.glob("*.whl")):
        name, version, _build, tags = parse_wheel_filename(wheel.name)
        if not here & set(tags):
            print(f"not for this Python: {wheel.name}")
            continue
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have is not None and Version(have) >= version:
            print(f"has {name} {have} (carried {version})")
            continue
        need.append(str(wheel))
    site.mkdir(parents=True, exist_ok=True)
    if not need:
        return 0
    print("installing: " + " ".join(Path(w).name for w in need), flush=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    pip += ["--no-compile", "--no-cache-dir", "--target", str(site), *need]
    return subprocess.run(pip, check=False).returncode


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output folder (default $OUT, else bench/results/gpu)")
    ap.add_argument("--quick", action="store_true", help="shorter parts: 240 s in all")
    ap.add_argument("--rehearse", action="store_true", help="every part on the CPU, tiny sizes")
    ap.add_argument("--env-json", type=Path, help=argparse.SUPPRESS)  # internal: part env
    ap.add_argument("--install-wheels", nargs=2, type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.env_json:
        args.env_json.write_text(json.dumps(environment()))
        return 0
    if args.install_wheels:
        return install_wheels(*args.install_wheels)
    default = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "bench/results/gpu"
    out = (args.out or default).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in (*FILES, LOG):
        (out / name).unlink(missing_ok=True)
    mode = "rehearse" if args.rehearse else "quick" if args.quick else "full"
    budget = sum(limits[("full", "quick", "rehearse").index(mode)] for limits in LIMITS.values())
    tmp = Path(tempfile.mkdtemp(prefix="mlrc-gpu-check-"))
    tag = os.environ.get(RUN_TAG) or uuid.uuid4().hex[:12]
    check = Check(out, tmp, mode, sys.executable, tag)
    print(f"gpu_check: {mode}, parts' limits {budget} s in all, into {out} (run {tag})")
    t0 = time.monotonic()
    try:
        run_all(check)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not check.env.get("gpus") and mode != "rehearse":
        print("gpu_check: torch sees no CUDA device here (--rehearse: the CPU rehearsal)")
        return 2
    print()
    print((out / "table.md").read_text(), end="")
    files = sorted(p.name for p in out.iterdir())
    print(f"gpu_check: {time.monotonic() - t0:.0f} s; {out}: {len(files)} files: {' '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
