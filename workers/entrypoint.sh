#!/usr/bin/env bash
# mlrc-one-gpu CMD [ARG...]: take one GPU of this host that no other worker holds, then exec CMD
# with CUDA_VISIBLE_DEVICES set to it and MLRC_DEVICE=cuda (so `mlrc worker` trains on it).
#
# Why: Docker hands every replica of a service reserving `count: 1` GPU the same first GPU, so
# the compose `worker` service reserves all of them and each replica locks one here. The lock is
# flock(1) on $MLRC_GPU_LOCKS/<gpu>.lock, a directory shared by the workers of one host (the
# `gpu-locks` volume); it is held by CMD's open file descriptor and released by the kernel when
# the worker exits or dies, so a restarted worker takes whatever GPU is free then. A replica that
# finds every GPU taken says so and exits 0 (more replicas than GPUs: nothing to do).
#
# GPUs are named by UUID (nvidia-smi) or, without nvidia-smi, by their /dev/nvidiaN device.
set -euo pipefail

if [[ $# -eq 0 ]]; then
    echo "usage: mlrc-one-gpu CMD [ARG...]" >&2
    exit 2
fi
locks="${MLRC_GPU_LOCKS:-/var/lib/mlrc/gpu-locks}"
dev="${_MLRC_DEV_DIR:-/dev}" # tests only: a directory standing in for /dev

# One line per GPU: "<lock name> <CUDA_VISIBLE_DEVICES value>".
list_gpus() {
    local uuids uuid i=0 node
    if command -v nvidia-smi >/dev/null 2>&1 \
        && uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null) \
        && [[ -n "$uuids" ]]; then
        while read -r uuid; do
            if [[ -n "$uuid" ]]; then echo "$uuid $uuid"; fi
        done <<<"$uuids"
        return 0
    fi
    # /dev/nvidiaN numbers are host-wide (lock names); CUDA numbers the visible ones 0, 1, ...
    # in PCI bus order, as the driver numbers the devices.
    for node in $(find "$dev" -maxdepth 1 -name 'nvidia[0-9]*' -printf '%f\n' 2>/dev/null | sort -V); do
        echo "$node $i"
        i=$((i + 1))
    done
}

mapfile -t gpus < <(list_gpus)
if [[ ${#gpus[@]} -eq 0 ]]; then
    echo "mlrc-one-gpu: no GPU visible in this container (NVIDIA Container Toolkit installed?" \
        "the service must reserve GPUs: deploy.resources.reservations.devices)" >&2
    exit 1
fi
mkdir -p "$locks"
for gpu in "${gpus[@]}"; do
    read -r name visible <<<"$gpu"
    exec {fd}>>"$locks/$name.lock"
    if flock --nonblock "$fd"; then
        export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="$visible" MLRC_DEVICE=cuda
        echo "mlrc-one-gpu: ${HOSTNAME:-this host}: GPU $name" >&2
        exec "$@" # the lock stays held by the inherited descriptor $fd
    fi
    exec {fd}>&-
done
echo "mlrc-one-gpu: all ${#gpus[@]} GPUs of this host are held by other workers; nothing to do" \
    "(start at most one worker per GPU: MLRC_WORKERS, --scale worker=N)" >&2
exit 0
