#!/usr/bin/env bash
# The whole GPU check as one command, on a machine with a GPU and no network (≤ 8 minutes;
# --quick ≤ 3). Run it from a checkout that holds bench/gpu_wheels/ (made where pip works by
# `bench/gpu_wheels.sh --python X.Y`, X.Y the GPU machine's Python, and carried there):
#
#   bash bench/gpu_check.sh [--quick]
#
# The machine's Python must have PyTorch and torchvision (any recent release: its own, not
# mlrc's pins), numpy, Pillow, scipy, pandas and pytest. Then:
# 1. the wheels of bench/gpu_wheels/ that this Python lacks, or has at an older version, are
#    installed with --no-deps --no-index into a private folder ($MLRC_GPU_SITE, default
#    /tmp/mlrc-gpu-site) put first on PYTHONPATH, and mlrc itself from this checkout (--no-deps:
#    the machine's own torch is used; nothing of the machine's environment changes);
# 2. python bench/gpu_fold.py [--quick]: the tables, bench/results/gpu_fold.csv;
# 3. pytest tests/train/test_gpu.py (sync debug mode, CUDA determinism, device binding), and
#    python bench/ranks.py --quick: one fold as 1, 2, 4 processes (with ≥ 2 GPUs; ≤ 5 minutes);
# 4. the measurements once more, compactly, at the end of the output.
# Exit status: non-zero when the install, the benchmark or a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
wheels=${MLRC_GPU_WHEELS:-bench/gpu_wheels}
site=${MLRC_GPU_SITE:-/tmp/mlrc-gpu-site}
fold_args=()
fold_limit=420  # s: the full run takes ≤ 6 minutes, the GPU-only tests ≤ 2
if [[ ${1:-} == --quick ]]; then fold_args=(--quick); fold_limit=150; fi
export PYTHONUNBUFFERED=1

if ! "$py" -c 'import torch, torchvision, numpy, PIL, scipy, pandas, pytest' 2>/dev/null; then
  echo "gpu_check: $py lacks one of torch, torchvision, numpy, Pillow, scipy, pandas, pytest"
  exit 2
fi
if ! "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "gpu_check: torch sees no CUDA device here (bench/gpu_fold.py --device cpu: the smoke run)"
  exit 2
fi
if [[ ! -f $wheels/MANIFEST.txt ]]; then
  echo "gpu_check: no $wheels/ (run bench/gpu_wheels.sh --python X.Y where pip works; carry it)"
  exit 2
fi

# 1. the wheels this Python needs: not installed, or older than the carried one; mlrc apart
mapfile -t need < <("$py" - "$wheels" <<'EOF'
import importlib.metadata as md
import sys
from pathlib import Path

from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import parse_wheel_filename
from pip._vendor.packaging.version import Version

here = set(sys_tags())
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version, _build, tags = parse_wheel_filename(wheel.name)
    if name == "mlrc" or not here & set(tags):
        continue  # mlrc: from the checkout below; a wheel for another Python or platform
    try:
        if Version(md.version(name)) >= version:
            continue  # the machine's own is as new
    except md.PackageNotFoundError:
        pass
    print(wheel)
EOF
)
rm -rf "$site"
mkdir -p "$site"
pip_install=("$py" -m pip install -q --no-deps --no-index --no-compile --no-cache-dir --target "$site")
if ((${#need[@]})); then
  echo "installing into $site: ${need[*]##*/}"
  "${pip_install[@]}" "${need[@]}" || { echo "gpu_check: installing the wheels failed"; exit 2; }
fi
had_build=$([[ -e build ]] && echo 1 || true)
if ! "${pip_install[@]}" --no-build-isolation . >/dev/null 2>&1; then
  echo "gpu_check: mlrc from this checkout did not install (setuptools ≥ 69 missing?): the carried wheel"
  "${pip_install[@]}" "$wheels"/mlrc-*.whl || { echo "gpu_check: installing mlrc failed"; exit 2; }
fi
[[ -n $had_build ]] || rm -rf build  # setuptools' work folder, if this made it
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'import mlrc.train, mlrc.data, mlrc.config' || { echo "gpu_check: mlrc does not import"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null

# 2. the benchmark, 3. the GPU-only tests
status=0
timeout "$fold_limit" "$py" bench/gpu_fold.py "${fold_args[@]}" || { echo "gpu_check: gpu_fold.py failed ($?)"; status=1; }
timeout 150 "$py" -m pytest -q -p no:cacheprovider -rs tests/train/test_gpu.py || status=1
# one fold as K = 1, 2, 4 processes (NCCL, one GPU each): only where there are 2 GPUs or more
timeout 300 "$py" bench/ranks.py --device cuda --quick || { echo "gpu_check: ranks.py failed"; status=1; }

# 4. the figures again, at the end of the output
"$py" - <<'EOF'
import csv
from pathlib import Path

path = Path("bench/results/gpu_fold.csv")
if path.exists():
    rows = list(csv.DictReader(path.open()))
    print(f"{path} ({rows[0]['machine'] if rows else ''}):")
    for r in rows:
        who = f"{r.get('workers') or ''} {'MPS' if r.get('mps') == 'True' else ''}".strip()
        print(
            f"  {r['section']:<11} {who:<6} {r['measure']:<26} {r['value'] or 'n/a':>10} "
            f"{r['unit']:<5} {r['goal']:<11} {r['met']:<3} {r.get('note') or ''}"
        )
EOF
exit $status
