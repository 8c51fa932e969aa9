"""Every all-reduce algorithm against MPI_Allreduce, on this machine.

    mpiexec -n 4 python -m mpi4py examples/demo.py [--sizes 8,65536,4194304]

For each message size (float32 sum) and algorithm: the slowest rank's time
per call, the speed ratio against native MPI_Allreduce measured in the same
run (>1 means faster than MPI), and the number of elements that differ from
MPI_Allreduce's result beyond rounding.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def timed(comm, fn, iters):
    fn()  # warm-up (and first-call communicator setup)
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    local = (time.perf_counter() - t) / iters
    return comm.allreduce(local, op=MPI.MAX)  # the slowest rank's time, as osu_allreduce reports


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,65536,1048576,16777216",
                    help="comma-separated message sizes in bytes (float32)")
    ap.add_argument("--max-iters", type=int, default=200, help="cap on timed calls per measurement")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, p = comm.rank, comm.size
    rng = np.random.default_rng(rank)
    if rank == 0:
        print(f"mpicoll {mpicoll.__version__} on {p} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(f"{'bytes':>10} {'algorithm':<20} {'time (us)':>10} {'vs MPI':>7} {'wrong':>6}")
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        n = max(1, nbytes // 4)
        x = rng.standard_normal(n).astype(np.float32)
        ref = np.empty_like(x)
        comm.Allreduce(x, ref, MPI.SUM)
        iters = max(3, min(args.max_iters, (64 << 20) // max(nbytes, 1) // 4))
        t_mpi = timed(comm, lambda: comm.Allreduce(x, ref, MPI.SUM), iters)
        for alg in mpicoll.algorithms("allreduce"):
            out = np.empty_like(x)
            t = timed(comm, lambda: mpicoll.allreduce(x, out=out, comm=comm, algorithm=alg), iters)
            tol = 1e-5 * p * (np.abs(ref) + 1)
            wrong = int(comm.allreduce(int(np.count_nonzero(np.abs(out - ref) > tol)), op=MPI.SUM))
            rows.append((x.nbytes, alg, t, wrong))
            if rank == 0:
                label = alg if alg != "auto" else f"auto ({mpicoll.explain(x.nbytes, comm=comm).name})"
                print(f"{x.nbytes:>10} {label:<20} {t * 1e6:>10.1f} {t_mpi / t:>6.2f}x {wrong:>6}")
        if rank == 0:
            print(f"{x.nbytes:>10} {'MPI_Allreduce':<20} {t_mpi * 1e6:>10.1f} {1:>6.2f}x {0:>6}")
    return rows


if __name__ == "__main__":
    main()
