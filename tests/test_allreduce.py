"""All-reduce: every algorithm x dtype x op x awkward count, in place and
not, on several communicators, against numpy and MPI_Allreduce, with every
rank holding identical bits. Run under mpiexec (``make test``)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import (ALL_DTYPES, IdenticalEverywhere, assert_identical_everywhere, exact_values, np_dtype, ops_for,
                      reference)
from mpicoll import dtypes as _dtypes

pytestmark = pytest.mark.mpi

ALGORITHMS = mpicoll.algorithms("allreduce")


def counts_for(p):
    """0, 1, fewer than p, not divisible by p, and one long enough to be segmented."""
    return sorted({0, 1, max(p - 1, 1), 2 * p + 1, 1000, 70001})


def make_input(name, op, n, rank, seed=0):
    return exact_values(name, op, n, seed * 1000 + rank)


_EXACT_CASES = {}


def exact_case(name, op, n, p):
    """(every rank's input, the reference) for one case of
    test_allreduce_exact: the same for every algorithm, so built once
    (every rank builds all p inputs: at 8 ranks on 2 cores that cost ~5 s
    over the algorithms), and read-only."""
    key = (name, op, n, p)
    if key not in _EXACT_CASES:
        inputs = [make_input(name, op, n, r) for r in range(p)]
        want = reference(inputs, op, p)
        for a in (*inputs, want):
            a.flags.writeable = False
        _EXACT_CASES[key] = inputs, want
    return _EXACT_CASES[key]


def communicators():
    world = MPI.COMM_WORLD
    split = world.Split(world.rank % 2, -world.rank)  # reversed rank order within each half
    return {"world": world, "self": MPI.COMM_SELF, "dup": world.Dup(), "split": split}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ALL_DTYPES)
def test_allreduce_exact(algorithm, name):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    counts = counts_for(p) if name in ("float32", "int32", "float16") else [0, 1, p + 1, 1000]
    same = IdenticalEverywhere(comm)  # every case's bits, compared across ranks in one call at the end
    for op in ops_for(name):
        for n in counts:
            inputs, want = exact_case(name, op, n, p)
            for in_place in (False, True):
                x = inputs[rank].copy()
                if in_place:
                    got = mpicoll.allreduce(x, op=op, comm=comm, out=x, algorithm=algorithm)
                    assert got is x
                else:
                    got = mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm)
                    np.testing.assert_array_equal(x, inputs[rank])  # input untouched
                assert got.dtype == want.dtype and got.shape == want.shape
                what = f"{algorithm} {op} {name} n={n} in_place={in_place}"
                np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=what)
                same.add(got, what=what)
    same.check()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "uint16", "int32", "uint64"])
def test_integer_sums_wrap_like_numpy(algorithm, name):
    """Sums that overflow wrap around, as numpy's do, with every algorithm
    ("mpi" included: Open MPI's vectorised 8/16-bit sums saturate instead,
    from 8 or 16 elements on, so mpicoll reduces those with its own kernel), and
    through reduce and reduce_scatter."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    dt = np.dtype(name)
    info = np.iinfo(dt)

    def mine(q, n=1000):
        v = np.random.default_rng([3, q]).integers(info.min, info.max, n, dtype=dt, endpoint=True)
        v[:64] = info.max - q  # at least 64 overflowing lanes: MPI's vector path
        return v

    want = np.add.reduce(np.stack([mine(q) for q in range(p)]), axis=0, dtype=dt)
    got = mpicoll.allreduce(mine(rank), "sum", algorithm=algorithm)
    np.testing.assert_array_equal(got, want)
    assert_identical_everywhere(comm, got)
    red = mpicoll.reduce(mine(rank), "sum", 0)
    if rank == 0:
        np.testing.assert_array_equal(red, want)
    np.testing.assert_array_equal(mpicoll.reduce_scatter(mine(rank), "sum"), np.array_split(want, p)[rank])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_mpi_allreduce_on_random_floats(algorithm):
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank + 10)
    for dt in (np.float32, np.float64):
        for n in (3, 4097, 300_000):
            x = rng.standard_normal(n).astype(dt)
            native = np.empty_like(x)
            comm.Allreduce(x, native, MPI.SUM)
            got = mpicoll.allreduce(x, comm=comm, algorithm=algorithm)
            tol = 8 * comm.size * np.finfo(dt).eps
            np.testing.assert_allclose(got, native, rtol=tol, atol=tol * np.abs(x).max() * comm.size)
            assert_identical_everywhere(comm, got)
        for op in (MPI.MAX, MPI.MIN):
            native = np.empty_like(x)
            comm.Allreduce(x, native, op)
            np.testing.assert_array_equal(mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm), native)
    ints = rng.integers(-2**62, 2**62, 5001)
    for op in (MPI.SUM, MPI.PROD, MPI.BXOR, MPI.LOR):
        native = np.empty_like(ints)
        comm.Allreduce(ints, native, op)
        np.testing.assert_array_equal(mpicoll.allreduce(ints, op=op, comm=comm, algorithm=algorithm), native)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_any_communicator(algorithm):
    for label, comm in communicators().items():
        p, rank = comm.size, comm.rank
        for n in (0, 1, 5, 10007):
            inputs = [exact_values("float32", "sum", n, 77 + r) for r in range(p)]
            got = mpicoll.allreduce(inputs[rank], comm=comm, algorithm=algorithm)
            np.testing.assert_array_equal(got, reference(inputs, "sum", p), err_msg=label)
            assert_identical_everywhere(comm, got)


