"""Does this MPI library keep a truncated message inside the receive buffer?

    mpiexec -n 2 python tools/truncation_check.py

Rank 1 sends n + extra float64 to rank 0, which receives into the first n
elements of a larger array filled with a marker, then counts the elements
past the n that changed. MPI says a message longer than its receive buffer
is an error (MPI_ERR_TRUNCATE) and writes nothing past the buffer; when
ranks disagree on a count, every receive-size check of mpicoll relies on
that. Measured (docs/reliability.md, "A truncated message"): MPICH 5.0.2
writes nothing past the buffer; Open MPI 5.0.11 writes the whole message
there from a few KiB (its rendezvous), i.e. it overwrites the memory after
the caller's array. Exit status 1 where the library writes past the buffer.
"""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.size != 2:
    sys.exit("truncation_check: run it on 2 ranks")
past = 0
for n, extra in ((100, 1), (1000, 1), (10000, 1), (10000, 1000), (131072, 5000)):
    if comm.rank == 1:
        comm.Send(np.ones(n + extra), dest=0, tag=5)
    else:
        big = np.full(n + 2 * extra + 64, -7.0)
        try:
            comm.Recv(big[:n], source=1, tag=5)
            how = "no error (!)"
        except MPI.Exception as exc:
            how = MPI.Get_error_string(exc.Get_error_code()).split(",")[0][:40]
        written = int(np.count_nonzero(big[n:] != -7.0))
        past = max(past, written)
        print(f"{n:7} float64, {extra:5} more sent: {how}; {written} elements written past the buffer", flush=True)
    comm.Barrier()
past = comm.bcast(past, root=0)
if comm.rank == 0:
    print(MPI.Get_library_version().splitlines()[0])
    print("truncation_check:", "writes past the receive buffer" if past else "keeps within the receive buffer")
sys.exit(1 if past else 0)
