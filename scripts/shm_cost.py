"""The measurements of shm's one-chunk program (docs/shm.md, the stop notes):

    mpiexec -n 2 python -m mpi4py scripts/shm_cost.py loop      # 8 B: blocking, persistent, I-form vs MPI_Allreduce
    mpiexec -n 2 python -m mpi4py scripts/shm_cost.py barrier   # persistent start+wait after a barrier (and 20 us late)
    mpiexec -n 2 python -m mpi4py scripts/shm_cost.py first     # the first call on a fresh communicator: auto, shm, mpi
    mpiexec -n 2 python -m mpi4py scripts/shm_cost.py icall [nowake]  # iallreduce(..).wait() 16 KiB - 1 MiB

``nowake``: the engine's progress thread is not woken (WAKE_MIN_BYTES
raised in this process). Times in us; medians where rounds are repeated.
"""
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import mpicoll
import mpicoll.engine as _engine

comm = MPI.COMM_WORLD
mode = sys.argv[1] if len(sys.argv) > 1 else "loop"


def loop(f, n=3000):
    for _ in range(200):
        f()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


def after_barrier(f, n=2000, late=False):
    for _ in range(100):
        f()
    total = 0.0
    for _ in range(n):
        comm.Barrier()
        if late and comm.rank == 0:
            t1 = time.perf_counter()
            while time.perf_counter() - t1 < 20e-6:
                pass
        t0 = time.perf_counter()
        f()
        total += time.perf_counter() - t0
    return total / n * 1e6


x = np.ones(2, np.float32)
y = np.empty_like(x)
if mode == "loop":
    for alg in ("shm", "hierarchical"):
        pr = mpicoll.allreduce_init(x, out=y, algorithm=alg)
        got = (loop(lambda: comm.Allreduce(x, y)), loop(lambda: mpicoll.allreduce(x, out=y, algorithm=alg)),
               loop(pr), loop(lambda: mpicoll.iallreduce(x, out=y, algorithm=alg).wait()))
        if comm.rank == 0:
            print(alg, "MPI_Allreduce %.2f  blocking %.2f  persistent %.2f  I-form %.2f" % got)
elif mode == "barrier":
    pr = mpicoll.allreduce_init(x, out=y, algorithm="shm")

    def start_wait():
        pr.start()
        pr.wait()

    for late in (False, True):
        got = (after_barrier(start_wait, late=late),
               after_barrier(lambda: mpicoll.allreduce(x, out=y, algorithm="shm"), late=late))
        if comm.rank == 1:
            print("rank 0 20 us late" if late else "together", "persistent %.2f  blocking %.2f" % got)
elif mode == "first":
    res = {}
    for rnd in range(5):
        for alg in ("auto", "shm", "mpi"):
            c = comm.Dup()
            c.Barrier()
            t0 = time.perf_counter()
            mpicoll.allreduce(x, comm=c, algorithm=alg)
            res.setdefault(alg, []).append((time.perf_counter() - t0) * 1e6)
            c.Free()
    if comm.rank == 0:
        for alg, v in res.items():
            print(alg, "first call, median of 5: %.0f us" % statistics.median(v))
elif mode == "icall":
    if "nowake" in sys.argv[2:]:
        _engine.WAKE_MIN_BYTES = 1 << 40
    for nb in (16 << 10, 64 << 10, 256 << 10, 1 << 20):
        a = np.ones(nb // 4, np.float32)
        b = np.empty_like(a)
        fs = {"shm": lambda: mpicoll.iallreduce(a, out=b, algorithm="shm").wait(),
              "mpi": lambda: mpicoll.iallreduce(a, out=b, algorithm="mpi").wait(),
              "mpi4py": lambda: comm.Iallreduce(a, b).Wait()}
        for f in fs.values():
            for _ in range(50):
                f()
        ts = {k: [] for k in fs}
        for rnd in range(7):
            for k, f in fs.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(300):
                    f()
                ts[k].append(comm.allreduce((time.perf_counter() - t0) / 300 * 1e6, op=MPI.MAX))
        if comm.rank == 0:
            print(nb, {k: round(statistics.median(v), 1) for k, v in ts.items()})
else:
    raise SystemExit(__doc__)
