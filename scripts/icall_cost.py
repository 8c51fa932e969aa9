"""The I-call's cost per algorithm: ``mpicoll.iallreduce(x, out=y,
algorithm=A).wait()`` against mpi4py's ``comm.Iallreduce(x, y).Wait()``,
float32, the same arrays every call, in interleaved batches.

    mpiexec -n 2 python -m mpi4py scripts/icall_cost.py [--sizes 8,1024,16384,65536]
        [--algorithms auto,recursive_doubling,ring,tree,shm] [--reps 7]

Prints per size the median over the repetitions of the slowest rank's time
per call, us. From a signature's third call, a compiled schedule's (and
shm's) I-call below the sizes that wake the progress thread runs whole in
C (csrc/native.c, "a program's I-call"); from 64 KiB (shm: 1 MiB) it is the
engine's request (a generator, or a ProgramRequest).
"""
import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,1024,16384,65536")
    ap.add_argument("--algorithms", default="auto,recursive_doubling,ring,tree,shm")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    for nbytes in (int(s) for s in a.sizes.split(",")):
        n = max(1, nbytes // 4)
        x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
        runs = {"mpi4py": lambda: comm.Iallreduce(x, y).Wait()}
        for name in a.algorithms.split(","):
            runs[name] = (lambda name=name: mpicoll.iallreduce(x, out=y, algorithm=name).wait())
        for f in runs.values():  # (the kept plan, its gate, the window)
            for _ in range(100):
                f()
        calls = 2000 if nbytes <= 4096 else 500
        times = {k: [] for k in runs}
        for _ in range(a.reps):
            for k, f in runs.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    f()
                times[k].append(comm.allreduce((time.perf_counter() - t0) / calls * 1e6, op=MPI.MAX))
        if comm.rank == 0:
            print(f"p = {comm.size}, {nbytes} B: "
                  + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
