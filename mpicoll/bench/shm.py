"""Shared-memory / hierarchical all-reduce vs MPI_Allreduce, measured in one run.

    mpiexec -n 4 python -m mpi4py -m mpicoll.bench.shm [--sizes 1M,4M,16M] [--algorithms auto,shm]
    ... --algorithms shm:flags:1M,shm:barrier:16M   # shm's sync mode and chunk size

For each message size (float32 sum) and algorithm it prints the slowest
rank's time per call (the best of ``--reps`` calls, interleaved with the
other candidates' calls: on a shared machine the minimum is the least
disturbed figure), the speed ratio against native MPI_Allreduce measured in the same
run (> 1: faster than MPI), the fraction of the memory-bandwidth bound,
and the bytes each rank sent across hosts per call.

Memory-bandwidth bound: any all-reduce must at least read its input and
write its output. "bound" is the time for every rank to copy its message
once, all ranks at the same time (np.copyto, same run), and "of bound" is
bound / time (100% = as fast as one concurrent copy).

Bytes across hosts: the transmit counters of the test bed's links
(interfaces named ``tb*`` in this host's network namespace, see
scripts/testbed.sh), read before and after, divided by the ranks on the
host and the number of calls; "-" where there is no such interface.
"""
from __future__ import annotations

import argparse
import glob
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import dtypes, ops
from mpicoll.algorithms import get as _get

_shm = _get("allreduce", "shm")
from mpicoll.commstate import state
from mpicoll.kernels import Reduction
from mpicoll.node import node_info


from mpicoll.bench.timing import parse_bytes as parse_size  # noqa: E402  (one size syntax for every bench)


def link_tx_bytes() -> int:
    total = 0
    for path in glob.glob("/sys/class/net/tb*/statistics/tx_bytes"):
        with open(path) as f:
            total += int(f.read())
    return total


def measure(comm, cands, reps, info):
    """Time every candidate call ``reps`` times, interleaved (a burst of load
    from other processes then hits all candidates alike), each call alone
    between barriers. Returns {name: (best time, mean bytes sent across hosts
    per rank per call or None)}: the best call is the least disturbed one
    on a shared machine; a call's time is its slowest rank's."""
    names = list(cands)
    for fn in cands.values():
        fn()  # warm-up: first-call set-up (windows, communicators)
    counting = bool(glob.glob("/sys/class/net/tb*")) and info.local_rank == 0
    times = np.zeros((reps, len(names)))
    sent = np.zeros(len(names))
    for r in range(reps):
        for j, name in enumerate(names):
            # read before the barrier: the count includes its few bytes
            tx = link_tx_bytes() if counting else 0
            comm.Barrier()
            t = time.perf_counter()
            cands[name]()
            times[r, j] = time.perf_counter() - t
            if counting:
                sent[j] += link_tx_bytes() - tx
    comm.Allreduce(MPI.IN_PLACE, times, MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, sent, MPI.SUM)
    have_links = comm.allreduce(counting, op=MPI.LOR)
    best = times.min(axis=0)
    return {name: (best[j], sent[j] / comm.size / reps if have_links else None) for j, name in enumerate(names)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    ap.add_argument("--algorithms", default="auto,shm,hierarchical,ring,rabenseifner")
    ap.add_argument("--reps", type=int, default=0, help="calls per candidate (default: by size)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, p = comm.rank, comm.size
    st = state(comm)
    info = node_info(st)
    red = Reduction(ops.resolve("sum"), dtypes.BY_NAME["float32"])
    if rank == 0:
        print(f"# mpicoll.bench.shm: p={p}, {info.nodes} node(s) of up to {info.ranks_per_node} ranks, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"{'bytes':>10} {'algorithm':<24} {'time (us)':>11} {'vs MPI':>7} {'of bound':>9} "
              f"{'bytes across hosts/rank':>24}")
    rng = np.random.default_rng(rank)
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        n = max(1, nbytes // 4)
        x = rng.standard_normal(n).astype(np.float32)
        out = np.empty_like(x)
        reps = args.reps or max(8, min(60, (512 << 20) // max(nbytes, 1)))
        cands = {"copy": lambda: np.copyto(out, x), "MPI_Allreduce": lambda: comm.Allreduce(x, out, MPI.SUM)}
        for alg in args.algorithms.split(","):
            if alg.startswith("shm:"):  # shm:SYNC:CHUNK, e.g. shm:barrier:4M (the knobs' sweep)
                _, sync, chunk = alg.split(":")
                cands[alg] = (lambda sy, cb: lambda: _shm(st, out, red, x, chunk_bytes=cb, sync=sy))(
                    sync, parse_size(chunk))
                continue
            label = alg if alg != "auto" else f"auto ({mpicoll.explain(x.nbytes, comm=comm).name})"
            cands[label] = (lambda a: lambda: mpicoll.allreduce(x, out=out, comm=comm, algorithm=a))(alg)
        res = measure(comm, cands, reps, info)
        t_copy, _ = res.pop("copy")
        t_mpi = res["MPI_Allreduce"][0]
        if rank == 0:
            for label, (t, b) in res.items():
                across = "-" if b is None else f"{b:,.0f} ({b / x.nbytes:.2f} n)"
                print(f"{x.nbytes:>10} {label:<24} {t * 1e6:>11.1f} {t_mpi / t:>6.2f}x {t_copy / t:>8.0%} "
                      f"{across:>24}", flush=True)


if __name__ == "__main__":
    main()
