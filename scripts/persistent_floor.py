"""Where a persistent request's start+wait goes: mpicoll's persistent
all-reduce against mpi4py's ``Allreduce_init`` and against the bare C
request under mpicoll's (``req._fast``: csrc/native.c's ``Req``, no gate,
no call number), in alternating batches.

    mpiexec -n 2 python scripts/persistent_floor.py [--bytes 8] [--reps 21] [--calls 2000]

Prints the median time per start+wait of each (slowest rank) and the ratio
mpi4py / mpicoll. The gap between "mpicoll" and "bare Req" is what the
persistent front does per run on top of the library's calls (the callback
check, the one-thread gate, the call number, the engine's list read).
Needs an MPI-4 library with persistent collectives (MPICH; Open MPI 5
reports MPI 3.1) and the native module built.
"""
import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = max(1, a.bytes // 4)
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    pq = mpicoll.allreduce_init(x, out=y, comm=comm)
    if getattr(pq, "_fast", None) is None:
        raise SystemExit("persistent_floor: no C persistent request here (MPI < 4, or native calls off)")
    nat = comm.Allreduce_init(x, y, MPI.SUM)
    bare = pq._fast

    def ours():
        pq.start()
        pq.wait()

    def theirs():
        nat.Start()
        nat.Wait()

    def floor():
        bare.Start()
        bare.Wait()

    runs = {"mpicoll": ours, "mpi4py": theirs, "bare Req": floor}
    times = {k: [] for k in runs}
    for rep in range(a.reps):
        order = list(runs) if rep % 2 == 0 else list(reversed(runs))
        for k in order:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                runs[k]()
            t = (time.perf_counter() - t0) / a.calls * 1e6
            times[k].append(comm.allreduce(t, op=MPI.MAX))
    med = {k: statistics.median(v) for k, v in times.items()}
    if comm.rank == 0:
        print(f"p = {comm.size}, {n * 4} B, {a.reps} x {a.calls} start+wait")
        for k, v in med.items():
            print(f"  {k:9} {v:6.2f} us")
        print(f"  ratio mpi4py / mpicoll: {med['mpi4py'] / med['mpicoll']:.2f}")
    pq.free()
    nat.Free()


if __name__ == "__main__":
    main()
