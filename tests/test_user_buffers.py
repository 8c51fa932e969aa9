"""Buffers as programs really pass them: a strided view kept and updated
between calls, views at odd byte offsets, an output made read-only, NaN in
min/max, and two threads on one communicator. Each case once gave a wrong
answer without an error (or an error after messages were sent)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import commstate as _comm

from conftest import assert_identical_everywhere

ALLREDUCE_ALGS = mpicoll.algorithms("allreduce")  # "auto" first


def _world():
    c = MPI.COMM_WORLD
    return c, c.Get_rank(), c.Get_size()


def _column(n, value, dtype=np.float64):
    """Column 0 of an (n, 3) matrix: a non-contiguous view, as a solver keeps one."""
    a = np.zeros((n, 3), dtype)
    col = a[:, 0]
    col[:] = value
    return a, col


# ---- buffers nobody but mpicoll holds, in flight ---------------------------------

LIVE_N = 40000  # int32: 160 KB, where Open MPI sends after the I-call returns


@pytest.mark.mpi
def test_nonblocking_buffers_live_until_wait():
    """Every buffer an i-form's MPI call reads or writes lives until wait(),
    whoever else holds it: the input passed as a temporary (how most code
    calls), the scratch a non-root rank of a reduce sends from, the private
    copy of a strided input. mpi4py does not keep a nonblocking call's
    buffers alive, and Open MPI reads a send buffer after the I-call has
    returned: before the requests held them, the root got freed memory's
    bytes (the next allocation's 7s, or allocator pointers) under Open MPI
    at p = 2. MPICH sends at once, so there this test cannot fail."""
    comm, r, p = _world()
    n, root = LIVE_N, p // 2
    mc = mpicoll.Comm(comm)
    want = np.arange(n, dtype=np.int64) * (p * (p + 1) // 2)
    for round_ in range(3):  # the first call builds its plan, the others hit the kept ones
        kept_x = np.arange(n, dtype=np.int32) * (r + 1)
        y = np.zeros(n, np.int32) if r == root else None
        started = [
            ("iallreduce(temporary)", mpicoll.iallreduce(np.arange(n, dtype=np.int32) * (r + 1), algorithm="mpi")),
            ("ireduce(temporary)", mpicoll.ireduce(np.arange(n, dtype=np.int32) * (r + 1), root=root,
                                                   algorithm="mpi")),
            ("iallreduce(strided temporary)",
             mpicoll.iallreduce(np.repeat(np.arange(n, dtype=np.int32) * (r + 1), 2)[::2], algorithm="mpi")),
            ("Comm.Ireduce (non-root scratch)", mc.Ireduce(kept_x, y, MPI.SUM, root)),
        ]
        junk = [np.full(n, 7, np.int32) for _ in range(8)]  # reuses whatever was freed
        wrong = []
        for what, req in started:
            got = req.wait() if hasattr(req, "wait") else (req.Wait(), y)[1]
            if "reduce" in what.lower() and "allreduce" not in what and r != root:
                continue
            if got is None or not np.array_equal(got, want):
                bad = np.flatnonzero(got != want) if got is not None else [0]
                wrong.append(f"round {round_}, {what}: {len(bad)} elements wrong, first at {bad[0]}")
        del junk
        everyone = comm.allgather(wrong)
        assert not any(everyone), {q: w for q, w in enumerate(everyone) if w}


# ---- a strided input reused across calls -----------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGS)
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_strided_input_updated_between_calls(algorithm, n):
    """The small-message plan cache used to keep the copy of a non-contiguous
    input made on the first call: 2, 2, 2 instead of 2, 4, 6."""
    comm, rank, p = _world()
    _, col = _column(n, 0.0)
    out = np.empty(n)
    for step in range(3):
        col[:] = (step + 1) * (rank + 1)
        got = mpicoll.allreduce(col, comm=comm, algorithm=algorithm)
        mpicoll.allreduce(col, comm=comm, algorithm=algorithm, out=out)
        want = (step + 1) * p * (p + 1) / 2
        assert np.all(got == want), (step, got[:3], want)
        assert np.all(out == want), (step, out[:3], want)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGS)
def test_strided_input_persistent_and_nonblocking(algorithm):
    comm, rank, p = _world()
    _, col = _column(7, 0.0)
    req = mpicoll.allreduce_init(col, comm=comm, algorithm=algorithm)
    for step in range(3):
        col[:] = step + rank
        got = req()
        assert np.all(got == step * p + p * (p - 1) / 2), (step, got)
        col[:] = step
        assert np.all(mpicoll.iallreduce(col, comm=comm, algorithm=algorithm).wait() == step * p)
    req.free()


@pytest.mark.mpi
def test_strided_input_reproducible():
    comm, rank, p = _world()
    _, col = _column(9, 0.0)
    for step in range(3):
        col[:] = step + rank
        got = mpicoll.allreduce(col, comm=comm, reproducible=True)
        assert np.all(got == step * p + p * (p - 1) / 2)


@pytest.mark.mpi
def test_strided_input_family_persistent():
    """Every *_init form rebinds nothing: a kept strided input is re-read at
    every start."""
    comm, rank, p = _world()
    n = 2 * p + 1
    _, col = _column(n, 0.0)
    rs = mpicoll.reduce_scatter_init(col, comm=comm)
    ag = mpicoll.allgather_init(col, comm=comm)
    rd = mpicoll.reduce_init(col, comm=comm, root=p - 1)
    _, rowed = _column(p, 0.0)  # scatter/alltoall take (p, ...) inputs
    sc = mpicoll.scatter_init(rowed, comm=comm, root=0)
    a2a = mpicoll.alltoall_init(rowed, comm=comm)
    ga = mpicoll.gather_init(col, comm=comm, root=0)
    agv = mpicoll.allgatherv_init(col, [n] * p, comm=comm)
    a2av = mpicoll.alltoallv_init(rowed, [1] * p, [1] * p, comm=comm)
    bounds = np.array_split(np.arange(n), p)
    for step in range(3):
        v = float(step * 10 + rank)
        col[:] = v
        rowed[:] = v
        every = np.array([step * 10.0 + r for r in range(p)])
        assert np.all(rs() == every.sum()) and rs.result.size == bounds[rank].size
        assert np.array_equal(ag(), np.repeat(every, n).reshape(p, n))
        got = rd()
        if rank == p - 1:
            assert np.all(got == every.sum())
        assert np.all(sc() == step * 10.0)  # root 0's rows
        assert np.array_equal(a2a(), every)
        got = ga()
        if rank == 0:
            assert np.array_equal(got, np.repeat(every, n).reshape(p, n))
        assert np.array_equal(agv(), np.repeat(every, n))
        assert np.array_equal(a2av(), every)
    for r in (rs, ag, rd, sc, a2a, ga, agv, a2av):
        r.free()


# ---- views at odd byte offsets ---------------------------------------------------------

def _misaligned(n, dtype, offset=1):
    """A C-contiguous, writable ndarray of n elements at ``offset`` bytes into a bytearray."""
    dtype = np.dtype(dtype)
    raw = bytearray(n * dtype.itemsize + 16)
    base = np.frombuffer(raw, np.uint8)
    start = (-base.ctypes.data) % 16 + offset  # an address that is 16-aligned, plus offset
    arr = base[start:start + n * dtype.itemsize].view(dtype)
    assert arr.flags.c_contiguous and arr.flags.writeable and (not arr.flags.aligned or n == 0)  # empty: "aligned"
    return arr


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
@pytest.mark.parametrize("n", [3, 3000])
def test_misaligned_buffers_reduce(algorithm, dtype, n):
    """A misaligned view passed every check, then a kernel refused it after
    messages were sent (one rank raised, the others hung)."""
    comm, rank, p = _world()
    x = _misaligned(n, dtype)
    x[:] = (np.arange(n) % 7 + rank).astype(dtype)
    want = sum((np.arange(n) % 7 + r).astype(dtype) for r in range(p)).astype(dtype)
    np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm, algorithm=algorithm), want)
    out = _misaligned(n, dtype, offset=3 if np.dtype(dtype).itemsize > 2 else 1)
    assert mpicoll.allreduce(x, comm=comm, algorithm=algorithm, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm, algorithm=algorithm, out=x), want)  # in place
    assert_identical_everywhere(comm, out)
    x[:] = (np.arange(n) % 7 + rank).astype(dtype)
    got = mpicoll.reduce(x, comm=comm, root=0, out=out if rank == 0 else None)
    if rank == 0:
        assert got is out
        np.testing.assert_array_equal(out, want)
    rs = _misaligned(np.array_split(np.arange(n), p)[rank].size, dtype)
    mpicoll.reduce_scatter(x, comm=comm, out=rs)
    np.testing.assert_array_equal(rs, np.array_split(want, p)[rank])


# ---- bcast into a strided buffer, a read-only out ------------------------------------

@pytest.mark.mpi
def test_bcast_into_strided_memoryview_is_refused():
    """It used to receive into a private copy: the data never reached x."""
    comm, rank, p = _world()
    backing = np.zeros(8)
    with pytest.raises(ValueError, match="C-contiguous"):
        mpicoll.bcast(memoryview(backing)[::2], comm=comm)
    x = np.arange(4.0) if rank == 0 else np.zeros(4)
    mpicoll.bcast(memoryview(x), comm=comm)  # a contiguous memoryview is x itself
    assert np.array_equal(x, np.arange(4.0))


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["auto", "mpi", "ring"])
def test_out_made_read_only_after_first_call(algorithm):
    """The cached plan's short path wrote into it anyway."""
    comm, rank, p = _world()
    x = np.full(4, rank + 1.0)
    out = np.empty(4)
    mpicoll.allreduce(x, comm=comm, out=out, algorithm=algorithm)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        mpicoll.allreduce(x, comm=comm, out=out, algorithm=algorithm)
    assert np.all(out == p * (p + 1) / 2)


@pytest.mark.mpi
def test_dropin_recvbuf_made_read_only_after_first_call():
    """mpicoll.Comm's short path kept a flat view of a 2-D recvbuf, which
    stays writable when recvbuf itself is made read-only."""
    comm, rank, p = _world()
    dcomm = mpicoll.Comm(comm)
    x = np.full((2, 2), rank + 1.0)
    y = np.empty((2, 2))
    dcomm.Allreduce(x, y, MPI.SUM)
    dcomm.Allreduce(x, y, MPI.SUM)  # the short path
    y[...] = -1.0
    y.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        dcomm.Allreduce(x, y, MPI.SUM)
    assert np.all(y == -1.0)


# ---- NaN in min/max ---------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGS)
@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_nan_min_max_propagate_with_the_same_bits(algorithm, op, dtype):
    """MPI's MIN/MAX keep or drop a NaN depending on operand order: auto and
    mpi gave 5.0 where numpy gives nan, and ranks could disagree. Signed
    zeros are the other order-dependent tie."""
    comm, rank, p = _world()
    base = np.array([np.nan, 5.0, -0.0, 0.0, 1.0, np.nan], dtype)
    x = np.roll(base, rank)  # each rank has its NaNs and zeros elsewhere
    every = [np.roll(base, r) for r in range(p)]
    want = every[0]
    fn = np.minimum if op == "min" else np.maximum
    for other in every[1:]:
        want = fn(want, other)
    got = mpicoll.allreduce(x, op, comm=comm, algorithm=algorithm)
    np.testing.assert_array_equal(got, want)  # NaN where numpy has NaN
    assert_identical_everywhere(comm, got, what=f"{algorithm} {op} {dtype}")
    got = mpicoll.reduce_scatter(np.tile(x, p), op, comm=comm)
    np.testing.assert_array_equal(got, want)
    got = mpicoll.reduce(x, op, comm=comm, root=0)
    if rank == 0:
        np.testing.assert_array_equal(got, want)
    mpi = np.empty_like(x)
    mpicoll.Comm(comm).Allreduce(x, mpi, MPI.MIN if op == "min" else MPI.MAX)
    np.testing.assert_array_equal(mpi, want)
    assert_identical_everywhere(comm, mpi, what=f"Comm.Allreduce {op} {dtype}")


# ---- two threads on one communicator ------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_second_thread_on_a_busy_communicator_gets_a_clear_error(algorithm):
    """Two threads sharing a communicator gave silently wrong sums; now the
    second one raises at once, and the first one's call completes."""
    comm, rank, p = _world()
    if p < 2:
        pytest.skip("needs a second rank to keep the first call waiting")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("MPI_THREAD_MULTIPLE not provided")
    work = comm.Dup()
    side = comm.Dup()  # the go-ahead travels here, not on `work`
    x = np.full(16, rank + 1.0)
    mpicoll.allreduce(x, comm=work, algorithm=algorithm)  # state created, outside the race
    results = {}
    if rank == 0:
        def first():
            results["first"] = mpicoll.allreduce(x, comm=work, algorithm=algorithm)

        t = threading.Thread(target=first)
        t.start()
        st = _comm.state(work)
        t_end = time.monotonic() + 30
        while not st.busy.locked() and time.monotonic() < t_end:  # the first call is inside
            time.sleep(0.001)
        try:
            with pytest.raises(RuntimeError, match="another thread"):
                mpicoll.allreduce(x, comm=work, algorithm=algorithm, timeout=10)
        finally:
            side.Barrier()  # let the other ranks join the first call
            t.join()
        got = results["first"]
    else:
        side.Barrier()
        got = mpicoll.allreduce(x, comm=work, algorithm=algorithm)
    assert np.all(got == p * (p + 1) / 2)
    work.Free()
    side.Free()
