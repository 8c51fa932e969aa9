"""Communication/computation overlap of ``mpicoll.iallreduce``, every algorithm, OSU style:
``mpiexec -n 2 python -m mpi4py -m mpicoll.bench overlap``.

For each message size (float32, 1-64 MiB by default), algorithm and
progress mode, as ``osu_iallreduce`` measures it:

* pure communication ``t_pure``: start, then wait at once;
* compute ``t_compute``: a GIL-releasing numpy kernel that runs for
  ``t_pure`` of wall-clock time (OSU's dummy compute), timed on its own;
  ``--compute python``: a pure-Python loop that holds the GIL instead;
* overall ``t_overall``: start, compute (no test() calls), wait;
* overlap % = 100 * max(0, 1 - (t_overall - t_compute) / t_pure): the share
  of the communication hidden behind the computation.

Progress modes: ``thread`` (the background progress thread, the default
where MPI_THREAD_MULTIPLE is available) and ``none`` (progress only inside
wait(): the baseline, expect little overlap). The blocking
``MPI_Allreduce`` time for the same size is printed for reference.

Each figure is the best of at least ``--repeat`` runs, more for short
messages (the machine is shared and noisy; the best run is the least
disturbed one). With more ranks than
cores, ranks, progress threads and the compute share the cores, so
overlap figures are a lower bound of what a machine with a free core per
rank would show.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from .. import api, engine
from ..registry import names as _names


class Compute:
    """A dummy computation that runs for a given wall-clock time, as OSU's
    ``dummy_compute`` does, in chunks of about 50 us of numpy ufunc loops
    over a cache-sized array. The loops release the GIL, so a progress thread
    in the same process can run while the caller computes."""

    def __init__(self):
        self.a = np.ones(1 << 13, np.float64)

    def run(self, seconds):
        a = self.a
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                np.multiply(a, 1.0000001, out=a)
                np.add(a, 1e-9, out=a)


class PythonCompute:
    """A computation in pure Python that holds the GIL (a training loop's
    bookkeeping, a Python-level solver): the progress thread gets its turn
    only when the interpreter forces a switch (engine.SWITCH_INTERVAL while
    operations are outstanding)."""

    def run(self, seconds):
        end = time.perf_counter() + seconds
        s = 0
        while time.perf_counter() < end:
            for i in range(200):
                s += i * i
        return s


COMPUTES = {"numpy": Compute, "python": PythonCompute}


def _sync_max(comm, t):
    return comm.allreduce(t, op=MPI.MAX)


def _runs(comm, repeat, budget_s, first):
    """How many repetitions: at least ``repeat``, more (up to 50) while they
    fit in ``budget_s`` - short runs are cheap, and on a loaded machine the
    best of many is the only stable figure. Decided on rank 0, for all."""
    n = max(repeat, min(50, int(budget_s / max(first, 1e-6))))
    return comm.bcast(n, root=0)


def measure(comm, nbytes, algorithm, mode, compute, repeat, budget_s=1.0):
    n = nbytes // 4
    x = np.ones(n, np.float32)
    out = np.empty_like(x)
    engine.set_progress_thread(mode == "thread")
    iallreduce = api.iallreduce
    # warm-up (the first call creates the communicator state and pages in buffers)
    t = time.perf_counter()
    iallreduce(x, comm=comm, out=out, algorithm=algorithm).wait()
    reps = _runs(comm, repeat, budget_s, time.perf_counter() - t)
    pure = []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        iallreduce(x, comm=comm, out=out, algorithm=algorithm).wait()
        pure.append(_sync_max(comm, time.perf_counter() - t))
    t_pure = min(pure)
    comps, overall = [], []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        compute.run(t_pure)
        comps.append(time.perf_counter() - t)
        comm.Barrier()
        t = time.perf_counter()
        req = iallreduce(x, comm=comm, out=out, algorithm=algorithm)
        compute.run(t_pure)
        req.wait()
        overall.append(_sync_max(comm, time.perf_counter() - t))
    t_comp, t_all = min(comps), min(overall)
    assert (out == comm.size).all(), "wrong result"
    overlap = 100.0 * max(0.0, 1.0 - (t_all - t_comp) / t_pure) if t_pure > 0 else 0.0
    return t_pure, t_comp, t_all, min(overlap, 100.0), reps


def blocking_time(comm, nbytes, repeat):
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    comm.Allreduce(x, out)
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, out)
        best = min(best, _sync_max(comm, time.perf_counter() - t))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench overlap", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,2,4,8,16,32,64", help="comma-separated message sizes in MiB")
    ap.add_argument("--algorithms", default=",".join(_names("allreduce")[1:]),
                    help=f"from {', '.join(_names('allreduce'))} (default: all but auto)")
    ap.add_argument("--modes", default="thread,none", help="progress modes: thread, none")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--compute", default="numpy", help="what overlaps: numpy (releases the GIL), python "
                    "(a pure-Python loop that holds it), or both, comma-separated")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    sizes = [int(float(s) * (1 << 20)) for s in args.sizes_mib.split(",")]
    algorithms = args.algorithms.split(",")
    modes = args.modes.split(",")
    if "thread" in modes and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        if comm.rank == 0:
            print("MPI_THREAD_MULTIPLE not available: no progress thread; measuring 'none' only")
        modes = [m for m in modes if m != "thread"]
    computes = [(k, COMPUTES[k]()) for k in args.compute.split(",")]
    was = engine._engine.enabled
    if comm.rank == 0:
        print(f"# iallreduce overlap, float32 sum, p={comm.size}, {MPI.Get_library_version().splitlines()[0]}")
        print(f"# best of 'runs' (>= {args.repeat}); times in ms (slowest rank); "
              "MPI_Allreduce = blocking native call, for reference")
        print(f"{'MiB':>5} {'algorithm':>18} {'progress':>8} {'compute':>7} {'pure comm':>10} {'compute':>9} "
              f"{'overall':>9} {'overlap %':>9} {'MPI_Allreduce':>13} {'runs':>5}")
    try:
        for nbytes in sizes:
            t_block = blocking_time(comm, nbytes, args.repeat)
            for algorithm in algorithms:
                for mode in modes:
                    for kind, compute in computes:
                        t_pure, t_comp, t_all, ovl, reps = measure(comm, nbytes, algorithm, mode, compute,
                                                                   args.repeat)
                        if comm.rank == 0:
                            print(f"{nbytes / (1 << 20):5.0f} {algorithm:>18} {mode:>8} {kind:>7} "
                                  f"{t_pure * 1e3:10.2f} {t_comp * 1e3:9.2f} {t_all * 1e3:9.2f} {ovl:9.1f} "
                                  f"{t_block * 1e3:13.2f} {reps:5d}", flush=True)
    finally:
        engine.set_progress_thread(was)
    return 0
