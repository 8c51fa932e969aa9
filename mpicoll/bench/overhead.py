"""Per-call overhead of every front door against the native MPI_Allreduce.

    mpiexec -n 2 python -m mpi4py -m mpicoll.bench overhead [--sizes 8,256,4096] [--rounds 15] [--iters 2000]

Short all-reduces (a solver's dot products and norms) are latency-bound:
what matters is how much each door adds to the MPI call it ends in. Every
door and the native call are timed in the same run, interleaved: each round
times ``--iters`` calls of every door in a shuffled order (the same order on
every rank), and the table reports the median over the rounds of the slowest
rank's time per call, and the speed-up against native ``comm.Allreduce``
(native time / door time: > 1 means the door is faster). float32 sum.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.bench.timing import interleaved


def _doors(comm, x, y):
    """(label, callable) for every door; the same list on every rank."""
    mc = mpicoll.Comm(comm)
    pers = mpicoll.allreduce_init(x, out=y, comm=comm)
    pers_mpi = comm.Allreduce_init(x, y, MPI.SUM) if hasattr(comm, "Allreduce_init") else None

    def native():
        comm.Allreduce(x, y, MPI.SUM)

    def persistent():
        pers.start()
        pers.wait()

    def native_persistent():
        pers_mpi.Start()
        pers_mpi.Wait()

    doors = [
        ("native comm.Allreduce", native),
        ("mpicoll.allreduce(x, out=y)", lambda: mpicoll.allreduce(x, out=y, comm=comm)),
        ("mpicoll.allreduce(x)", lambda: mpicoll.allreduce(x, comm=comm)),
        ("mpicoll.allreduce(.., algorithm='mpi')", lambda: mpicoll.allreduce(x, out=y, comm=comm, algorithm="mpi")),
        ("mpicoll.Comm.Allreduce", lambda: mc.Allreduce(x, y, MPI.SUM)),
        ("allreduce_init: start+wait", persistent),
        ("allreduce_init: req()", pers),
        ("mpicoll.iallreduce(..).wait()", lambda: mpicoll.iallreduce(x, out=y, comm=comm).wait()),
        ("mpicoll.Comm.Iallreduce(..).Wait()", lambda: mc.Iallreduce(x, y, MPI.SUM).Wait()),
    ]
    if pers_mpi is not None:
        doors.insert(1, ("native comm.Allreduce_init", native_persistent))
    return doors, (pers, pers_mpi)


def measure(comm, sizes, rounds: int, iters: int, seed: int = 0) -> dict:
    """{nbytes: {label: median seconds per call (slowest rank)}}."""
    out = {}
    rng = np.random.default_rng(seed)  # same seed everywhere: the same shuffles on every rank
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        y = np.empty_like(x)
        doors, keep = _doors(comm, x, y)
        for label, fn in doors:  # warm-up: first calls build states and plans
            for _ in range(50):
                fn()
        out[nbytes] = interleaved(comm, doors, rounds, iters, rng)
        keep[0].free()
        if keep[1] is not None:
            keep[1].Free()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,256,4096", help="message sizes in bytes, comma-separated")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",")]
    res = measure(comm, sizes, args.rounds, args.iters)
    if comm.rank == 0:
        print(f"# per-call time (us, median of {args.rounds} rounds x {args.iters} calls, slowest rank) and "
              f"speed-up vs native comm.Allreduce (native/door; >1 = faster), p={comm.size}, float32 sum, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}")
        labels = list(next(iter(res.values())))
        head = "| door | " + " | ".join(f"{n} B" for n in sizes) + " |"
        print(head)
        print("|" + "---|" * (len(sizes) + 1))
        for label in labels:
            cells = []
            for n in sizes:
                t, nat = res[n][label], res[n]["native comm.Allreduce"]
                cells.append(f"{t * 1e6:.2f} us ({nat / t:.2f}x)")
            print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
