"""Resources: memory does not grow over many calls, mpicoll's private
communicators are released with the user's, and several threads may use
mpicoll at once on different communicators. Run under mpiexec.

The two loops are sized to prove something (10,000 calls; more
communicators than MPICH has context ids) and so take a few seconds; they
run at p <= 2 only, since what they check does not depend on p and an
oversubscribed 2-core machine makes every call slow (measured: 6 s at p = 2,
66 s at p = 3)."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.commstate import state

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
small_p = pytest.mark.skipif(world.size > 2, reason="loop sized for p <= 2 (cost, not coverage)")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@small_p
def test_ten_thousand_allreduces_do_not_grow_memory():
    comm = world.Dup()
    algorithms = mpicoll.algorithms("allreduce")
    # Every algorithm, a 16-bit float (user-defined MPI op on "mpi"), an
    # out-of-place and an in-place call: all the caches are filled here.
    xs = [np.ones(8, np.float64), np.ones(1000, np.float16), np.ones(3000, np.int32)]

    def run(i):
        x = xs[i % 3]
        y = mpicoll.allreduce(x, comm=comm, algorithm=algorithms[i % len(algorithms)])
        mpicoll.allreduce(y, op="max", comm=comm, out=y)
        return y

    for i in range(300):  # warm-up: scratch buffers, op objects, numpy/Python caches
        run(i)
    before = rss_bytes()
    for i in range(5000):  # 2 all-reduces each: 10,000
        run(i)
    grown = rss_bytes() - before
    growth = world.allgather(grown)
    comm.Free()
    assert max(growth) < 1 << 20, f"resident memory grew by {growth} bytes per rank over 10,000 all-reduces"


@small_p
def test_private_duplicates_are_released():
    """More create/use/free rounds than MPICH has context ids (2046 live
    communicators): if mpicoll leaked its private duplicate, Dup would
    fail part way."""
    for _ in range(2100):
        comm = world.Dup()
        mpicoll.allreduce(np.ones(2, np.int8), comm=comm)
        inner = state(comm).comm
        comm.Free()
        assert inner == MPI.COMM_NULL


def test_threads_on_different_communicators():
    """MPI_THREAD_MULTIPLE: threads may run mpicoll collectives at the same
    time as long as each uses its own communicator (the MPI rule: calls on
    one communicator must come in the same order on every rank, which
    threads sharing it cannot promise). Not supported: two threads on one
    communicator at once - see docs/reliability.md."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("MPI library without MPI_THREAD_MULTIPLE")
    nthreads = 3
    comms = [world.Dup() for _ in range(nthreads)]
    errors, results = [], {}
    algorithms = [a for a in mpicoll.algorithms() if a != "auto"]
    # Shared windows and node communicators are created here, one
    # communicator at a time and at the sizes the threads use: Open MPI
    # aborts when two threads allocate windows at once (docs/reliability.md).
    for t, c in enumerate(comms):
        for alg in algorithms:
            mpicoll.allreduce(np.ones(1000 + 37 * t, np.int64), comm=c, algorithm=alg)

    def work(t):
        try:
            for i in range(30):
                x = np.full(1000 + 37 * t, t + world.rank, np.int64)
                y = mpicoll.allreduce(x, comm=comms[t], algorithm=algorithms[(i + t) % len(algorithms)])
                results[t] = y
                want = t * world.size + world.size * (world.size - 1) // 2
                assert (y == want).all()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    for c in comms:
        c.Free()
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors
    assert len(results) == nthreads
