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
from mpicoll.commstate import state

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("kept_calls")]


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


def test_lru_order_holds_when_the_doors_in_c_skip_the_look_up(comm, monkeypatch, kept_calls):
    """A door in C repeating its last hit skips the look-up and the move to
    the end while the cache's version is unchanged (csrc/native.c
    door_run); any other use of the cache changes the version, so the order
    stays least-recently-used: the signature a door serves again and again
    is never the one evicted, and a use through another door (or the Python
    path) between its calls puts it back through the full path."""
    st = state(comm)
    monkeypatch.setattr(st.plans, "size", 4)
    st.plans.clear()
    hot = np.ones(3)
    keys = [("allreduce", (n,), np.dtype(np.float64), "sum", "auto", 0) for n in range(1, 10)]
    for _ in range(4):
        mpicoll.allreduce(hot, comm=comm)  # kept, gated, then served from the door's memo
    v = st.plans.version
    for _ in range(5):
        mpicoll.allreduce(hot, comm=comm)
    in_c = kept_calls == "native" and comm.size > 1 and hasattr(mpicoll.allreduce, "fallbacks")
    assert (st.plans.version == v) == in_c, "the repeated hit went through the look-up"
    for n in (1, 2, 4, 5, 6):  # new signatures, each used twice: 3 is used in between
        mpicoll.allreduce(np.ones(n), comm=comm)
        mpicoll.allreduce(hot, comm=comm)
        assert keys[2] in st.plans, n
        mpicoll.allreduce(np.ones(n), comm=comm)
    assert list(st.plans._d)[-1] == keys[5]
    mpicoll.allreduce(hot, comm=comm)
    assert list(st.plans._d)[-1] == keys[2], "a hit after another door's use is not the most recent"
    # another door's hits (bcast's, in C or in Python) move its entry and
    # change the version, so the next all-reduce moves its own back
    b = np.ones(2)
    for _ in range(4):
        mpicoll.bcast(b, 0, comm=comm)
    assert list(st.plans._d)[-1][0] == "bcast"
    mpicoll.allreduce(hot, comm=comm)
    assert list(st.plans._d)[-1] == keys[2]
    comm.Barrier()


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
    # one build per signature (n, op, in place or not) and form: blocking and
    # nonblocking calls keep their own decisions (select: shm's C path is
    # blocking only)
    assert builds["allreduce"] == 12, builds


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


# ---- the v-forms and reduce_scatter ----------------------------------------------------

def _blocks(counts):
    ends = np.cumsum([0] + list(counts))
    return [(int(ends[i]), int(ends[i + 1])) for i in range(len(counts))]


def _count_sets(p):
    """Awkward counts: zeros, fewer elements than ranks, not divisible by p."""
    return [[0] * p, [k % 2 for k in range(p)], [(k * 5 + 3) % 4 for k in range(p)], [2 * p + 1] + [1] * (p - 1)]


