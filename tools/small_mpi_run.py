"""A small MPI program that touches every mpicoll code path once: every
all-reduce algorithm on a few dtypes/ops and awkward counts, in place and
not, plus reduce_scatter, allgather, bcast, reduce and a pre-flight check;
wire compression (fp16, bf16, top-k: compress.c), the shared-memory
all-reduce (its flag sync and one-chunk call are shmsync.c, the latter
also as the executor's step), the C executor (executor.c: a
repeated call of a compilable algorithm, then gated in native.c), the library's collectives called
from C (native.c: repeated calls of algorithm "mpi", every collective and
form), the nonblocking all-reduce and the mpi4py drop-in ``mpicoll.Comm``,
so that every C file runs.
Run by ``make sanitize`` under valgrind (and under ASan) at p = 2:

    mpiexec -n 2 valgrind ... python -m mpi4py tools/small_mpi_run.py
"""
import time

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
            # The same call again: a kept plan, which runs a compilable
            # algorithm's recorded program in the C executor (executor.c).
            assert mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm).tobytes() == y.tobytes()
            # And once more: that kept call whole in C (native.c's PROGRAM gate).
            assert mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm).tobytes() == y.tobytes()
            # Three I-calls: from the third, the I-call whole in C (native.c's I-run).
            for _ in range(3):
                assert mpicoll.iallreduce(x, op=op, comm=comm, algorithm=algorithm).wait().tobytes() == y.tobytes()
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
for compression in ("fp16", "bf16", "topk"):
    for n in (1, 1001, 5000):
        x = (np.arange(n) % 7 + rank).astype(np.float32)
        y = mpicoll.allreduce(x, comm=comm, compression=compression)
        assert y.shape == x.shape and np.isfinite(y).all(), compression
for dtype in ("float32", "float16", "int32"):
    for n in (1, p + 1, 20000):
        x = (np.arange(n) % 5 + rank).astype(dtype)
        y = mpicoll.allreduce(x, comm=comm, algorithm="shm")
        assert y.tobytes() == mpicoll.allreduce(x, comm=comm, algorithm="mpi").tobytes(), dtype
        # shm's one-chunk program in the executor: repeated (gated in native.c),
        # persistent (the C front's run) and nonblocking (a request's passes)
        out = np.empty_like(x)
        pr = mpicoll.allreduce_init(x, out=out, comm=comm, algorithm="shm")
        for _ in range(3):
            assert mpicoll.allreduce(x, out=out, comm=comm, algorithm="shm").tobytes() == y.tobytes(), dtype
            assert pr().tobytes() == y.tobytes(), dtype
            assert mpicoll.iallreduce(x, comm=comm, algorithm="shm").wait().tobytes() == y.tobytes(), dtype
        pr.free()
# A program's I-call of 1 MiB or more left pending: its passes on the C
# progress thread (a compiled schedule's kit; shm's on the gated Call's I-run).
big = (np.arange(300000) % 5 + rank).astype(np.float32)
want = mpicoll.allreduce(big, comm=comm, algorithm="mpi")
for algorithm in ("ring", "recursive_doubling", "shm"):
    pq = mpicoll.allreduce_init(big, out=np.empty_like(big), comm=comm, algorithm=algorithm)  # (its C front's runs)
    for _ in range(3):
        if rank == 0:
            time.sleep(0.01)  # (the others' first pass cannot finish the run)
        assert mpicoll.iallreduce(big, comm=comm, algorithm=algorithm).wait().tobytes() == want.tobytes()
        if rank == 0:
            time.sleep(0.01)
        assert pq().tobytes() == want.tobytes()
    pq.free()
for n in (0, 7, 20000):
    x = (np.arange(n) % 3 + rank).astype(np.float32)
    got = mpicoll.iallreduce(x, comm=comm).wait()
    assert got.tobytes() == mpicoll.allreduce(x, comm=comm).tobytes()
