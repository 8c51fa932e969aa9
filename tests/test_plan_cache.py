"""The per-communicator plan cache (mpicoll/plancache.py): a repeated call
of one signature - on the same arrays or on new ones - is served by the
kept decision without building a plan, gives the same results as the full
path, keeps no user array alive or exported, and falls back to the full
path (with its errors) whenever the kept call cannot serve it exactly."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import api, plancache
from mpicoll import plan as _plan
from mpicoll.comm import state

pytestmark = pytest.mark.mpi


@pytest.fixture
def comm():
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()


@pytest.fixture
def builds(monkeypatch):
    """Counts of full-path plan builds per collective."""
    counts = {}
    for name in ("allreduce", "bcast", "reduce", "allgather", "scatter", "gather", "alltoall"):
        real = getattr(_plan, name)

        def counting(*args, _real=real, _name=name, **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kw)
        monkeypatch.setattr(_plan, name, counting)
    return counts


def test_new_arrays_hit_the_kept_plan(comm, builds):
    p, r = comm.size, comm.rank
    for i in range(5):
        x = np.full(7, r + i, np.float64)
        np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm), np.full(7, p * (p - 1) / 2 + p * i))
        # (integers: the MPI library's own MAX/MIN; for floats mpicoll's NaN
        # rule decides, with its own algorithms)
        out = np.empty(7, np.int64)
        assert mpicoll.allreduce(x.astype(np.int64), "max", comm=comm, out=out) is out
        assert (out == p - 1 + i).all()
        y = x.astype(np.int64)
        assert mpicoll.allreduce(y, "min", comm=comm, out=y) is y and (y == i).all()
        b = np.arange(5, dtype=np.int32) * (i + 1) if r == 0 else np.zeros(5, np.int32)
        mpicoll.bcast(b, comm=comm)
        assert (b == np.arange(5) * (i + 1)).all()
        got = mpicoll.reduce(np.full(3, r + 1, np.int64), "sum", root=p - 1, comm=comm)
        if r == p - 1:
            assert (got == p * (p + 1) // 2).all()
        else:
            assert got is None
        rows = mpicoll.allgather(np.full((2, 2), r + i, np.int16), comm=comm)
        assert rows.shape == (p, 2, 2) and all((rows[k] == k + i).all() for k in range(p))
    # One full build per signature, then hits (the MPI library's algorithm
    # is what "auto" picks for these sizes, or a copy on one rank).
    assert builds == {"allreduce": 3, "bcast": 1, "reduce": 1, "allgather": 1}, builds


def test_kept_plans_keep_no_array_alive(comm):
    x = np.ones(16, np.float32)
    out = np.empty_like(x)
    mpicoll.allreduce(x, comm=comm, out=out)
    mpicoll.allreduce(x, comm=comm, out=out)
    ref = weakref.ref(x)
    out.resize(32, refcheck=False)  # not exported: numpy refuses to resize an exported array
    del x
    gc.collect()
    assert ref() is None


def test_lru_bound_and_order(comm, monkeypatch):
    st = state(comm)
    monkeypatch.setattr(st.plans, "size", 8)
    for n in range(1, 21):
        mpicoll.allreduce(np.ones(n), comm=comm)
    assert len(st.plans) == 8
    keys = [("allreduce", (n,), np.dtype(np.float64), "sum", "auto", 0) for n in range(1, 21)]
    assert [k in st.plans for k in keys] == [False] * 12 + [True] * 8
    mpicoll.allreduce(np.ones(13), comm=comm)  # used again: now the most recent
    mpicoll.allreduce(np.ones(99), comm=comm)  # evicts the least recently used, 14
    assert keys[12] in st.plans and keys[13] not in st.plans


def test_layouts_a_kept_call_cannot_serve_take_the_full_path(comm):
    p, r = comm.size, comm.rank
    x = np.full(8, r + 1.0)
    mpicoll.allreduce(x, comm=comm, out=np.empty(8))  # kept: 8 float64, another out
    strided = np.full(16, r + 1.0)[::2]
    np.testing.assert_array_equal(mpicoll.allreduce(strided, comm=comm, out=np.empty(8)),
                                  np.full(8, p * (p + 1) / 2))
    ro = np.empty(8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        mpicoll.allreduce(x, comm=comm, out=ro)
    big = np.zeros(12)
    with pytest.raises(ValueError, match="overlap"):
        mpicoll.allreduce(big[:8], comm=comm, out=big[4:])
    same = np.full(8, r + 1.0)
    view = same[:]  # another object over the same memory: in place
    np.testing.assert_array_equal(mpicoll.allreduce(same, comm=comm, out=view), np.full(8, p * (p + 1) / 2))
    mpicoll.allreduce(x, comm=comm, out=np.empty(8))  # still fine afterwards


def test_a_changed_environment_is_seen(comm, monkeypatch):
    x = np.ones(4)
    mpicoll.allreduce(x, comm=comm)
    mpicoll.allreduce(x, comm=comm)
    monkeypatch.setenv("MPICOLL_ALGORITHM", "nonsense")
    with pytest.raises(ValueError, match="MPICOLL_ALGORITHM"):
        mpicoll.allreduce(x, comm=comm)
    monkeypatch.setenv("MPICOLL_ALGORITHM", "ring")
    np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm), np.full(4, comm.size))


def test_dropin_allreduce_hits_with_new_arrays(comm, builds):
    mc = mpicoll.Comm(comm)
    for i in range(4):
        s = np.full((3, 2), comm.rank + i, np.int32)
        rbuf = np.empty((3, 2), np.int32)
        mc.Allreduce(s, rbuf, MPI.SUM)
        assert (rbuf == comm.size * (comm.size - 1) // 2 + comm.size * i).all()
        mc.Allreduce(MPI.IN_PLACE, s, MPI.MAX)
        assert (s == comm.size - 1 + i).all()
        b = np.full(4, i if comm.rank == 0 else -1, np.float32)
        mc.Bcast(b, 0)
        assert (b == i).all()
        rows = np.empty(2 * comm.size, np.int64)
        mc.Allgather(np.array([comm.rank, i], np.int64), rows)
        assert (rows.reshape(-1, 2) == [[k, i] for k in range(comm.size)]).all()
    assert builds == {"allreduce": 2, "bcast": 1, "allgather": 1}, builds


def test_freed_communicator_does_not_reuse_kept_plans():
    for i in range(3):
        c = MPI.COMM_WORLD.Dup()
        x = np.full(5, float(i))
        np.testing.assert_array_equal(mpicoll.allreduce(x, comm=c), np.full(5, i * c.size))
        st = state(c)
        assert len(st.plans) == 1
        c.Free()
        assert st.freed and len(st.plans) == 0


def test_miss_marker_is_not_none():
    # reduce's non-root ranks return None from a hit: the marker must differ.
    assert plancache.MISS is not None and api._MISS is plancache.MISS


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "tree", "rabenseifner"])
def test_every_algorithm_and_form_hits_with_new_arrays(comm, builds, algorithm):
    p, r = comm.size, comm.rank
    for i in range(4):
        for n in (0, 1, 7, 1000):
            x = np.arange(n, dtype=np.float32) + r + i
            want = np.arange(n, dtype=np.float32) * p + p * (p - 1) / 2 + p * i
            np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm, algorithm=algorithm), want)
            np.testing.assert_array_equal(mpicoll.iallreduce(x, comm=comm, algorithm=algorithm).wait(), want)
            y = x.copy()
            assert mpicoll.iallreduce(y, "avg", comm=comm, out=y, algorithm=algorithm).wait() is y
            np.testing.assert_allclose(y, want / p, rtol=1e-6)
    # one build per signature (n, op, in place or not), shared by both forms
    assert builds["allreduce"] == 8, builds


def test_data_movement_doors_hit_with_new_arrays(comm, builds):
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    root = p - 1
    for i in range(4):
        full = np.arange(p * 3, dtype=np.int32).reshape(p, 3) + i
        got = mpicoll.scatter(full if r == root else None, root, comm=comm, out=np.empty(3, np.int32))
        assert (got == full[r]).all()
        assert (mpicoll.scatter(full, root, comm=comm) == full[r]).all()
        g = mpicoll.gather(np.full(2, r + i, np.int64), root, comm=comm)
        if r == root:
            assert (g == [[k + i] * 2 for k in range(p)]).all()
        else:
            assert g is None
        send = np.array([[r * 100 + j + i] for j in range(p)], np.float64)
        assert (mpicoll.alltoall(send, comm=comm) == [[j * 100 + r + i] for j in range(p)]).all()
        # mpicoll.Comm's methods over plain arrays take the same doors
        rb = np.empty(3, np.int32)
        mc.Scatter(full.reshape(-1) if r == root else None, rb, root)
        assert (rb == full[r]).all()
        gb = np.empty(2 * p, np.int64) if r == root else None
        mc.Gather(np.full(2, r + i, np.int64), gb, root)
        if r == root:
            assert (gb == np.repeat(np.arange(p) + i, 2)).all()
        out = np.empty(p, np.float64)
        mc.Alltoall(send.reshape(-1), out)
        assert (out == [j * 100 + r + i for j in range(p)]).all()
    # one build per signature: scatter with and without out; gather with and
    # without out on root (the others pass no out either way); alltoall
    # shaped (p, 1) and (p, 1) again from Comm.Alltoall's flat buffers, once
    # with out and once without
    assert builds == {"scatter": 2, "gather": 2 if r == root else 1, "alltoall": 2}, builds


def test_nonblocking_forms_share_the_kept_decisions(comm, builds):
    p, r = comm.size, comm.rank
    root = p // 2
    for i in range(3):
        for nb in (False, True):
            def go(fn, *args, **kw):
                if nb:
                    return getattr(mpicoll, "i" + fn)(*args, comm=comm, **kw).wait()
                return getattr(mpicoll, fn)(*args, comm=comm, **kw)
            b = np.full(3, i if r == root else -1, np.int64)
            assert go("bcast", b, root) is b and (b == i).all()
            got = go("reduce", np.full(4, r + i, np.float32), "avg", root)
            if r == root:
                np.testing.assert_allclose(got, np.full(4, (p - 1) / 2 + i))
            else:
                assert got is None
            rows = go("allgather", np.array([r, i], np.int8))
            assert (rows == [[k, i] for k in range(p)]).all()
            full = np.arange(2 * p, dtype=np.uint16).reshape(p, 2) + i
            assert (go("scatter", full, root) == full[r]).all()
            g = go("gather", np.full(1, r * i, np.int32), root)
            assert (g.ravel() == np.arange(p) * i).all() if r == root else g is None
            send = np.array([[r * 10 + j + i] for j in range(p)], np.int64)
            assert (go("alltoall", send) == [[j * 10 + r + i] for j in range(p)]).all()
    assert builds == {"bcast": 1, "reduce": 1, "allgather": 1, "scatter": 1, "gather": 1, "alltoall": 1}, builds
