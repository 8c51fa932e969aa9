"""What a door in C adds over the gated Call it runs: mpi4py's call, the
door (mpicoll.bcast, mpicoll.allreduce(x, out=y)) and the kept entry's Call
called directly, 8 B, 11 alternating batches of 3000, median of the slowest
rank.

    mpiexec -n 2 python -m mpi4py scripts/door_cost.py
"""
import statistics, time
import numpy as np
from mpi4py import MPI
import mpicoll
from mpicoll.commstate import state
comm = MPI.COMM_WORLD
x = np.ones(2, np.float32); y = np.empty_like(x)
for _ in range(5):
    mpicoll.bcast(x, 0); mpicoll.allreduce(x, out=y)
st = state(comm)
kb = [k for key, k in st.plans._d.items() if key[0] == "bcast"][0]
ka = [k for key, k in st.plans._d.items() if key[0] == "allreduce"][0]
fb, fa = kb.fast, ka.fast
runs = {
    "mpi4py Bcast": lambda: comm.Bcast(x, 0),
    "door bcast": lambda: mpicoll.bcast(x, 0),
    "Call bcast": lambda: fb(x),
    "mpi4py Allreduce": lambda: comm.Allreduce(x, y),
    "door allreduce": lambda: mpicoll.allreduce(x, out=y),
    "Call allreduce": lambda: fa(x, y),
}
ts = {k: [] for k in runs}
for rep in range(11):
    for k in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
        f = runs[k]
        comm.Barrier(); t0 = time.perf_counter()
        for _ in range(3000): f()
        ts[k].append(comm.allreduce((time.perf_counter() - t0) / 3000 * 1e6, op=MPI.MAX))
if comm.rank == 0:
    for k, v in ts.items():
        print(f"{k:18} {statistics.median(v):6.2f} us")
