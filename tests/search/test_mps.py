"""``--mps`` (issue #22, point 4): CUDA MPS for workers packed on one GPU.

On this machine ``nvidia-cuda-mps-control`` is really absent: ``mlrc worker --mps`` says so in
one line (exit 2) before anything starts, and a Slurm job script's MPS lines, run by bash here,
stop the job with exit 2 and one line. The job script is the text submitit writes from
:func:`mlrc.search.backends.slurm.job_parameters`; its MPS daemon's start and stop on a GPU node are for the GPU
tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlrc.search.backends.mps import CONTROL


def mlrc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlrc.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def one_line(out: subprocess.CompletedProcess, *words: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    line = out.stderr.strip()
    assert line.count("\n") == 0 and all(w in line for w in words), line
    return line


@pytest.mark.skipif(shutil.which(CONTROL) is not None, reason=f"{CONTROL} is installed here")
def test_worker_mps_without_the_control_program_is_one_line_before_anything(tmp_path):
    study = tmp_path / "never-read.yaml"  # nothing is read before the refusal
    out = mlrc("worker", str(study), "--device", "cuda:0", "--per-gpu", "2", "--mps")
    one_line(out, CONTROL, "not found on PATH", "--mps")
    assert "started" not in out.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--device", "cuda:0", "--per-gpu", "1"], ("--per-gpu N",)),
        (["--device", "cpu", "--per-gpu", "2"], ("--device cuda", "not cpu")),
    ],
)
def test_worker_mps_needs_packed_cuda_workers(tmp_path, args, words):
    one_line(mlrc("worker", str(tmp_path / "s.yaml"), *args, "--mps"), "--mps", *words)


def test_slurm_mps_needs_gpus_in_one_line(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(
        "name: s\ndataset: {name: glyphs}\npreset: cpu\nloss: {name: contrastive}\n"
        "search: {trials: 1}\n"
    )
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "1", "--time", "1:00:00", "--mps"),
        *("--storage", "postgresql+psycopg://u@localhost/db", "--artifacts", str(tmp_path / "a")),
    )
    one_line(out, "--mps", "--gpus-per-worker")


def job_script(tmp_path: Path, mps: bool) -> str:
    """The sbatch script submitit writes for these parameters (the command: a stand-in)."""
    import submitit

    from mlrc.search.backends.slurm import job_parameters

    executor = submitit.SlurmExecutor(folder=tmp_path / "%j")
    executor.update_parameters(**job_parameters("s", 10, 2, gpus_per_worker=2, per_gpu=4, mps=mps))
    return executor._make_submission_file_text("echo the-workers", "uid")


def test_the_job_script_starts_mps_before_the_workers_and_stops_it_after(tmp_path):
    lines = job_script(tmp_path, mps=True).splitlines()
    srun = next(i for i, ln in enumerate(lines) if ln.startswith("srun ") and "the-workers" in ln)
    start = lines.index(f"{CONTROL} -d")
    stop = lines.index(f"echo quit | {CONTROL}")
    assert start < srun < stop
    exports = [ln for ln in lines[:srun] if ln.startswith("export CUDA_MPS_")]
    assert exports == [
        'export CUDA_MPS_PIPE_DIRECTORY="${TMPDIR:-/tmp}/mlrc-mps-$SLURM_JOB_ID"/pipe',
        'export CUDA_MPS_LOG_DIRECTORY="${TMPDIR:-/tmp}/mlrc-mps-$SLURM_JOB_ID"/log',
    ]
    assert "#SBATCH --gres=gpu:2" in lines and "#SBATCH --cpus-per-task=8" in lines
    plain = job_script(tmp_path, mps=False)
    assert CONTROL not in plain and "CUDA_MPS" not in plain


def test_the_job_script_is_valid_bash_and_stops_on_a_node_without_mps(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(job_script(tmp_path, mps=True))
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    if shutil.which(CONTROL) is not None:
        pytest.skip(f"{CONTROL} is installed here")
    setup = script.read_text().split("# setup\n", 1)[1].split("\n\n", 1)[0]
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        ["bash", "-c", setup + "\necho workers-ran"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == 2 and "workers-ran" not in out.stdout
    assert out.stderr.strip() == f"mlrc: --mps: {CONTROL} not found on {_hostname()}"


def _hostname() -> str:
    return subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
