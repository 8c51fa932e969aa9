#!/bin/bash
# DeepSpeed's shm all-reduce and mpicoll's bench.shm, alternating, 2 ranks on this node.
# Usage: scripts/deepspeed_anchor.sh DS_PYTHON MPIEXEC MPICOLL_PYTHON ROUNDS SIZES...
set -u
ds_py=$1 mpiexec=$2 py=$3 rounds=$4; shift 4
sizes=("$@")
here=$(dirname "$0")
# LOCAL_SIZE equal to the world size is what switches DeepSpeed's shm path on.
export DS_ACCELERATOR=cpu MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29511} WORLD_SIZE=2 LOCAL_SIZE=2 \
       OMP_NUM_THREADS=1
for round in $(seq 1 "$rounds"); do
  echo "== round $round: DeepSpeed (load $(cut -d' ' -f1 /proc/loadavg))"
  pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r timeout 300 "$ds_py" "$here/deepspeed_anchor.py" "${sizes[@]}" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || exit 1; done
  rm -f /dev/shm/deepspeed_* 2>/dev/null
  echo "== round $round: mpicoll (load $(cut -d' ' -f1 /proc/loadavg))"
  csv=$(IFS=,; echo "${sizes[*]}")
  timeout 300 $mpiexec -n 2 "$py" -m mpi4py -m mpicoll.bench.shm --sizes "$csv" --algorithms auto,shm,mpi || exit 1
done
