"""reduce_scatter, allgather, bcast and reduce with every registered algorithm."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import exact_values, reference

pytestmark = pytest.mark.mpi

DTYPES = ["int32", "uint8", "float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("reduce_scatter"))
@pytest.mark.parametrize("name", DTYPES)
def test_reduce_scatter(algorithm, name):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    for n in (0, 1, p - 1, 3 * p + 2, 50001):
        inputs = [exact_values(name, "sum", n, r) for r in range(p)]
        full = reference(inputs, "sum", p)
        got = mpicoll.reduce_scatter(inputs[rank], comm=comm, algorithm=algorithm)
        want = np.array_split(full, p)[rank]
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
        # explicit, uneven counts (some zero)
        counts = [0] * p
        for i in range(n):
            counts[(i * 7) % p if p > 1 else 0] += 1
        got = mpicoll.reduce_scatter(inputs[rank], op="max", comm=comm, counts=counts, algorithm=algorithm)
        start = sum(counts[:rank])
        want = reference(inputs, "max", p)[start:start + counts[rank]]
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_reduce_scatter_bad_counts():
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        with pytest.raises(ValueError, match="counts"):
            mpicoll.reduce_scatter(np.ones(5), comm=comm, counts=[5] + [1] * (comm.size - 1) if comm.size > 1 else [4])
    comm.Barrier()


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("allgather"))
def test_allgather(algorithm):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    for shape, dt in (((0,), np.dtype(np.float32)), ((1,), np.dtype(np.int8)), ((3, 5), np.dtype(np.float64)),
                      ((70001,), np.dtype(np.uint16)),
                      ((2,), np.dtype([("a", np.int32), ("b", np.float64)]))):
        x = np.zeros(shape, dt)
        if dt.fields:
            x["a"] = rank
            x["b"] = rank / 2
        else:
            x[...] = rank
        got = mpicoll.allgather(x, comm=comm, algorithm=algorithm)
        assert got.shape == (p,) + shape and got.dtype == dt
        for r in range(p):
            if dt.fields:
                assert (got[r]["a"] == r).all()
            else:
                assert (got[r] == r).all()


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("bcast"))
def test_bcast(algorithm):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    for root in sorted({0, p - 1, p // 2}):
        for n in (0, 1, 1001, 100_003):
            x = np.full(n, rank, np.int32) if rank != root else np.arange(n, dtype=np.int32)
            got = mpicoll.bcast(x, root=root, comm=comm, algorithm=algorithm)
            assert got is x
            np.testing.assert_array_equal(x, np.arange(n, dtype=np.int32))
    if rank == 0:
        with pytest.raises(ValueError, match="root"):
            mpicoll.bcast(np.ones(2), root=p, comm=comm)
        with pytest.raises(ValueError, match="contiguous"):
            mpicoll.bcast(np.ones(4)[::2], comm=comm)
    comm.Barrier()


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("reduce"))
@pytest.mark.parametrize("name", DTYPES)
def test_reduce(algorithm, name):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    for root in sorted({0, p - 1}):
        for op in ("sum", "max"):
            for n in (0, 1, p + 1, 20001):
                inputs = [exact_values(name, op, n, r + 5) for r in range(p)]
                x = inputs[rank].copy()
                got = mpicoll.reduce(x, op=op, root=root, comm=comm, algorithm=algorithm)
                np.testing.assert_array_equal(x, inputs[rank])  # input untouched on every rank
                if rank == root:
                    np.testing.assert_array_equal(got.astype(np.float64),
                                                  reference(inputs, op, p).astype(np.float64))
                else:
                    assert got is None
