#!/usr/bin/env bash
# The wheels a GPU machine without network needs to run bench/gpu_check.sh, in one folder to
# carry there (default bench/gpu_wheels/, git-ignored; at most 40 MB):
#
#   bench/gpu_wheels.sh [--python X.Y]... [--out DIR]
#
# - mlrc's own wheel (installed there with --no-deps, against the machine's own torch);
# - what mlrc's fold path (mlrc.config, mlrc.data, mlrc.train, mlrc.methods) imports besides
#   torch, torchvision, timm, numpy, Pillow, scipy, pandas and pytest (which the machine must
#   have): pydantic and its parts (pydantic-core is compiled: one wheel per --python, manylinux
#   x86-64), PyYAML (compiled too), pytorch-metric-learning, filelock, tqdm, rich and its parts.
#   Nothing of Ray, faiss, MLflow, Plotly, Optuna or the docs.
#
# Each at the version this checkout's virtual environment has (.venv, else python3), fetched with
# `pip download --no-deps` (from pip's cache or the package index). --python: the GPU machine's
# Python (repeat for several; default: this one's). The lent GPU machines run Python 3.12:
# `bench/gpu_wheels.sh --python 3.12`.
set -euo pipefail
cd "$(dirname "$0")/.."

py=.venv/bin/python
[[ -x $py ]] || py=python3
out=bench/gpu_wheels
pythons=()
while (($#)); do
  case $1 in
    --python) pythons+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_wheels: unknown argument $1 (--python X.Y, --out DIR)"; exit 2 ;;
  esac
done
((${#pythons[@]})) || pythons=("$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')")

pure=(pydantic annotated-types typing-inspection typing-extensions pytorch-metric-learning
      filelock tqdm rich markdown-it-py mdurl pygments)
compiled=(pydantic-core pyyaml)
version() {  # the version of distribution $1 in this checkout's environment
  "$py" -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' "$1"
}
pin() { local name; for name in "$@"; do echo "$name==$(version "$name")"; done; }

rm -rf "$out"
mkdir -p "$out"
mapfile -t pure_pins < <(pin "${pure[@]}")
mapfile -t compiled_pins < <(pin "${compiled[@]}")
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$out" "${pure_pins[@]}"
for v in "${pythons[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$out" \
    --python-version "$v" --implementation cp --abi "cp${v/./}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 "${compiled_pins[@]}"
done
had_build=$([[ -e build ]] && echo 1 || true)
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$out" . >/dev/null
[[ -n $had_build ]] || rm -rf build  # setuptools' work folder, if this made it

{
  echo "# bench/gpu_wheels.sh $(date -u +%FT%TZ), for Python ${pythons[*]}; mlrc at $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  (cd "$out" && ls -1 ./*.whl | sed 's|^\./||')
} > "$out/MANIFEST.txt"
bytes=$(du -cb "$out"/*.whl | tail -1 | cut -f1)
echo "$out: $(ls "$out"/*.whl | wc -l) wheels, $((bytes / 1000)) kB (Python ${pythons[*]})"
if ((bytes > 40 * 1000 * 1000)); then
  echo "gpu_wheels: $out holds $((bytes / 1000000)) MB, over the 40 MB limit"
  exit 1
fi
