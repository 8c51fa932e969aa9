"""What the pre-flight agreement check costs (docs/reliability.md).

    mpiexec -n 2 python -m mpi4py -m mpicoll.bench.check_cost
    mpiexec -n 4 python -m mpi4py -m mpicoll.bench.check_cost

Times ``mpicoll.allreduce`` with ``check=False`` and ``check=True``
alternately in the same run (so both see the same machine load), for an
8-byte and a 1 MiB float64 vector, plus MPI_Allreduce itself for scale.
Each figure is the best, over ``--reps`` repetitions, of the mean time per
call over a batch; rank 0 prints the table. The receive-size checks are
always on and are part of both columns.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def per_call(fn, iters, comm):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters
    return comm.allreduce(t, op=MPI.MAX)  # a collective is as slow as its slowest rank


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--algorithm", default="auto")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for nbytes, iters in ((8, 2000), (1 << 20, 60)):
        x = np.ones(nbytes // 8, np.float64)
        out = np.empty_like(x)
        cases = {
            "MPI_Allreduce": lambda: comm.Allreduce(x, out, MPI.SUM),
            "check off": lambda: mpicoll.allreduce(x, comm=comm, out=out, algorithm=args.algorithm, check=False),
            "check on": lambda: mpicoll.allreduce(x, comm=comm, out=out, algorithm=args.algorithm, check=True),
        }
        best = {k: float("inf") for k in cases}
        for name, fn in cases.items():  # warm-up
            per_call(fn, max(1, iters // 10), comm)
        for _ in range(args.reps):
            for name, fn in cases.items():
                best[name] = min(best[name], per_call(fn, iters, comm))
        rows.append((nbytes, best))
    if comm.rank == 0:
        print(f"p = {comm.size}, algorithm = {args.algorithm}, best of {args.reps} (microseconds per call)")
        print(f"{'bytes':>8} {'MPI_Allreduce':>14} {'check off':>10} {'check on':>10} {'added':>8} {'added %':>8}")
        for nbytes, b in rows:
            added = b["check on"] - b["check off"]
            print(f"{nbytes:>8} {b['MPI_Allreduce'] * 1e6:>14.1f} {b['check off'] * 1e6:>10.1f} "
                  f"{b['check on'] * 1e6:>10.1f} {added * 1e6:>8.1f} {100 * added / b['check off']:>7.1f}%")
    comm.Free()


if __name__ == "__main__":
    main()
