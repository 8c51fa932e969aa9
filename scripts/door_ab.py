"""The headline doors against the same mpi4py call, in tight loops: the
before/after figure for a change to the short-call path.

    mpiexec -n 2 python scripts/door_ab.py [--bytes 8] [--reps 9] [--calls 1000] [--json FILE]

``mpicoll.bench overhead`` is the table of every door; on a busy shared
machine its figures for one door moved by 30-50 % from run to run (each
batch of one callable follows batches of 100 others, in a shuffled order).
This times fewer doors, each against its own mpi4py call in alternating
batches of ``--calls`` calls (the order flipped every repetition), and
prints, per door, the median over ``--reps`` batches of the slowest rank's
time per call and the ratio mpi4py / mpicoll (> 1: mpicoll faster). For a
before/after comparison run it alternately on the two checkouts (with
``PYTHONPATH`` at each) several times and take the median of the ratios:
docs/results/native-calls.md does.
"""
import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def doors(comm, n: int):
    """(name, mpicoll's call, the same call through mpi4py)."""
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    x, y = np.ones(n, np.float32), np.empty(n, np.float32)
    b = np.ones(n, np.float32)
    xs, g = np.ones((p, n), np.float32), np.empty((p, n), np.float32)
    mine = mpicoll.allreduce_init(x, out=y)
    theirs = comm.Allreduce_init(x, y)
    return [
        ("mpicoll.allreduce(x, out=y)", lambda: mpicoll.allreduce(x, out=y), lambda: comm.Allreduce(x, y)),
        ("mpicoll.allreduce(np.full(n, 1.0))", lambda: mpicoll.allreduce(np.full(n, 1.0, np.float32)),
         lambda: comm.Allreduce(np.full(n, 1.0, np.float32), y)),
        ("mpicoll.iallreduce(x, out=y).wait()", lambda: mpicoll.iallreduce(x, out=y).wait(),
         lambda: comm.Iallreduce(x, y).Wait()),
        ("mpicoll.allreduce_init: start+wait", lambda: (mine.start(), mine.wait()),
         lambda: (theirs.Start(), theirs.Wait())),
        ("mpicoll.bcast(x, 0)", lambda: mpicoll.bcast(b, 0), lambda: comm.Bcast(b, 0)),
        ("mpicoll.ibcast(x, 0).wait()", lambda: mpicoll.ibcast(b, 0).wait(), lambda: comm.Ibcast(b, 0).Wait()),
        ("mpicoll.alltoall(xs, out=g)", lambda: mpicoll.alltoall(xs, out=g), lambda: comm.Alltoall(xs, g)),
        ("mpicoll.gather(x, 0, out=g)", lambda: mpicoll.gather(x, 0, out=g if r == 0 else None),
         lambda: comm.Gather(x, g, 0)),
        ("Comm.Allreduce(x, y)", lambda: mc.Allreduce(x, y), lambda: comm.Allreduce(x, y)),
        ("Comm.Iallreduce(x, y).Wait()", lambda: mc.Iallreduce(x, y).Wait(), lambda: comm.Iallreduce(x, y).Wait()),
        ("Comm.Bcast(x, 0)", lambda: mc.Bcast(b, 0), lambda: comm.Bcast(b, 0)),
        ("Comm.Ibcast(x, 0).Wait()", lambda: mc.Ibcast(b, 0).Wait(), lambda: comm.Ibcast(b, 0).Wait()),
        ("mpicoll.reduce(x, root=0, out=y)", lambda: mpicoll.reduce(x, root=0, out=y if r == 0 else None),
         lambda: comm.Reduce(x, y, MPI.SUM, 0)),
        ("mpicoll.allgather(x, out=g)", lambda: mpicoll.allgather(x, out=g), lambda: comm.Allgather(x, g)),
        ("Comm.Reduce(x, y, root 0)", lambda: mc.Reduce(x, y, MPI.SUM, 0), lambda: comm.Reduce(x, y, MPI.SUM, 0)),
        ("Comm.Allgather(x, g)", lambda: mc.Allgather(x, g), lambda: comm.Allgather(x, g)),
        ("Comm.Alltoall(xs, g)", lambda: mc.Alltoall(xs, g), lambda: comm.Alltoall(xs, g)),
        ("forced recursive_doubling", lambda: mpicoll.allreduce(x, out=y, algorithm="recursive_doubling"),
         lambda: comm.Allreduce(x, y)),
        ("forced ring", lambda: mpicoll.allreduce(x, out=y, algorithm="ring"), lambda: comm.Allreduce(x, y)),
    ], (mine, theirs)


def batch(comm, fn, calls: int) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / calls * 1e6, op=MPI.MAX)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=8, help="bytes per rank (float32 elements x 4)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--json", help="also write the figures here (rank 0)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rows, persistent = doors(comm, max(1, args.bytes // 4))
    for _, ours, ref in rows:  # warm: states, kept plans, the C paths (from the third call)
        for _ in range(5):
            ours()
            ref()
    out = {}
    for name, ours, ref in rows:
        a, c = [], []
        for rep in range(args.reps):
            first, second = ((ours, a), (ref, c)) if rep % 2 else ((ref, c), (ours, a))
            first[1].append(batch(comm, first[0], args.calls))
            second[1].append(batch(comm, second[0], args.calls))
        out[name] = (statistics.median(a), statistics.median(c))
    for req in persistent:
        req.Free()
    if comm.rank == 0:
        print(f"# p={comm.size}, {args.bytes} B per rank, median of {args.reps} batches of {args.calls} calls, "
              f"slowest rank; ratio = mpi4py / mpicoll")
        for name, (a, c) in out.items():
            print(f"{name:40s} {a:8.2f} us {c:8.2f} us {c / a:6.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"p": comm.size, "bytes": args.bytes, "rows": out}, f)


if __name__ == "__main__":
    main()
