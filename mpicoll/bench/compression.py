"""Compressed all-reduce: time and bytes on the wire per rank.

    mpiexec -n 4 python -m mpi4py -m mpicoll.bench compression [--mib 1 4 16 64] [--ratio 0.01]

For float32 vectors of each size, on every rank of COMM_WORLD, compares

  mpi        native MPI_Allreduce (the uncompressed reference)
  ring       mpicoll's uncompressed ring (float32 on the wire)
  fp16/bf16  the compressed ring: 16-bit partial sums, float32 accumulation
  topk       top-k (k = ratio n) with error feedback: allgather of (index, value)

Time: best of ``--repeat`` runs of the slowest rank (the machine is shared:
the best run is the least disturbed one). Bytes: what this rank hands to MPI
to send in one call, counted by a proxy communicator (bench/wire.py; native
collectives are charged the bandwidth-optimal volume), and that figure as a
fraction of the uncompressed ring's bytes.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from ..algorithms import get as _get_algorithm
from .. import compression as _cmp
from ..arguments import reduction as _reduction
from ..commstate import state
from .. import dtypes
from .wire import counting


def _methods(ratio):
    red = _reduction("sum", dtypes.BY_NAME["float32"])

    def uncompressed(name):
        fn = _get_algorithm("allreduce", name)
        return lambda st, x, y: fn(st, y, red, src=x)

    def compressed(spec):
        return lambda st, x, y: _cmp.run(st, x, y, False, spec)

    return [("mpi", uncompressed("mpi")), ("ring", uncompressed("ring")),
            ("fp16", compressed(_cmp.HalfPrecision("fp16"))), ("bf16", compressed(_cmp.HalfPrecision("bf16"))),
            (f"topk {ratio:g}", compressed(_cmp.TopK(ratio)))]


def run(comm, sizes_mib, repeat, ratio):
    st = state(comm)
    rng = np.random.default_rng(st.rank)
    rows = []
    for mib in sizes_mib:
        n = int(mib * (1 << 20)) // 4
        x = rng.standard_normal(n).astype(np.float32)
        y = np.empty_like(x)
        methods = _methods(ratio)
        sent = {}
        for name, fn in methods:
            cst = counting(st)
            fn(cst, x, y)  # also the warm-up
            sent[name] = cst.sent
        best = {name: float("inf") for name, _ in methods}
        for _ in range(repeat):
            for name, fn in methods:  # interleaved: every method sees the same background load
                comm.Barrier()
                t = time.perf_counter()
                fn(st, x, y)
                t = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                best[name] = min(best[name], t)
        for name, _ in methods:
            rows.append({"method": name, "mib": mib, "seconds": best[name], "vs_mpi": best[name] / best["mpi"],
                         "sent": sent[name], "sent_fraction": sent[name] / sent["ring"] if sent["ring"] else 0.0})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench compression", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=0.01, help="top-k ratio (default 0.01)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rows = run(comm, args.mib, args.repeat, args.ratio)
    if comm.rank == 0:
        print(f"compressed all-reduce of float32, p={comm.size}, best of {args.repeat}; bytes sent per rank "
              "(native collectives: bandwidth-optimal volume)")
        print(f"{'MiB':>6} {'method':<10} {'ms':>9} {'x mpi':>7} {'MiB sent':>9} {'of ring':>8}")
        for r in rows:
            print(f"{r['mib']:>6g} {r['method']:<10} {r['seconds'] * 1e3:>9.2f} {r['vs_mpi']:>6.2f}x "
                  f"{r['sent'] / 2**20:>9.3f} {r['sent_fraction']:>7.1%}")
    return 0
