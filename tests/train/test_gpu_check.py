"""``bench/gpu_check.sh``: the GPU check rehearsed end to end on the CPU (issue #39). Every part
runs, a part made to fail (``MLRC_REHEARSE_FAIL=packed``) is recorded while the later parts
still run, the output folder keeps at most 8 files, the table is printed last, and nothing the
check started is left running; a part over its limit is ended with its whole process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402 - bench/ is not a package

ORDER = ["env", "wheels", "fold", "fold_lowsync", "tests", "packed", "mps", "ranks"]


def tagged(tag: str) -> list[int]:
    """Pids of live processes whose environment carries ``MLRC_GPU_CHECK_RUN=tag``."""
    want = f"{gpu_check.RUN_TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if want in env and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One rehearsal with the packed part failing on purpose: its output, folder and tag."""
    out = tmp_path_factory.mktemp("gpu-check")
    tag = f"test-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "MLRC_REHEARSE_FAIL": "packed",
        gpu_check.RUN_TAG: tag,
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), "--rehearse", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return {"proc": proc, "out": out, "tag": tag, "wall_s": time.monotonic() - t0}


def records(out: Path) -> dict[str, dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert [r["part"] for r in recs] == ORDER  # every part, once, in order of value
    return {r["part"]: r for r in recs}


def test_the_rehearsal_runs_every_part_and_keeps_at_most_8_files(rehearsal: dict) -> None:
    proc, out = rehearsal["proc"], rehearsal["out"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([*gpu_check.FILES, gpu_check.LOG]) and len(files) <= 8
    assert all((out / f).is_file() for f in files)  # nothing deeper than the folder itself
    env = json.loads((out / "env.json").read_text())
    assert env["mode"] == "rehearse" and env["gpus"] == []
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    recs = records(out)
    assert recs["wheels"]["status"] == "skipped"
    for part in ("env", "fold", "fold_lowsync", "tests", "mps", "ranks"):
        assert recs[part]["status"] == "ok", recs[part]
    assert recs["tests"]["tests"]["skipped"] > 0 and not recs["tests"]["tests"]["failed"]
    # the GPU tests: test_gpu.py and the CUDA tests of tests/protocol, all skipped on the CPU
    cases = ET.parse(out / "junit.xml").getroot().iter("testcase")
    where = {(c.get("classname"), c.get("name").split("[")[0]) for c in cases}
    files = {cls for cls, _ in where}
    assert {"tests.train.test_gpu", "tests.protocol.test_metrics"} <= files
    assert "tests.protocol.test_scoring" in files
    assert all("cuda" in name for cls, name in where if cls.startswith("tests.protocol"))


def test_the_failed_part_is_recorded_and_the_later_parts_still_ran(rehearsal: dict) -> None:
    recs = records(rehearsal["out"])
    packed = recs["packed"]
    assert packed["status"] == "failed" and packed["rc"] != 0
    assert "fails on purpose" in packed["reason"]
    # its two hung workers were in its process group; the third process had left the group
    # (as an MPS daemon does) and was found by the run's tag
    assert packed["killed_after"] == 1
    assert recs["mps"]["status"] == "ok" and recs["ranks"]["status"] == "ok"
    assert recs["ranks"]["rows"] and float(recs["ranks"]["rows"][0]["img_per_s"]) > 0


def test_nothing_the_rehearsal_started_is_left_running(rehearsal: dict) -> None:
    assert rehearsal["proc"].returncode == 0
    assert tagged(rehearsal["tag"]) == []


def test_the_table_is_printed_last_and_holds_the_measured_figures(rehearsal: dict) -> None:
    out, stdout = rehearsal["out"], rehearsal["proc"].stdout
    table_md = (out / "table.md").read_text()
    assert table_md in stdout and stdout.index(table_md) > stdout.index("gpu_check: ranks")
    assert table_md.startswith("| measure | CPU rehearsal (no GPU), ")
    table = json.loads((out / "table.json").read_text())
    fold_rows = {r["measure"]: r["value"] for r in records(out)["fold"]["rows"]}
    first = table["rows"][0]
    assert first["value"] == fold_rows["train_fold img/s"] > 0
    assert f"| {first['measure']} | {gpu_table_fmt(first['value'])} img/s |" in table_md
    packed = [r for r in table["rows"] if r["measure"].startswith("2 folds packed on one GPU:")]
    assert packed and packed[0]["value"] is None  # the failed part's figure: n/a, not made up
    assert "packed failed" in table_md.splitlines()[-1]
    # the CSV that mlrc data bench reads: every measured row of the gpu_fold parts
    csv_text = (out / "gpu_fold.csv").read_text()
    assert csv_text.startswith("section,measure,value") and "fold (" in csv_text


def gpu_table_fmt(value: float) -> str:
    import gpu_table

    return gpu_table.fmt(value, "img/s").removesuffix(" img/s")


def test_a_part_over_its_limit_is_ended_with_its_group_and_its_escaped_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that hangs with a child in its group and one that left it (setsid) is ended at
    its limit: status timeout, nothing of it alive afterwards."""
    monkeypatch.setitem(gpu_check.LIMITS, "sleepy", (2, 2, 2))
    tag = f"test-{uuid.uuid4().hex[:10]}"
    check = gpu_check.Check(tmp_path, tmp_path, "rehearse", sys.executable, tag)
    script = "sleep 120 & setsid sleep 120 & sleep 120; wait"
    t0 = time.monotonic()
    rec = gpu_check.run_part(check, "sleepy", ["bash", "-c", script])
    assert rec["status"] == "timeout" and rec["rc"] is None and rec["limit_s"] == 2
    assert 2 <= time.monotonic() - t0 < 15
    assert rec["killed_after"] == 1  # the setsid one; the others went with the group
    assert tagged(tag) == []
    assert "=== sleepy (limit 2 s)" in (tmp_path / gpu_check.LOG).read_text()


def test_the_full_check_s_limits_fit_420_s_and_quick_240_s() -> None:
    full, quick, _ = (sum(v[i] for v in gpu_check.LIMITS.values()) for i in range(3))
    assert full <= 420 and quick <= 240


def test_the_wheel_lock_pins_what_is_installed_and_leaves_torch_to_the_machine() -> None:
    """bench/gpu_wheels.lock: exact versions, equal to this environment's (else rerun
    ``bash bench/gpu_wheels.sh --lock``); the machine's torch family is never carried, an
    image package at another release is, one the image has at an unknown version is not."""
    import importlib.metadata as md

    import gpu_wheels

    pins = gpu_wheels.read_pins(gpu_wheels.LOCK)
    assert {"pydantic", "pydantic-core", "pytorch-metric-learning", "torch"} <= set(pins)
    for name, version in pins.items():
        assert version, f"{name}: no exact version in the lock"
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            continue
        assert installed == version, f"{name} {installed} here, {version} in the lock"
    image = {"torchvision": "0.26.0", "numpy": "1.26.4", "rich": None, "scipy": "1.17.0"}
    keep, left = gpu_wheels.to_carry(
        {"torchvision": "0.29.1", "numpy": "2.4.6", "rich": "15.0.0", "scipy": "1.17.1",
         "pydantic": "2.14.3", "nvidia-nccl-cu13": "2.28"},
        image,
    )  # fmt: skip
    assert keep == {"numpy": "2.4.6", "pydantic": "2.14.3"}
    assert sorted(x.split(" ")[0] for x in left) == [
        "nvidia-nccl-cu13",
        "rich",
        "scipy",
        "torchvision",
    ]