@pytest.mark.parametrize("nonblocking", [False, True])
def test_reduce_scatter_kept_against_numpy(comm, builds, nonblocking):
    p, r = comm.size, comm.rank

    def go(*args, **kw):
        if nonblocking:
            return mpicoll.ireduce_scatter(*args, comm=comm, **kw).wait()
        return mpicoll.reduce_scatter(*args, comm=comm, **kw)

    for i in range(3):
        for n in (0, max(p - 1, 1), 2 * p + 1):  # none, fewer than p, not divisible by p
            x = np.arange(n, dtype=np.float64) + r + i
            total = np.arange(n, dtype=np.float64) * p + p * (p - 1) / 2 + p * i
            a, b = _blocks([len(c) for c in np.array_split(np.empty(n), p)])[r]
            np.testing.assert_array_equal(go(x), total[a:b])
            out = np.empty(b - a)
            assert go(x, "avg", out=out) is out
            np.testing.assert_allclose(out, total[a:b] / p, rtol=1e-12)
        for counts in _count_sets(p):
            n = sum(counts)
            a, b = _blocks(counts)[r]
            xi = (np.arange(n) % 7 + r * i).astype(np.int32)
            np.testing.assert_array_equal(go(xi, "max", counts=counts), (np.arange(n) % 7 + (p - 1) * i)[a:b])
            # out inside x (the drop-in's in place): the result lands in out
            big = (np.arange(n) + r).astype(np.int64)
            view = big[:b - a]
            want = (np.arange(n) * p + p * (p - 1) // 2)[a:b]
            assert go(big, counts=counts, out=view) is view
            np.testing.assert_array_equal(view, want)
    # p == 1: a copy, kept too; else the MPI library's call for these sizes.
    # One build per signature: (3 sizes x 2 forms) + (4 count sets x 2 forms), fewer where sets coincide
    sets = {tuple(c) for c in _count_sets(p)}
    assert builds == {"reduce_scatter": 3 * 2 + 2 * len(sets)}, builds


def test_reduce_scatter_other_dtypes(comm):
    p, r = comm.size, comm.rank
    for dt in (np.float32, np.float16, np.int8, np.uint64):
        for _ in range(2):
            x = (np.arange(3 * p + 2) % 5 + r).astype(dt)
            a, b = _blocks([len(c) for c in np.array_split(x, p)])[r]
            want = sum((np.arange(3 * p + 2) % 5 + k).astype(dt) for k in range(p)).astype(dt)
            np.testing.assert_array_equal(mpicoll.reduce_scatter(x, comm=comm), want[a:b])


@pytest.mark.parametrize("nonblocking", [False, True])
def test_allgatherv_kept_against_numpy(comm, builds, nonblocking):
    p, r = comm.size, comm.rank

    def go(*args, **kw):
        if nonblocking:
            return mpicoll.iallgatherv(*args, comm=comm, **kw).wait()
        return mpicoll.allgatherv(*args, comm=comm, **kw)

    for i in range(3):
        for counts in _count_sets(p):
            blocks = _blocks(counts)
            want = np.concatenate([np.arange(c, dtype=np.int16) + 10 * k + i for k, c in enumerate(counts)])
            x = np.arange(counts[r], dtype=np.int16) + 10 * r + i
            np.testing.assert_array_equal(go(x, counts), want)
            out = np.empty(sum(counts), np.int16)
            assert go(x, counts, out=out) is out
            np.testing.assert_array_equal(out, want)
            # in place: x is this rank's block of out
            a, b = blocks[r]
            out2 = np.zeros(sum(counts), np.int16)
            out2[a:b] = x
            assert go(out2[a:b], counts, out=out2) is out2
            np.testing.assert_array_equal(out2, want)
    sets = {tuple(c) for c in _count_sets(p)}
    assert builds == {"allgatherv": 2 * len(sets)}, builds


@pytest.mark.parametrize("nonblocking", [False, True])
def test_alltoallv_kept_against_numpy(comm, builds, nonblocking):
    p, r = comm.size, comm.rank

    def go(*args, **kw):
        if nonblocking:
            return mpicoll.ialltoallv(*args, comm=comm, **kw).wait()
        return mpicoll.alltoallv(*args, comm=comm, **kw)

    def f(a, b):  # elements rank a sends to rank b; symmetric, so in place works (equal totals)
        return (a + b) % 3

    sc = [f(r, j) for j in range(p)]
    rc = [f(j, r) for j in range(p)]
    for i in range(3):
        x = np.concatenate([np.full(f(r, j), 100 * r + j + i, np.float32) for j in range(p)])
        want = np.concatenate([np.full(f(j, r), 100 * j + r + i, np.float32) for j in range(p)])
        np.testing.assert_array_equal(go(x, sc, rc), want)
        out = np.empty(sum(rc), np.float32)
        assert go(x, sc, rc, out=out) is out
        np.testing.assert_array_equal(out, want)
        y = x.copy()
        assert go(y, sc, rc, out=y) is y
        np.testing.assert_array_equal(y, want)
        z = np.arange(p, dtype=np.int64) + r  # one element to each rank (a numpy counts vector)
        ones = np.ones(p, np.int64)
        np.testing.assert_array_equal(go(z, ones, ones), np.arange(p) + r)
    # no out; out given (x itself or another array: one signature); the int64 call
    assert builds == {"alltoallv": 3}, builds


@pytest.mark.parametrize("nonblocking", [False, True])
def test_scatterv_gatherv_kept_against_numpy(comm, builds, nonblocking):
    p, r = comm.size, comm.rank
    root = p - 1
    ns = "i" if nonblocking else ""

    def go(fn, *args, **kw):
        res = getattr(mpicoll, ns + fn)(*args, comm=comm, **kw)
        return res.wait() if nonblocking else res

    for i in range(3):
        for counts in _count_sets(p):
            a, b = _blocks(counts)[r]
            full = np.arange(sum(counts), dtype=np.float64) * (i + 1)
            got = go("scatter", full if r == root else None, root, counts=counts, out=np.empty(counts[r]))
            np.testing.assert_array_equal(got, full[a:b])
            np.testing.assert_array_equal(go("scatter", full, root, counts=counts), full[a:b])
            g = go("gather", full[a:b].copy(), root, counts=counts)
            if r == root:
                np.testing.assert_array_equal(g, full)
            else:
                assert g is None
            if r == root:  # in place on root: x is root's block of out / out is root's block of x
                buf = np.zeros(sum(counts))
                buf[a:b] = full[a:b]
                assert go("gather", buf[a:b], root, counts=counts, out=buf) is buf
                np.testing.assert_array_equal(buf, full)
                f2 = full.copy()
                go("scatter", f2, root, counts=counts, out=f2[a:b])
                np.testing.assert_array_equal(f2, full)
            else:
                go("gather", full[a:b].copy(), root, counts=counts, out=np.empty(sum(counts)))
                go("scatter", None, root, counts=counts, out=np.empty(counts[r]))
    sets = len({tuple(c) for c in _count_sets(p)})
    # scatter: out given / not (root's in-place call has the signature of its
    # first: the kept entry serves it); gather: out given / not, in place too
    assert builds == {"scatter": 2 * sets, "gather": 2 * sets}, builds


def test_a_changed_counts_vector_misses(comm, builds):
    p, r = comm.size, comm.rank
    if p == 1:
        pytest.skip("one rank has one counts vector of a given total")
    a = [1] * p
    b = [2] + [1] * (p - 2) + [0]  # the same total, another split
    for _ in range(2):
        for counts in (a, b):
            x = np.full(counts[r], r, np.int32)
            want = np.repeat(np.arange(p, dtype=np.int32), counts)
            np.testing.assert_array_equal(mpicoll.allgatherv(x, counts, comm=comm), want)
            y = np.arange(p, dtype=np.float64) + r
            lo, hi = _blocks(counts)[r]
            np.testing.assert_array_equal(mpicoll.reduce_scatter(y, counts=counts, comm=comm),
                                          (np.arange(p) * p + p * (p - 1) / 2)[lo:hi])
    assert builds == {"allgatherv": 2, "reduce_scatter": 2}, builds
    st = state(comm)
    assert ("allgatherv", (1,), np.dtype(np.int32), tuple(a), "auto", 0) in st.plans


def test_v_forms_keep_no_array_alive(comm):
    p = comm.size
    counts = [2] * p
    for _ in range(2):
        x = np.ones(2 * p)
        out = np.empty(2)
        mpicoll.reduce_scatter(x, counts=counts, comm=comm, out=out)
        g = np.empty(2 * p)
        mpicoll.allgatherv(np.ones(2), counts, comm=comm, out=g)
        t = np.empty(2 * p)
        mpicoll.ialltoallv(x, counts, counts, comm=comm, out=t).wait()
    for a in (out, g, t):
        a.resize(4 * p, refcheck=False)  # numpy refuses to resize an exported array
    refs = [weakref.ref(a) for a in (x, out, g, t)]
    del x, out, g, t, a
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_v_forms_see_a_changed_environment(comm, monkeypatch):
    p = comm.size
    counts = [1] * p
    for _ in range(2):
        mpicoll.allgatherv(np.ones(1), counts, comm=comm)
        mpicoll.reduce_scatter(np.ones(p), comm=comm)
    monkeypatch.setenv("MPICOLL_ALGORITHM", "nonsense")
    with pytest.raises(ValueError, match="MPICOLL_ALGORITHM"):
        mpicoll.allgatherv(np.ones(1), counts, comm=comm)
    with pytest.raises(ValueError, match="MPICOLL_ALGORITHM"):
        mpicoll.reduce_scatter(np.ones(p), comm=comm)
    monkeypatch.setenv("MPICOLL_ALGORITHM", "ring")
    np.testing.assert_array_equal(mpicoll.allgatherv(np.ones(1), counts, comm=comm), np.ones(p))
    np.testing.assert_array_equal(mpicoll.reduce_scatter(np.ones(p), comm=comm), np.full(1, p))


def test_v_form_bad_counts_still_raise_after_a_hit(comm):
    p = comm.size
    counts = [1] * p
    for _ in range(2):
        mpicoll.allgatherv(np.ones(1), counts, comm=comm)
    with pytest.raises(TypeError, match="counts"):
        mpicoll.allgatherv(np.ones(1), [1.0] * p, comm=comm)
    with pytest.raises(ValueError, match="counts"):
        mpicoll.allgatherv(np.ones(2), counts, comm=comm)


def test_v_form_entries_are_bounded_least_recently_used(comm, monkeypatch, builds):
    p, r = comm.size, comm.rank
    st = state(comm)
    monkeypatch.setattr(st.plans, "size", 4)
    vectors = [[k] + [1] * (p - 1) for k in range(6)]  # six signatures of one collective

    def call(counts):
        got = mpicoll.allgatherv(np.full(counts[r], r, np.int64), counts, comm=comm)
        np.testing.assert_array_equal(got, np.repeat(np.arange(p), counts))

    for counts in vectors:
        call(counts)
    keys = [("allgatherv", (c[r],), np.dtype(np.int64), tuple(c), "auto", 0) for c in vectors]
    assert len(st.plans) == 4 and [k in st.plans for k in keys] == [False] * 2 + [True] * 4
    call(vectors[2])  # used again: now the most recent
    call(vectors[0])  # built again, evicting the least recently used, vectors[3]
    assert keys[2] in st.plans and keys[0] in st.plans and keys[3] not in st.plans
    assert builds == {"allgatherv": 7}, builds


@pytest.mark.parametrize("nonblocking", [False, True])
def test_calls_with_keyword_options_hit_the_kept_plan(comm, builds, nonblocking):
    """A ``dtype=`` name (how torch's backend passes bfloat16 tensors),
    ``check=False`` and options spelled at their defaults are part of the
    signature, not a reason to build a plan on every call; the options a
    kept plan cannot serve (a deadline) still build each time."""
    from mpicoll import kernels

    p, r = comm.size, comm.rank

    def run(x, **kw):
        if nonblocking:
            return mpicoll.iallreduce(x, comm=comm, **kw).wait()
        return mpicoll.allreduce(x, comm=comm, **kw)

    for i in range(4):
        x = np.full(5, r + i, np.float32)
        want = np.full(5, p * (p - 1) / 2 + p * i, np.float32)
        np.testing.assert_array_equal(run(x, dtype="float32"), want)
        np.testing.assert_array_equal(run(x, check=False), want)
        np.testing.assert_array_equal(run(x, dtype=None, check=None, timeout=None, compression=None,
                                          reproducible=False), want)
        # bfloat16 over uint16 storage: a signature of its own, with its own reduction
        bits = kernels.f32_to_bf16(x)
        got = run(bits, dtype="bfloat16")
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(kernels.bf16_to_f32(got), want)
        # the same storage without the dtype name is a uint16 sum: another signature
        raw = sum(kernels.f32_to_bf16(np.full(5, q + i, np.float32)).astype(np.int64) for q in range(p))
        np.testing.assert_array_equal(run(bits), (raw % 65536).astype(np.uint16))
        np.testing.assert_array_equal(run(x, timeout=30.0), want)
    # float32 with dtype="float32", with check=False, with the defaults (= no
    # options), bfloat16, uint16: one build each; the deadline call every time
    assert builds["allreduce"] == 5 + 4, builds
