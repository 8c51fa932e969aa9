"""mpicoll.Comm's v-form and reduction methods on the plan cache: after a
first call of each signature, repeated calls on *new* arrays (plain numpy
arrays, ``[array, counts]`` specs, MPI.IN_PLACE) are served by the kept
entry without building a plan, in every mode, with mpi4py's own results."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("kept_calls")]

def _counts(p):
    """Zeros, fewer elements than ranks, a total not divisible by p."""
    return [(k * 5 + 3) % 4 for k in range(p)]


def _calls(mc, comm, i):
    """(name, run on mc, run on comm): each makes new arrays and returns what
    it received, so that mpicoll's and mpi4py's results can be compared."""
    p, r = comm.size, comm.rank
    root = p - 1
    counts = _counts(p)
    total = sum(counts)
    sc = [(r + j) % 3 for j in range(p)]
    rc = [(j + r) % 3 for j in range(p)]

    def allgatherv(c):
        g = np.zeros(total, np.float64)
        c.Allgatherv(np.full(counts[r], r + i, np.float64), [g, counts])
        return g

    def allgatherv_in_place(c):
        g = np.zeros(total, np.float64)
        a = sum(counts[:r])
        g[a:a + counts[r]] = r * i
        c.Allgatherv(MPI.IN_PLACE, [g, counts])
        return g

    def iallgatherv(c):
        g = np.zeros(total, np.int32)
        c.Iallgatherv(np.full(counts[r], r - i, np.int32), [g, counts]).Wait()
        return g

    def alltoallv(c):
        x = np.concatenate([np.full(sc[j], 10 * r + j + i, np.int64) for j in range(p)])
        g = np.zeros(sum(rc), np.int64)
        c.Alltoallv([x, sc], [g, rc])
        return g

    def ialltoallv(c):
        x = np.concatenate([np.full(sc[j], 10 * r + j - i, np.float32) for j in range(p)])
        g = np.zeros(sum(rc), np.float32)
        c.Ialltoallv([x, sc], [g, rc]).Wait()
        return g

    def gatherv(c):
        g = np.zeros(total, np.int16) if r == root else None
        c.Gatherv(np.full(counts[r], r + i, np.int16), [g, counts] if r == root else None, root)
        return g

    def gatherv_in_place(c):
        if r != root:
            c.Gatherv(np.full(counts[r], r + i, np.int16), None, root)
            return None
        g = np.zeros(total, np.int16)
        a = sum(counts[:r])
        g[a:a + counts[r]] = r + i
        c.Gatherv(MPI.IN_PLACE, [g, counts], root)
        return g

    def igatherv(c):
        g = np.zeros(total, np.float64) if r == root else None
        c.Igatherv(np.full(counts[r], r * i, np.float64), [g, counts] if r == root else None, root).Wait()
        return g

    def scatterv(c):
        full = np.arange(total, dtype=np.float64) + i if r == root else None
        y = np.zeros(counts[r], np.float64)
        c.Scatterv([full, counts] if r == root else None, y, root)
        return y

    def iscatterv(c):
        full = np.arange(total, dtype=np.int32) - i if r == root else None
        y = np.zeros(counts[r], np.int32)
        c.Iscatterv([full, counts] if r == root else None, y, root).Wait()
        return y

    def reduce_scatter(c):
        y = np.zeros(counts[r], np.float64)
        c.Reduce_scatter(np.arange(total, dtype=np.float64) + r + i, y, counts, MPI.SUM)
        return y

    def reduce_scatter_in_place(c):
        y = np.arange(total, dtype=np.int32) * (r + 1) + i
        c.Reduce_scatter(MPI.IN_PLACE, y, counts, MPI.MAX)
        return y[:counts[r]]

    def ireduce_scatter(c):
        y = np.zeros(counts[r], np.int64)
        c.Ireduce_scatter(np.arange(total, dtype=np.int64) * r - i, y, counts, MPI.SUM).Wait()
        return y

    def reduce_scatter_block(c):
        y = np.zeros(3, np.float32)
        c.Reduce_scatter_block(np.arange(3 * p, dtype=np.float32) + r * i, y, MPI.SUM)
        return y

    def reduce_scatter_block_in_place(c):
        y = np.arange(3 * p, dtype=np.int32) + r * i
        c.Reduce_scatter_block(MPI.IN_PLACE, y, MPI.MIN)
        return y[:3]

    def ireduce_scatter_block(c):
        y = np.zeros(2, np.float64)
        c.Ireduce_scatter_block(np.arange(2 * p, dtype=np.float64) - r + i, y, MPI.SUM).Wait()
        return y

    def reduce(c):
        y = np.zeros(5, np.float64) if r == root else None
        c.Reduce(np.arange(5, dtype=np.float64) + r + i, y, MPI.SUM, root)
        return y

    def reduce_in_place(c):
        y = np.arange(5, dtype=np.int64) * (r + 1) + i
        c.Reduce(MPI.IN_PLACE if r == root else y, y if r == root else None, MPI.MAX, root)
        return y if r == root else None

    def ireduce(c):
        y = np.zeros(4, np.int32) if r == root else None
        c.Ireduce(np.arange(4, dtype=np.int32) * r + i, y, MPI.PROD, root).Wait()
        return y

    return [(f.__name__, f) for f in (allgatherv, allgatherv_in_place, iallgatherv, alltoallv, ialltoallv, gatherv,
                                      gatherv_in_place, igatherv, scatterv, iscatterv, reduce_scatter,
                                      reduce_scatter_in_place, ireduce_scatter, reduce_scatter_block,
                                      reduce_scatter_block_in_place, ireduce_scatter_block, reduce, reduce_in_place,
                                      ireduce)]


def test_dropin_v_forms_and_reductions_hit_with_new_arrays(comm, builds):
    mc = mpicoll.Comm(comm)
    after_first = None
    for i in range(3):
        for name, call in _calls(mc, comm, i):
            got = call(mc)
            want = call(comm)  # mpi4py's own method on the plain communicator
            if want is None:
                assert got is None, name
            else:
                np.testing.assert_array_equal(got, want, err_msg=name)
        if i == 0:
            after_first = dict(builds)
    # every later round: new arrays, the same signatures, no plan built
    assert builds == after_first, (after_first, builds)
    assert set(builds) <= {"reduce", "reduce_scatter", "scatter", "gather", "allgatherv", "alltoallv"}, builds


def test_dropin_changed_counts_miss(comm, builds):
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    for counts in ([1] * p, [p] + [0] * (p - 1), [1] * p):
        g = np.zeros(sum(counts), np.int64)
        mc.Allgatherv(np.full(counts[r], r, np.int64), [g, counts])
        np.testing.assert_array_equal(g, np.repeat(np.arange(p), counts))
    assert builds == {"allgatherv": 1 if p == 1 else 2}, builds


def test_dropin_packed_layouts_still_build(comm, builds):
    """A layout packed on this rank (displacements with gaps) is not a plain
    call: it builds its plan (and is still right)."""
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    for _ in range(2):
        g = np.full(2 * p, -1, np.int32)
        mc.Allgatherv(np.full(1, r, np.int32), [g, ([1] * p, [2 * k + 1 for k in range(p)]), MPI.INT])
        assert (g[1::2] == np.arange(p)).all() and (g[::2] == -1).all()
    assert builds == {"allgatherv": 2}, builds


def _typed(a, counts=None):
    """The same buffer as an explicit mpi4py spec, which mpicoll.Comm parses
    on its general path (plain arrays take the fast path)."""
    t = MPI._typedict[a.dtype.char]
    return [a, t] if counts is None else [a, counts, t]


@pytest.mark.parametrize("size", [1, 700, 40000])
def test_dropin_fast_and_general_paths_agree_across_ranks(comm, size):
    """Even ranks pass plain arrays (the fast paths straight to the kept
    doors), odd ranks the same buffers as ``[array, MPI type]`` specs (the
    general parsing): every rank must take the same decision and algorithm,
    so the calls match up and give mpi4py's results, at sizes on both sides
    of the native/own-algorithm switches."""
    p, r = comm.size, comm.rank
    root = p // 2
    mc = mpicoll.Comm(comm)
    plain = r % 2 == 0
    counts = [size + (k % 3) for k in range(p)]
    total = sum(counts)

    def spec(a, c=None):
        return a if plain and c is None else [a, c] if plain else _typed(a, c)

    def run(c):
        got = []
        y = np.zeros(size, np.float64) if r == root else None
        c.Reduce(spec(np.arange(size, dtype=np.float64) + r), spec(y) if y is not None else None, MPI.SUM, root)
        got.append(y)
        y = np.zeros(size, np.float32)
        c.Reduce_scatter_block(spec(np.arange(size * p, dtype=np.float32) * (r + 1)), spec(y), MPI.MAX)
        got.append(y)
        y = np.zeros(counts[r], np.int64)
        c.Reduce_scatter(spec(np.arange(total, dtype=np.int64) - r), spec(y), counts, MPI.SUM)
        got.append(y)
        g = np.zeros(total, np.int32)
        c.Allgatherv(spec(np.full(counts[r], r, np.int32)), spec(g, counts))
        got.append(g)
        full = np.arange(total, dtype=np.float64) if r == root else None
        y = np.zeros(counts[r], np.float64)
        c.Scatterv(spec(full, counts) if r == root else None, spec(y), root)
        got.append(y)
        g = np.zeros(total, np.int16) if r == root else None
        c.Gatherv(spec(np.full(counts[r], r, np.int16)), spec(g, counts) if r == root else None, root)
        got.append(g)
        sc = [(r + j) % 3 * size for j in range(p)]
        rc = [(j + r) % 3 * size for j in range(p)]
        x = np.arange(sum(sc), dtype=np.float32) + 1000 * r
        g = np.zeros(sum(rc), np.float32)
        c.Alltoallv(spec(x, sc), spec(g, rc))
        got.append(g)
        y = np.zeros(size, np.int32) if r == root else None
        # The send buffer is held until Wait: mpi4py does not keep a
        # temporary alive for the library, and Open MPI reads it after the
        # call returns (a temporary gave freed memory's bytes at the root).
        x = np.arange(size, dtype=np.int32) * r
        c.Ireduce(spec(x), spec(y) if y is not None else None, MPI.SUM, root).Wait()
        got.append(y)
        return got

    for _ in range(2):  # the second round on the kept plans
        wrong = []
        for k, (a, b) in enumerate(zip(run(mc), run(comm))):
            if b is None:
                if a is not None:
                    wrong.append(f"call {k}: a result where mpi4py has none")
            elif not np.array_equal(a, b):
                bad = np.flatnonzero(a != b)
                wrong.append(f"call {k}: {bad.size} of {b.size} elements differ, first at {bad[0]}: "
                             f"{a[bad[0]]} (mpicoll) vs {b[bad[0]]} (mpi4py)")
        # Every rank raises together (a lone failing rank would leave the
        # others in the next round's collectives).
        everyone = comm.allgather(wrong)
        assert not any(everyone), {q: w for q, w in enumerate(everyone) if w}


@pytest.mark.parametrize("algorithm", ["auto", "mpi", "recursive_doubling"])
def test_dropin_short_paths_serve_every_allreduce_and_bcast_form(comm, algorithm, monkeypatch):
    """Allreduce, Bcast, Reduce, Allgather, Alltoall, Gather, Scatter,
    Reduce_scatter_block, Reduce_scatter, Allgatherv, Alltoallv, Scatterv,
    Gatherv and their I-forms on plain arrays are served,
    once their signature is kept (and gated), by the kept entry's C call
    straight from the method (native.MethodDoor, where built), in every
    buffer form: a separate send buffer (the most usual, and the one
    a mix-up with in place would get wrong), MPI.IN_PLACE, the receive
    buffer passed as send buffer, None. Each round uses new values, and
    mpi4py's own method on the same arrays is the reference; from the
    fourth round on, no call reaches the general path's door."""
    from mpicoll import dropin

    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    doors = []
    real = dropin._door
    monkeypatch.setattr(dropin, "_door", lambda *a, **k: doors.append(a[:2]) or real(*a, **k))

    def allreduce(c, form, i, start):
        y = np.arange(5, dtype=np.float64) * (r + 1) + i
        x = y.copy() + 0.5 * r
        send = {"apart": x, "in_place": MPI.IN_PLACE, "same": y, "none": None}[form]
        if form in ("same", "none") and c is comm:
            send = MPI.IN_PLACE  # (MPI itself refuses aliased buffers: its spelling of in place)
        kw = {} if c is comm else {"algorithm": algorithm}
        if start:
            c.Iallreduce(send, y, MPI.SUM, **kw).Wait()
        else:
            c.Allreduce(send, y, MPI.SUM, **kw)
        return y

    def bcast(c, start, i):
        b = np.full(3, float(r * 10 + i))
        kw = {} if c is comm else {"algorithm": "auto"}
        (c.Ibcast(b, p - 1, **kw).Wait() if start else c.Bcast(b, p - 1, **kw))
        return b

    def others(c, i):
        """Reduce (root in place, root apart, off root), Allgather and
        Alltoall (flat buffers the method reshapes), each form: what every
        rank received."""
        root = p - 1
        got = []
        for start in (False, True):
            x = np.arange(4, dtype=np.int64) * (r + 2) - i
            y = np.full(4, -1, np.int64)
            wait = (lambda q: q.Wait()) if start else (lambda q: None)
            name = "I" if start else ""
            wait(getattr(c, name + "reduce" if start else "Reduce")(x, y, MPI.SUM, root))
            got.append(y.copy() if r == root else None)
            z = x.copy()
            wait(getattr(c, name + "reduce" if start else "Reduce")(
                MPI.IN_PLACE if r == root else z, z if r == root else None, op=MPI.PROD, root=root))
            got.append(z.copy() if r == root else None)
            g = np.full(4 * p, -1, np.int64)
            wait(getattr(c, "Iallgather" if start else "Allgather")(x, g))
            got.append(g)
            a = np.arange(2 * p, dtype=np.float32) + 100 * r + i
            t = np.full(2 * p, -1, np.float32)
            wait(getattr(c, "Ialltoall" if start else "Alltoall")(a, t))
            got.append(t)
            h = np.full((p, 4) if r == root else 1, -1, np.int64)  # (ignored off root, as by mpi4py)
            wait(getattr(c, "Igather" if start else "Gather")(x, h, root))
            got.append(h if r == root else None)
            rows = np.arange(3 * p, dtype=np.float64).reshape(p, 3) * (r + 1) + i
            s = np.full(3, -1.0)
            wait(getattr(c, "Iscatter" if start else "Scatter")(rows if r == root else None, s, root))
            got.append(s)
            rs = np.full(2, -1, np.int64)
            wait(getattr(c, "Ireduce_scatter_block" if start else "Reduce_scatter_block")(
                np.arange(2 * p, dtype=np.int64) * (r + 1) - i, rs, MPI.MAX))
            got.append(rs)
            vc = [j % 2 + 1 for j in range(p)]
            rv = np.full(vc[r], -1, np.int64)
            wait(getattr(c, "Ireduce_scatter" if start else "Reduce_scatter")(
                np.arange(sum(vc), dtype=np.int64) * (r + 1) + i, rv, vc if start else tuple(vc), MPI.SUM))
            got.append(rv)
            vg = np.full(sum(vc), -1.0)
            wait(getattr(c, "Iallgatherv" if start else "Allgatherv")(np.full(vc[r], r + 0.5 * i), [vg, vc]))
            got.append(vg)
            sc = [(r + j) % 2 + 1 for j in range(p)]
            rc = [(j + r) % 2 + 1 for j in range(p)]
            tv = np.full(sum(rc), -1, np.int32)
            wait(getattr(c, "Ialltoallv" if start else "Alltoallv")(
                [np.arange(sum(sc), dtype=np.int32) + 7 * r + i, sc], [tv, rc]))
            got.append(tv)
            whole = np.arange(sum(vc), dtype=np.float64) * (i + 1)
            part = np.full(vc[r], -1.0)
            wait(getattr(c, "Iscatterv" if start else "Scatterv")([whole, vc] if r == root else None, part, root))
            got.append(part)
            into = np.full(sum(vc), -1.0)
            wait(getattr(c, "Igatherv" if start else "Gatherv")(np.full(vc[r], r - 0.25 * i),
                                                              [into, vc] if r == root else None, root))
            got.append(into if r == root else None)
        return got

    for i in range(6):
        if i == 3:
            doors.clear()
        for form in ("apart", "in_place", "same", "none"):
            for start in (False, True):
                got, want = allreduce(mc, form, i, start), allreduce(comm, form, i, start)
                np.testing.assert_array_equal(got, want, err_msg=f"{form}, start={start}, round {i}")
        for start in (False, True):
            np.testing.assert_array_equal(bcast(mc, start, i), bcast(comm, start, i))
        for k, (got, want) in enumerate(zip(others(mc, i), others(comm, i))):
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"call {k}, round {i}")
    from mpicoll import native
    if native.enabled() and p > 1 and algorithm != "recursive_doubling":
        assert doors == [], doors
    elif native.enabled() and p > 1:
        # a compiled program is gated for blocking calls only (its I-form is
        # a request of the engine's): the I-calls still come through
        assert all(d == ("Allreduce", "start") for d in doors), doors
