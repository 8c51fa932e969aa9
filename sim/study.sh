#!/bin/sh
# The long study (make simulate-study): mpicoll's schedules (SimGrid driver)
# and the MPI library's collectives (SMPI, MPICH and Open MPI selectors) on
# both platforms at p = 64, 256, 1024, 8 ranks per node; JSON and tables in
# $OUT (default bench-out/sim), each step's wall time in $OUT/times.txt.
# PYTHON: the venv's interpreter. Single-threaded: run it on a quiet machine.
set -e
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench-out/sim}
P=${P:-64,256,1024}
SIZES=${SIZES:-8,1K,64K,1M,16M,64M}
# smpirun at p = 1024 took ~2-4 min per size here: fewer sizes there.
LARGE_P_SIZES=${LARGE_P_SIZES:-8,64K,1M}
mkdir -p "$OUT"
step() { name=$1; shift; s=$(date +%s); "$@"; echo "$name $(( $(date +%s) - s )) s" >> "$OUT/times.txt"; }
for plat in cluster-128x8-fattree this-machine; do
  for sel in mpich ompi; do
    step "native-$plat-$sel" $PYTHON sim/run_anchor.py --platform platforms/$plat.xml --ppn 8 --p "$P" \
      --sizes "$SIZES" --large-p-sizes "$LARGE_P_SIZES" --collectives allreduce --selector $sel \
      --json "$OUT/native-$plat-$sel.json"
  done
  step "mpicoll-$plat" $PYTHON -m mpicoll.simulate --platform platforms/$plat.xml --ppn 8 --p "$P" \
    --sizes "$SIZES" --native "$OUT/native-$plat-mpich.json" "$OUT/native-$plat-ompi.json" \
    --json "$OUT/mpicoll-$plat.json" --profile-out "$OUT/tuning-$plat.json" > "$OUT/mpicoll-$plat.txt"
  cat "$OUT/mpicoll-$plat.txt"
done
# The family at p = 64 (native only: the table beside mpicoll's at p = 64).
step "native-family-p64" $PYTHON sim/run_anchor.py --platform platforms/cluster-128x8-fattree.xml --ppn 8 --p 64 \
  --sizes "$SIZES" --collectives bcast,reduce_scatter,allgather --selector mpich --json "$OUT/native-family-mpich.json"
cat "$OUT/times.txt"
