"""The C progress thread's price for a wait() right after the start: the
library's iallreduce(x, out=y, algorithm="mpi").wait() with the thread on and
off (engine.NATIVE_BG_MIN_BYTES switched in the process) and mpi4py's
Iallreduce(..).Wait(), 11 alternating batches, median of the slowest rank.

    mpiexec -n 2 python -m mpi4py scripts/bg_wait_cost.py

Prints one line per size (1, 2 and 3 MiB): bg / off / mpi4py, us.
"""
import statistics, time
import numpy as np
from mpi4py import MPI
import mpicoll
from mpicoll import engine
comm = MPI.COMM_WORLD
on = engine.NATIVE_BG_MIN_BYTES
for nb in (1 << 20, 2 << 20, 3 << 20):
    x = np.ones(nb // 4, np.float32); y = np.empty_like(x)
    calls = max(20, int(2e-2 / (nb / 4e9)))
    ts = {"bg": [], "off": [], "mpi4py": []}
    for rep in range(11):
        for k in (["bg", "off", "mpi4py"] if rep % 2 == 0 else ["mpi4py", "off", "bg"]):
            engine.NATIVE_BG_MIN_BYTES = on if k == "bg" else 1 << 40
            comm.Barrier(); t0 = time.perf_counter()
            for _ in range(calls):
                if k == "mpi4py":
                    comm.Iallreduce(x, y).Wait()
                else:
                    mpicoll.iallreduce(x, out=y, comm=comm, algorithm="mpi").wait()
            ts[k].append(comm.allreduce((time.perf_counter() - t0) / calls * 1e6, op=MPI.MAX))
    if comm.rank == 0:
        m = {k: statistics.median(v) for k, v in ts.items()}
        print(f"{nb >> 10:5} KiB  " + "  ".join(f"{k} {v:8.1f} us" for k, v in m.items()))