# Repeated calls of the MPI library's own algorithm, every collective: the
# kept plans make them from C (native.c), blocking, nonblocking and, where
# the library has them, persistent.
counts = [(k % 3) + 1 for k in range(p)]
for _ in range(3):  # (the third all-reduce runs whole in C: KeptAllreduce.fast)
    x = np.arange(1001.0) + rank
    mpicoll.allreduce(x, comm=comm, algorithm="mpi")
    mpicoll.iallreduce(x, comm=comm, algorithm="mpi").wait()
    mpicoll.bcast(x, 0, comm=comm)
    mpicoll.ibcast(x, 0, comm=comm).wait()
    mpicoll.reduce(x, root=0, comm=comm)
    mpicoll.ireduce(x, root=0, comm=comm).wait()
    mpicoll.reduce_scatter(x, comm=comm)
    mpicoll.allgather(x[:5], comm=comm)
    mpicoll.iallgather(x[:5], comm=comm).wait()
    mpicoll.scatter(np.ones((p, 3)), 0, comm=comm)
    mpicoll.gather(x[:3], 0, comm=comm)
    mpicoll.alltoall(np.ones((p, 3)), comm=comm)
    mpicoll.ialltoall(np.ones((p, 3)), comm=comm).wait()
    mpicoll.allgatherv(np.ones(counts[rank]), counts, comm=comm)
    mpicoll.alltoallv(np.ones(sum(counts)), counts, [counts[rank]] * p, comm=comm)  # (j sends counts[me] to me)
    # persistent requests: their start and wait in C (native.c PersistFront),
    # copy steps included (gather's, reduce_scatter's, allgatherv's)
    for pq in (mpicoll.allreduce_init(x, comm=comm, algorithm="mpi"), mpicoll.bcast_init(x, 0, comm=comm),
               mpicoll.alltoall_init(np.ones((p, 3)), comm=comm), mpicoll.gather_init(x[:3], 0, comm=comm),
               mpicoll.reduce_scatter_init(x, comm=comm), mpicoll.allgatherv_init(x[:counts[rank]], counts, comm=comm),
               mpicoll.scatter_init(np.ones((p, 3)), 0, comm=comm)):
        pq()
        pq.start()
        pq.wait()
        pq.free()
# long library I-calls: tested by native.c's C progress thread meanwhile
big = np.ones((1 << 20) // 8 + 5) * (rank + 1)
for _ in range(3):
    req = mpicoll.iallreduce(big, comm=comm, algorithm="mpi")
    time.sleep(0.005)
    assert (req.wait() == p * (p + 1) / 2).all()
# persistent runs of compiled schedules: their start and wait in C too
# (native.c XRun), with avg's finish, in place, and test() handing a run on
for algorithm in ("ring", "recursive_doubling", "rabenseifner", "tree", "knomial"):
    for op, inplace in (("sum", False), ("avg", True)):
        v = np.arange(p + 3, dtype=np.float32) + rank
        pq = mpicoll.allreduce_init(v, op=op, comm=comm, algorithm=algorithm, out=v if inplace else None)
        for _ in range(3):
            pq()
        pq.start()
        while not pq.test():
            pass
        pq.free()
drop = mpicoll.Comm(comm)
send, recv = np.arange(1001, dtype=np.float64) + rank, np.empty(1001)
for _ in range(4):  # (from the third call the doors in C serve them: native.c Door/MethodDoor)
    drop.Allreduce(send, recv, op=MPI.SUM)
    assert (recv == p * np.arange(1001.0) + sum(range(p))).all()
    drop.Iallreduce(MPI.IN_PLACE, recv).Wait()
    drop.Bcast(recv, p - 1)
    drop.Ibcast(recv, 0).Wait()
    mpicoll.gather(send[:4], p - 1, comm=comm)
    mpicoll.alltoall(np.ones((p, 2)), comm=comm, out=np.empty((p, 2)))
    drop.Reduce(send, recv, MPI.SUM, 0)
    drop.Allgather(send[:3], np.empty(3 * p))
    drop.Alltoall(send[:2 * p], np.empty(2 * p))
    drop.Gather(send[:3], np.empty(3 * p), p - 1)
    drop.Scatter(np.ones((p, 3)), np.empty(3), 0)
    drop.Scatterv([send[:sum(counts)], counts], np.empty(counts[rank]), 0)
    drop.Gatherv(send[:counts[rank]], [np.empty(sum(counts)), counts], p - 1)
    drop.Reduce_scatter_block(send[:2 * p], np.empty(2))
    drop.Reduce_scatter(send[:sum(counts)], np.empty(counts[rank]), counts)
    drop.Allgatherv(send[:counts[rank]], [np.empty(sum(counts)), counts])
    drop.Ialltoallv([send[:sum(counts)], counts], [np.empty(counts[rank] * p), [counts[rank]] * p]).Wait()
dup = comm.Dup()
mpicoll.allreduce(np.ones(10), comm=dup)
dup.Free()
if rank == 0:
    print("small_mpi_run: ok", flush=True)
