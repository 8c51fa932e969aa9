"""scatter, gather, allgatherv, alltoall, alltoallv: every algorithm against the native MPI call.

    mpiexec -n 4 python -m mpi4py -m mpicoll.bench family [--sizes 8,64,...] [--rounds 3] [--collectives a,b]

Size is per rank: the block each rank receives (scatter), sends (gather,
allgatherv), or its whole send buffer (alltoall, alltoallv: p blocks of
size/p). Each round times every algorithm and the native mpi4py call
(``comm.Scatter``... on a duplicate communicator) in a shuffled order, the
same on every rank; the table shows the median over rounds of the slowest
rank's time per call and the speed-up, native time / mpicoll time (> 1:
mpicoll is faster). mpicoll is called through its blocking front door
(``mpicoll.scatter(x, out=...)``), so its per-call overhead is included.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.bench.timing import interleaved

DEFAULT_SIZES = [8 << (3 * i) for i in range(8)] + [16 << 20]  # 8 B, 64 B, ... 16 MiB
COLLECTIVES = ("scatter", "gather", "allgatherv", "alltoall", "alltoallv")


def _cases(comm, native, collective, size):
    """(native callable, {algorithm: callable}) for one collective and size."""
    p, rank = comm.size, comm.rank
    B = MPI.BYTE
    if collective in ("scatter", "gather", "allgatherv"):
        full = np.ones((p, size), np.uint8)
        mine = np.ones(size, np.uint8)
    if collective == "scatter":
        def nat():
            native.Scatter([full, B] if rank == 0 else None, [mine, B], 0)

        def ours(a):
            return lambda: mpicoll.scatter(full, 0, comm=comm, out=mine, algorithm=a)
    elif collective == "gather":
        def nat():
            native.Gather([mine, B], [full, B] if rank == 0 else None, 0)

        def ours(a):
            return lambda: mpicoll.gather(mine, 0, comm=comm, out=full, algorithm=a)
    elif collective == "allgatherv":
        counts = [size] * p
        flat = full.reshape(-1)

        def nat():
            native.Allgatherv([mine, B], [flat, (counts, None), B])

        def ours(a):
            return lambda: mpicoll.allgatherv(mine, counts, comm=comm, out=flat, algorithm=a)
    else:
        block = max(1, size // p)
        x = np.ones(block * p, np.uint8)
        y = np.empty_like(x)
        if collective == "alltoall":
            x2, y2 = x.reshape(p, block), y.reshape(p, block)

            def nat():
                native.Alltoall([x, B], [y, B])

            def ours(a):
                return lambda: mpicoll.alltoall(x2, comm=comm, out=y2, algorithm=a)
        else:
            counts = [block] * p

            def nat():
                native.Alltoallv([x, (counts, None), B], [y, (counts, None), B])

            def ours(a):
                return lambda: mpicoll.alltoallv(x, counts, counts, comm=comm, out=y, algorithm=a)
    return nat, {a: ours(a) for a in mpicoll.algorithms(collective)}


def measure(comm, collective, sizes, rounds, seed=0):
    """{size: {label: seconds per call}} with label "native" for mpi4py's call."""
    native = comm.Dup()
    rng = np.random.default_rng(seed)
    res = {}
    for size in sizes:
        nat, ours = _cases(comm, native, collective, size)
        fns = [("native", nat)] + list(ours.items())
        iters = int(min(200, max(2, (4 << 20) // max(size, 1) // max(comm.size, 1))))
        for _, fn in fns:  # warm-up: plans, states, scratch
            fn()
            fn()
        res[size] = interleaved(comm, fns, rounds, iters, rng)
    native.Free()
    return res


def _fmt_size(n):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def table(collective, p, res) -> str:
    algs = [a for a in next(iter(res.values())) if a != "native"]
    head = f"{collective}, p={p}: native time, then speed-up native/mpicoll per algorithm (> 1: mpicoll faster)"
    lines = [head, "| size/rank | native | " + " | ".join(algs) + " |", "|---:|---:|" + "---:|" * len(algs)]
    for size, t in res.items():
        cells = [f"{t['native'] / t[a]:.2f}x" for a in algs]
        lines.append(f"| {_fmt_size(size)} | {t['native'] * 1e6:.1f} us | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench family", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes per rank, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",")]
    for coll in args.collectives.split(","):
        res = measure(comm, coll, sizes, args.rounds)
        if comm.rank == 0:
            print(table(coll, comm.size, res), flush=True)
            print(flush=True)
    return 0