def test_shapes_and_buffer_kinds():
    comm = MPI.COMM_WORLD
    p = comm.size
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    y = mpicoll.allreduce(x, comm=comm)
    assert y.shape == (2, 3, 4) and (y == x * p).all()
    nc = np.arange(40, dtype=np.float64).reshape(5, 8)[:, ::2]  # non-contiguous input: copied
    assert (mpicoll.allreduce(nc, comm=comm) == nc * p).all()
    import array

    a = array.array("d", [1.0, 2.0])
    assert mpicoll.allreduce(a, comm=comm).tolist() == [p * 1.0, p * 2.0]
    ba = bytearray(b"\x01\x02")
    assert mpicoll.allreduce(ba, op="max", comm=comm).tolist() == [1, 2]
    s = mpicoll.allreduce(np.float32(1.5), comm=comm)
    assert s.shape == () and s == 1.5 * p


def test_bfloat16_over_uint16_storage():
    comm = MPI.COMM_WORLD
    bf = np_dtype("bfloat16")
    vals = np.arange(10, dtype=np.float32) + comm.rank
    bits = vals.astype(bf).view(np.uint16)
    got = mpicoll.allreduce(bits, comm=comm, dtype="bfloat16")
    assert got.dtype == np.uint16
    want = sum((np.arange(10, dtype=np.float32) + r) for r in range(comm.size))
    np.testing.assert_array_equal(got.view(bf).astype(np.float32), want.astype(bf).astype(np.float32))
    got2 = mpicoll.allreduce(vals.astype(bf), comm=comm)  # ml_dtypes array directly
    assert got2.dtype == bf and (got2.view(np.uint16) == got).all()


def test_avg_divides_by_size():
    comm = MPI.COMM_WORLD
    x = np.full(7, float(comm.rank), np.float64)
    got = mpicoll.allreduce(x, op="avg", comm=comm)
    np.testing.assert_allclose(got, (comm.size - 1) / 2)
    with pytest.raises(TypeError, match="floating"):
        mpicoll.allreduce(np.ones(3, np.int32), op="avg", comm=comm)


def test_bad_input_raises_before_any_message():
    """Only rank 0 makes each mistake; if a mistake sent a message, the
    valid all-reduce after it would mismatch or hang (under the timeout)."""
    comm = MPI.COMM_WORLD
    f = np.ones(4, np.float32)
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    bad = [
        (ValueError, dict(x=f, op="mean")),
        (ValueError, dict(x=f, algorithm="bogus")),
        (TypeError, dict(x=f, op="band")),
        (TypeError, dict(x=np.ones(4, np.complex64))),
        (TypeError, dict(x=[1.0, 2.0])),
        (ValueError, dict(x=f, out=np.empty(5, np.float32))),
        (TypeError, dict(x=f, out=np.empty(4, np.float64))),
        (ValueError, dict(x=f, out=ro)),
        (ValueError, dict(x=f, out=np.empty(8, np.float32)[::2])),
        (TypeError, dict(x=f, comm="world")),
        (TypeError, dict(x=np.ones(4, np.int32), dtype="bfloat16")),
        (ValueError, dict(x=f, op=MPI.MAXLOC)),
    ]
    if comm.rank == 0:
        for exc, kw in bad:
            with pytest.raises(exc):
                mpicoll.allreduce(**kw) if "comm" in kw else mpicoll.allreduce(comm=comm, **kw)
    got = mpicoll.allreduce(np.full(3, comm.rank + 1.0), comm=comm)
    assert (got == comm.size * (comm.size + 1) / 2).all()


def test_user_messages_are_not_disturbed():
    """mpicoll works on a private duplicate: a user's pending receive with
    wildcards on the same communicator must not catch mpicoll's traffic."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    buf = np.zeros(4, np.int64)
    req = comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    for alg in ALGORITHMS:
        got = mpicoll.allreduce(np.full(10, rank, np.int64), comm=comm, algorithm=alg)
        assert (got == p * (p - 1) // 2).all()
    assert not req.Test()
    comm.Barrier()  # nobody sends the user message before every rank has checked
    comm.Send(np.full(4, rank, np.int64), dest=(rank + 1) % p, tag=99)
    req.Wait()
    assert (buf == (rank - 1) % p).all()


def test_environment_forces_algorithm(monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.setenv("MPICOLL_ALGORITHM", "tree")
    assert mpicoll.explain(1 << 20, comm=comm).name == "tree"
    x = exact_values("int32", "sum", 33, comm.rank)
    inputs = [exact_values("int32", "sum", 33, r) for r in range(comm.size)]
    np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm), reference(inputs, "sum", comm.size))
    monkeypatch.setenv("MPICOLL_ALGORITHM", "nonsense")
    with pytest.raises(ValueError, match="MPICOLL_ALGORITHM"):
        mpicoll.allreduce(x, comm=comm)


def test_freed_communicator_releases_state():
    comm = MPI.COMM_WORLD.Dup()
    mpicoll.allreduce(np.ones(3), comm=comm)
    from mpicoll.commstate import state

    inner = state(comm).comm
    comm.Free()  # runs mpicoll's delete callback, which frees the duplicate
    assert inner == MPI.COMM_NULL


def test_dtype_table_is_complete():
    assert set(ALL_DTYPES) == {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                               "float16", "bfloat16", "float32", "float64"}
    assert _dtypes.BY_NAME["float16"].mpi is None
