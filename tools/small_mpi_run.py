"""A small MPI program that touches every mpicoll code path once: every
all-reduce algorithm on a few dtypes/ops and awkward counts, in place and
not, plus reduce_scatter, allgather, bcast, reduce and a pre-flight check.
Run by ``make sanitize`` under valgrind (and under ASan) at p = 2:

    mpiexec -n 2 valgrind ... python -m mpi4py tools/small_mpi_run.py
"""
import numpy as np
from mpi4py import MPI

import mpicoll

comm = MPI.COMM_WORLD
p, rank = comm.size, comm.rank
for algorithm in mpicoll.algorithms("allreduce"):
    for dtype, op in (("float32", "sum"), ("float16", "max"), ("int8", "prod"), ("float64", "avg"),
                      ("uint32", "bxor")):
        for n in (0, 1, p + 1, 1001, 20000):
            x = (np.arange(n) % 5 + rank).astype(dtype)
            y = mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm)
            z = mpicoll.allreduce(x.copy(), op=op, comm=comm, algorithm=algorithm, out=None, check=True)
            assert y.tobytes() == z.tobytes()
            w = x.copy()
            mpicoll.allreduce(w, op=op, comm=comm, algorithm=algorithm, out=w)
            assert w.tobytes() == y.tobytes()
for algorithm in mpicoll.algorithms("reduce_scatter"):
    mpicoll.reduce_scatter(np.ones(1001, np.float32), comm=comm, algorithm=algorithm)
for algorithm in mpicoll.algorithms("allgather"):
    mpicoll.allgather(np.arange(7, dtype=np.int16), comm=comm, algorithm=algorithm)
for algorithm in mpicoll.algorithms("bcast"):
    mpicoll.bcast(np.arange(1001.0), root=p - 1, comm=comm, algorithm=algorithm)
for algorithm in mpicoll.algorithms("reduce"):
    mpicoll.reduce(np.ones(1001, np.int64), root=0, comm=comm, algorithm=algorithm)
dup = comm.Dup()
mpicoll.allreduce(np.ones(10), comm=dup)
dup.Free()
if rank == 0:
    print("small_mpi_run: ok", flush=True)
