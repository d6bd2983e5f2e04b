#!/usr/bin/env bash
# The whole GPU check as one command, on a borrowed GPU machine without network (420 s of
# parts' limits in all; --quick: 240 s), or rehearsed end to end on the CPU (--rehearse):
#
#   bash bench/gpu_check.sh [--out DIR] [--quick] [--rehearse]
#
# Output folder: --out, else $OUT, else bench/results/gpu/. At most 7 files there: env.json,
# results.jsonl (one line per part as it ends), junit.xml, gpu_fold.csv, table.md, table.json,
# log.txt. Parts, in order of value, each in its own process group under its own limit:
# env, wheels, fold (+ its synthetic-input upper bound), fold_lowsync, tests, packed, mps,
# ranks (bench/gpu_check.py says what each does). A part that fails or overruns is recorded
# and the next runs. The last thing printed is the table for docs/guide/performance.md.
#
# On the GPU machine: carry bench/gpu_wheels/ (made where pip works by
# `bash bench/gpu_wheels.sh --python 3.12`); the machine's Python needs torch, torchvision,
# numpy, Pillow, scipy, pandas, rich and pytest (its own versions). The rehearsal needs none of
# that beyond this checkout's environment, and no GPU.
# Exit status: 0 when every part ran (whatever it found), 2 on bad arguments or no Python.
set -uo pipefail
cd "$(dirname "$0")/.."

args=()
while (($#)); do
  case $1 in
    --out) [[ $# -ge 2 ]] || { echo "gpu_check: --out needs a folder"; exit 2; }
           args+=(--out "$2"); shift 2 ;;
    --quick|--rehearse) args+=("$1"); shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (--out DIR, --quick, --rehearse)"; exit 2 ;;
  esac
done

py=${PYTHON:-}
if [[ -z $py ]]; then
  if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
command -v "$py" >/dev/null || { echo "gpu_check: no Python at $py (set PYTHON)"; exit 2; }
export PYTHONUNBUFFERED=1
exec "$py" bench/gpu_check.py "${args[@]}"
