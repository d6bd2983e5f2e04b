#!/usr/bin/env bash
# The wheels a GPU machine without network needs for bench/gpu_check.sh, into one folder to
# carry there (default bench/gpu_wheels/, git-ignored; under 20 MB). Works in a fresh clone:
# the versions come from bench/gpu_wheels.lock (exact, transitive), not from an environment.
#
#   bash bench/gpu_wheels.sh --python 3.12 [--out DIR]
#   bash bench/gpu_wheels.sh --lock      # rewrite the lock (needs a Python with mlrc installed)
#
# Any Python 3 with pip runs it ($PYTHON, else .venv/bin/python, else python3); it needs the
# package index (or pip's cache). What the GPU image already has compatibly is left out
# (bench/gpu_image.txt; bench/gpu_wheels.py says how). It prints the line that installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-}
if [[ -z $py ]]; then
  if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
exec "$py" bench/gpu_wheels.py "$@"
