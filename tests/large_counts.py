"""Counts beyond 2^31: an int8 buffer of 2^31 + 5 elements (2 GiB + 5 B),
all-reduced at p = 2 by every algorithm, and broadcast.

Not collected by ``make test`` (the file name does not start with test_):
``make test-large`` runs it as

    mpiexec -n 2 python -m mpi4py -m pytest -q -s --with-mpi -m mpi tests/large_counts.py

Memory: in place, each rank holds the 2 GiB vector plus the algorithm's
scratch (none for ring, 1 GiB for Rabenseifner, 2 GiB for recursive
doubling and tree, MPICH's own temporaries for "mpi"): peaks near 4 GiB
per rank. Every test runs on its own duplicate communicator, freed at the
end, so one algorithm's scratch is gone before the next one starts.

What it exercises: messages of more than 2^31 bytes (tree and recursive
doubling send the whole vector in one MPI call; mpi4py 4 then uses the
MPI-4 large-count calls, MPI_Send_c and friends), typed large counts
(MPI_Allreduce_c on MPI_INT8_T for "mpi"), and the kernels' size_t lengths.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll

pytestmark = pytest.mark.mpi

N = 2**31 + 5
PERIOD = 251  # prime: a block landing at the wrong offset shows up
CHUNK = PERIOD * (1 << 18)  # ~66 MB: fill and check without 2 GiB temporaries


def pattern(rank):
    return ((np.arange(CHUNK) % PERIOD) + rank).astype(np.int8)


def fill(x, rank):
    tile = pattern(rank)
    for a in range(0, x.size, CHUNK):
        b = min(a + CHUNK, x.size)
        x[a:b] = tile[:b - a]


def check(y, want_tile):
    for a in range(0, y.size, CHUNK):
        b = min(a + CHUNK, y.size)
        if not np.array_equal(y[a:b], want_tile[:b - a]):
            bad = a + int(np.flatnonzero(y[a:b] != want_tile[:b - a])[0])
            raise AssertionError(f"wrong value at element {bad} of {y.size}")


@pytest.fixture
def comm():
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()


@pytest.mark.skipif(MPI.COMM_WORLD.size != 2, reason="sized for p = 2")
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "recursive_doubling", "tree", "mpi"])
def test_allreduce_int8_beyond_2_31(comm, algorithm):
    x = np.empty(N, np.int8)
    fill(x, comm.rank)
    comm.Barrier()
    t0 = time.perf_counter()
    mpicoll.allreduce(x, op="sum", comm=comm, out=x, algorithm=algorithm)
    elapsed = time.perf_counter() - t0
    # sum over ranks r of (i % 251 + r), wrapping like int8
    want = sum(pattern(r).astype(np.int64) for r in range(comm.size)).astype(np.int8)
    check(x, want)
    assert x[-1] == want[(N - 1) % CHUNK]
    if comm.rank == 0:
        print(f"\n  allreduce {algorithm}: {N} int8 in {elapsed:.1f} s")


@pytest.mark.skipif(MPI.COMM_WORLD.size != 2, reason="sized for p = 2")
@pytest.mark.parametrize("algorithm", ["tree", "mpi"])
def test_bcast_beyond_2_31(comm, algorithm):
    x = np.empty(N, np.int8)
    if comm.rank == 1:
        fill(x, 7)
    t0 = time.perf_counter()
    mpicoll.bcast(x, root=1, comm=comm, algorithm=algorithm)
    elapsed = time.perf_counter() - t0
    check(x, pattern(7))
    if comm.rank == 0:
        print(f"\n  bcast {algorithm}: {N} bytes in {elapsed:.1f} s")
