"""Off the main road, through the doors the native calls serve, each call
repeated four times so that it reaches the kept plan and its C path: the
same strided view, NaN in min/max/sum, a misaligned buffer, mpi4py's odd
buffer specs through mpicoll.Comm. Every rank must get the right answer (or
the same clear error) with identical bits. The first call on a fresh
communicator with a rank missing is tests/test_timeout.py's."""
import numpy as np
import pytest
from mpi4py import MPI

import mpicoll

pytestmark = pytest.mark.mpi


def _same_everywhere(comm, a, what):
    b = np.ascontiguousarray(a).tobytes()
    everyone = comm.allgather(b)
    assert all(x == everyone[0] for x in everyone), f"{what}: ranks differ"


def test_the_same_strided_view_again_and_again():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    base = np.arange(20, dtype=np.float64) + r
    v = base[::2]
    for i in range(4):
        got = mpicoll.allreduce(v)
        assert np.array_equal(got, (np.arange(20)[::2]) * p + sum(range(p)))
        got2 = mpicoll.iallreduce(v).wait()
        assert np.array_equal(got, got2)
        errs = []
        for c in (mc, comm):  # a strided view: mpi4py refuses it, and so must the drop-in, alike
            try:
                c.Allreduce(v, np.empty(10))
                errs.append(None)
            except Exception as exc:
                errs.append(type(exc).__name__)
        assert errs[0] == errs[1] and errs[0] is not None, errs
        bv = (np.arange(20, dtype=np.int32) * (r + 1))[::2]
        for f in (lambda: mpicoll.bcast(bv, 0), lambda: mpicoll.ibcast(bv, 0).wait()):
            try:
                f()
                err = None
            except ValueError as exc:  # documented: bcast writes in place, x must be C-contiguous
                err = str(exc)
            assert err and comm.allgather(err) == [err] * p, err
        g = mpicoll.gather(v, 0)
        if r == 0:
            assert np.array_equal(g[p - 1], np.arange(20)[::2] + p - 1)
        sc = mpicoll.scatter(np.tile(np.arange(10.0), (p, 1))[:, ::1] if r == 0 else None, 0, out=np.empty(10))
        assert np.array_equal(sc, np.arange(10.0))
        _same_everywhere(comm, got, "strided allreduce")


def test_nan_in_min_max_sum_same_bits_everywhere():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    for op in ("min", "max", "sum"):
        for i in range(4):
            x = np.arange(6, dtype=np.float32) + r
            x[(r + 1) % 6] = np.nan
            y = mpicoll.allreduce(x, op=op)
            _same_everywhere(comm, y, f"NaN {op}")
            assert np.isnan(y[[(k + 1) % 6 for k in range(p)]]).all(), (op, y)
            z = mpicoll.iallreduce(x, op=op).wait()
            _same_everywhere(comm, z, f"NaN i{op}")
            assert np.array_equal(np.isnan(y), np.isnan(z))
            o = np.empty_like(x)
            mc.Allreduce(x, o, op={"min": MPI.MIN, "max": MPI.MAX, "sum": MPI.SUM}[op])
            _same_everywhere(comm, o, f"NaN Comm {op}")
            assert np.array_equal(np.isnan(o), np.isnan(y))


def test_a_misaligned_buffer_again_and_again():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    raw = bytearray(8 * 9 + 1)
    m = np.frombuffer(raw, dtype=np.float64, offset=1, count=9)
    assert not m.flags.aligned
    for i in range(4):
        m[:] = np.arange(9) + r
        got = mpicoll.allreduce(m)
        assert np.array_equal(got, np.arange(9) * p + sum(range(p)))
        m[:] = np.arange(9) + r
        mpicoll.allreduce(m, out=m)
        assert np.array_equal(m, np.arange(9) * p + sum(range(p)))
        mb = np.frombuffer(raw, dtype=np.float64, offset=1, count=9)
        mb[:] = r
        mpicoll.bcast(mb, p - 1)
        assert (mb == p - 1).all()
        m[:] = r
        assert (mpicoll.iallreduce(m).wait() == sum(range(p))).all()


def test_mpi4py_buffer_specs_through_the_drop_in_again_and_again():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    for i in range(4):
        x = np.arange(8, dtype=np.float64) + r
        y = np.zeros(8)
        mc.Allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE], MPI.SUM)
        ref = np.zeros(8)
        comm.Allreduce(x, ref)
        assert np.array_equal(y, ref)
        y[:] = 0
        mc.Allreduce([x, 4, MPI.DOUBLE], [y, 4, MPI.DOUBLE], MPI.MAX)
        assert np.array_equal(y[:4], np.arange(4) + p - 1) and (y[4:] == 0).all()
        z = x.copy()
        mc.Allreduce(MPI.IN_PLACE, z, MPI.SUM)
        assert np.array_equal(z, ref)
        ba = bytearray(np.full(4, r, np.int32).tobytes())
        mc.Bcast(ba, 0)
        assert np.frombuffer(ba, np.int32).tolist() == [0] * 4
        buf = np.full(6, r, np.int32)
        mc.Bcast([buf, 3, MPI.INT], root=p - 1)
        assert (buf[:3] == p - 1).all() and (buf[3:] == r).all()
        g = np.zeros(2 * p, np.int64) if r == 0 else None
        mc.Gather([np.full(2, r, np.int64), MPI.INT64_T], [g, MPI.INT64_T] if r == 0 else None, 0)
        if r == 0:
            assert g.tolist() == [k for k in range(p) for _ in range(2)]
        q = np.zeros(8)
        mc.Iallreduce([x, MPI.DOUBLE], [q, MPI.DOUBLE]).Wait()
        assert np.array_equal(q, ref)


def test_v_forms_scatter_and_persistent_requests_off_the_main_road():
    """The doors this change put in C, off their main road, each four times:
    the drop-in's v-forms with every spec mpi4py takes (list or tuple, counts
    with displacements, a count array, in place), Scatter and
    Reduce_scatter_block with a datatype in the spec or in place, and
    persistent requests over a strided input (restaged at every start), a
    misaligned out and NaN in min. mpi4py's own call is the reference;
    every rank ends with identical bits."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    counts = [j % 2 + 1 for j in range(p)]
    displs = [sum(counts[:j]) for j in range(p)]
    n = sum(counts)
    base = np.zeros(20)
    sv = base[::2]  # strided: staged at every start
    raw = np.zeros(8 * 10 + 1, np.uint8)
    mis = raw[1:].view(np.float64)  # misaligned
    pmin = mpicoll.allreduce_init(sv, op="min", comm=comm, out=mis)
    psum = mpicoll.allreduce_init(sv, comm=comm)
    for i in range(4):
        x = np.arange(counts[r], dtype=np.float64) + 10 * r + i
        for spec in (lambda g: [g, counts], lambda g: (g, counts), lambda g: [g, (counts, displs)],
                     lambda g: (g, (tuple(counts), tuple(displs))), lambda g: [g, np.array(counts)],
                     lambda g: [g, counts, MPI.DOUBLE]):
            got, want = np.full(n, -1.0), np.full(n, -1.0)
            mc.Allgatherv(x, spec(got))
            comm.Allgatherv(x, spec(want))
            assert np.array_equal(got, want), (got, want)
        # a tuple second item is mpi4py's (counts, displs), ints meaning every
        # block alike: one element each, block i at 2 * i; and p ones as a
        # tuple, which mpi4py refuses unless p = 2 (the drop-in's fast path
        # once took them as counts, where mpi4py raises)
        one = np.full(1, r + 0.5 * i)
        for spec, size in (((1, 2), 2 * p), ((1,) * p, p)):
            got, want = np.full(size, -1.0), np.full(size, -1.0)
            outcome = []
            for c, o in ((mc, got), (comm, want)):
                try:
                    c.Allgatherv(one, (o, spec))
                    outcome.append(None)
                except ValueError:  # (raised while parsing, on every rank alike: no message sent)
                    outcome.append("ValueError")
            assert outcome[0] == outcome[1] and np.array_equal(got, want), (spec, outcome, got, want)
        ref = np.empty(n)
        comm.Allgatherv(x, [ref, counts])
        got = np.full(n, -1.0)
        got[displs[r]:displs[r] + counts[r]] = x
        mc.Allgatherv(MPI.IN_PLACE, [got, counts])
        assert np.array_equal(got, ref)
        sc = [(r + j) % 2 + 1 for j in range(p)]
        rc = [(j + r) % 2 + 1 for j in range(p)]
        y = np.arange(sum(sc), dtype=np.int32) * (r + 1) + i
        for form in (lambda a, c: [a, c], lambda a, c: (a, np.array(c)), lambda a, c: [a, c, MPI.INT]):
            got, want = np.full(sum(rc), -1, np.int32), np.full(sum(rc), -1, np.int32)
            mc.Alltoallv(form(y, sc), form(got, rc))
            comm.Alltoallv(form(y, sc), form(want, rc))
            assert np.array_equal(got, want)
        rows = np.arange(3 * p, dtype=np.float64).reshape(p, 3) + i
        for spec in (lambda a: a, lambda a: [a, MPI.DOUBLE]):
            got, want = np.zeros(3), np.zeros(3)
            mc.Scatter(spec(rows) if r == 0 else None, got, 0)
            comm.Scatter(spec(rows) if r == 0 else None, want, 0)
            assert np.array_equal(got, want)
        blocks = np.arange(2 * p, dtype=np.int64) * (r + 1) - i
        got, want = np.zeros(2, np.int64), np.zeros(2, np.int64)
        mc.Reduce_scatter_block(blocks, got, MPI.SUM)
        comm.Reduce_scatter_block(blocks, want, MPI.SUM)
        assert np.array_equal(got, want)
        inplace = blocks.copy()
        mc.Reduce_scatter_block(MPI.IN_PLACE, inplace, MPI.SUM)
        assert np.array_equal(inplace[:2], want)
        base[:] = np.arange(20) * (r + 1) + i
        if i % 2:
            base[6] = np.nan
        mine = np.ascontiguousarray(sv)
        pmin()
        want_min = np.min(np.array(comm.allgather(mine)), axis=0)  # NaN wins, as mpicoll's min/max promise
        assert np.array_equal(mis, want_min, equal_nan=True), (mis, want_min)
        _same_everywhere(comm, mis, "persistent min with NaN, misaligned out")
        want_sum = np.sum(np.array(comm.allgather(mine)), axis=0)
        assert np.array_equal(psum(), want_sum, equal_nan=True)
    pmin.free()
    psum.free()


def test_persistent_programs_long_i_calls_and_the_doors_memo_off_the_main_road():
    """This session's paths (csrc/native.c: persistent programs started in C,
    the C progress thread for the library's 1-4 MiB I-calls, the doors'
    memo of their last hit), four runs each: a persistent request of every
    compiled schedule and of shm's program (shm, hierarchical) bound to a
    strided view and to a misaligned buffer,
    with NaN under min and max; a 1 MiB I-call of the library with NaN, on a
    strided view and on a misaligned buffer; the drop-in's buffer specs on
    the I-calls; one door alternating between two communicators and a new
    one (the memo is per communicator). Identical bits on every rank."""
    from mpicoll import algorithms as alg
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    names = [n for n in mpicoll.algorithms("allreduce")
             if n != "auto" and (alg.get("allreduce", n).compilable or alg.get("allreduce", n).program is not None)]
    base = np.zeros(14, np.float32)
    raw = bytearray(4 * 7 + 1)
    mis = np.frombuffer(raw, dtype=np.float32, offset=1, count=7)
    assert not mis.flags.aligned
    for name in names:
        for op, npop in (("min", np.fmin), ("max", np.fmax)):
            for buf in (base[::2], mis):
                pq = mpicoll.allreduce_init(buf, op, comm=comm, algorithm=name)
                for i in range(4):
                    buf[:] = np.arange(7, dtype=np.float32) * (r + 1) - i
                    buf[(r + i) % 7] = np.nan
                    rows = comm.allgather(np.array(buf))
                    got = pq()
                    _same_everywhere(comm, got, f"{name} {op} persistent")
                    nan_at = {(k + i) % 7 for k in range(p)}
                    want = rows[0].copy()
                    for row in rows[1:]:
                        want = npop(want, row)  # (where any rank has NaN the result is NaN: checked below)
                    for j in range(7):
                        assert np.isnan(got[j]) if j in nan_at else got[j] == want[j], (name, op, i, j, got)
                pq.free()
    # the library's 1 MiB I-call, on the C thread from its third call
    n = (1 << 20) // 8 + 3
    big = np.arange(n, dtype=np.float64) + r
    big[r] = np.nan
    strided = np.zeros(2 * n)[::2]
    rawb = bytearray(8 * n + 1)
    misb = np.frombuffer(rawb, dtype=np.float64, offset=1, count=n)
    for x in (big, strided, misb):
        if x is not big:
            x[:] = big
        for i in range(4):
            got = mpicoll.iallreduce(x, "max", algorithm="mpi").wait()
            _same_everywhere(comm, got, "1 MiB imax")
            assert np.isnan(got[:p]).all() and np.array_equal(got[p:], np.arange(p, n) + p - 1), i
    mc = mpicoll.Comm(comm)
    for i in range(4):
        o = np.empty(n)
        mc.Iallreduce([big, MPI.DOUBLE], [o, MPI.DOUBLE], MPI.MAX).Wait()
        _same_everywhere(comm, o, "Comm.Iallreduce specs")
        o2 = np.array(big)
        mc.Iallreduce(MPI.IN_PLACE, o2, MPI.MAX).Wait()
        assert np.array_equal(o, o2, equal_nan=True)
    # one door, two communicators and a fresh one: each its own entry
    other = comm.Split(0, p - 1 - r)  # (the same ranks, another order: another state)
    try:
        x = np.full(5, r + 1.0)
        for i in range(6):
            c = comm if i % 2 == 0 else other
            assert np.array_equal(mpicoll.allreduce(x, comm=c), np.full(5, p * (p + 1) / 2))
            assert np.array_equal(mpicoll.bcast(np.full(3, float(c.rank)), 0, comm=c), np.zeros(3))
        fresh = comm.Dup()
        try:
            for i in range(4):
                assert np.array_equal(mpicoll.bcast(np.full(3, float(fresh.rank)), p - 1, comm=fresh),
                                      np.full(3, p - 1.0))
        finally:
            fresh.Free()
        for i in range(2):
            assert np.array_equal(mpicoll.bcast(np.full(3, float(comm.rank)), 0, comm=comm), np.zeros(3))
    finally:
        other.Free()


def test_shm_programs_queued_behind_each_other_and_behind_the_schedule():
    """shm's one-chunk program (the executor's SHM step) while other calls
    are in flight on the same window, four runs each, on a fresh
    communicator: an I-call or a persistent start left pending, then a
    blocking call of the same size (the probe declines: it runs the
    schedule, which waits for the program), then one of 1 MiB (it grows the
    window behind the pending ones), then the waits; NaN under max. Every
    result is the serial rank-ordered reduction's bits, on every rank, and
    every program came back to the window (nothing left running)."""
    from mpicoll.commstate import state
    comm = MPI.COMM_WORLD.Dup()
    p, r = comm.size, comm.rank
    try:
        for name in ("shm", "hierarchical"):
            x = np.arange(9, dtype=np.float32) * (r + 1)
            x[r % 9] = np.nan
            big = np.arange((1 << 20) // 4, dtype=np.float32) + r
            rows = comm.allgather(x)
            want = rows[0].copy()
            for row in rows[1:]:
                want = np.fmax(want, row)
            for q in range(p):
                want[q % 9] = np.nan
            want_big = np.arange(big.size, dtype=np.float32) * p + p * (p - 1) / 2
            out = np.empty_like(x)
            pr = mpicoll.allreduce_init(x, "max", out=out, comm=comm, algorithm=name)
            for i in range(4):
                first = mpicoll.iallreduce(x, "max", comm=comm, algorithm=name)
                pr.start()
                mid = mpicoll.allreduce(x, "max", comm=comm, algorithm=name)
                grown = mpicoll.allreduce(big, comm=comm, algorithm=name)
                later = mpicoll.iallreduce(x, "max", comm=comm, algorithm=name)
                got = [first.wait(), pr.wait().copy(), mid, later.wait()]
                for g in got:
                    assert np.array_equal(g, want, equal_nan=True), (name, i, g, want)
                    _same_everywhere(comm, g, f"{name} queued")
                assert np.array_equal(grown, want_big), (name, i)
            pr.free()
        if p > 1:
            ctl = state(comm).extra.get("shm-ctl")
            assert ctl is not None and ctl.running == 0 and ctl.queued == 0, (ctl.running, ctl.queued)
    finally:
        comm.Free()


def test_the_doors_memo_tells_calls_apart_item_by_item():
    """The doors in C compare a repeated call with their memo item by item
    (csrc/native.c memo_same): on one door, back to back, calls whose keys
    differ in one item only - the shape ((6,), (2, 3), (3, 2)), the dtype
    (float32 / int32: the same size), the op, the root, scatter's two
    shapes - four rounds, each against mpi4py's own call; the drop-in's
    methods likewise."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    root1 = min(p - 1, 1)

    def arr(shape=(6,), dtype=np.float32):
        return (np.arange(6) + 10 * r + 1).astype(dtype).reshape(shape)

    def ref(name, x, op=MPI.SUM, root=0):
        if name == "allreduce":
            w = np.empty_like(x)
            comm.Allreduce(x, w, op)
            return w
        if name == "bcast":
            w = x.copy() if r == root else np.zeros_like(x)
            comm.Bcast(w, root)
            return w
        if name == "reduce":
            w = np.empty_like(x)
            comm.Reduce(x, w, op, root)
            return w if r == root else None
        w = np.empty((p,) + x.shape, x.dtype) if name == "allgather" or r == root else None
        (comm.Allgather(x, w) if name == "allgather" else comm.Gather(x, w, root))
        return w

    def bcast_door(x, root, method=False):
        b = x.copy() if r == root else np.zeros_like(x)
        (mc.Bcast(b, root) if method else mpicoll.bcast(b, root))
        return b

    def allreduce_method(x, op):
        y = np.empty_like(x)
        mc.Allreduce(x, y, op)
        return y

    def allgather_method(x):
        y = np.empty((p,) + x.shape, x.dtype)
        mc.Allgather(x, y)
        return y

    def scatter_door(shape, root, method=False):
        xs = (np.arange(6 * p) + 1).astype(np.float32).reshape((p,) + shape) if r == root else None
        y = np.empty(shape, np.float32)
        (mc.Scatter(xs, y, root) if method else mpicoll.scatter(xs, root, out=y))
        return y

    def scatter_ref(shape, root):
        y = np.empty(shape, np.float32)
        xs = (np.arange(6 * p) + 1).astype(np.float32).reshape((p,) + shape) if r == root else None
        comm.Scatter(xs, y, root)
        return y

    f32, i32 = np.float32, np.int32
    shapes = [(6,), (2, 3), (3, 2)]
    cases = {  # door: [(call, reference)], each differing from its neighbours in one item
        "allreduce shape": [(lambda s=s: mpicoll.allreduce(arr(s)), lambda s=s: ref("allreduce", arr(s)))
                            for s in shapes],
        "allreduce dtype": [(lambda t=t: mpicoll.allreduce(arr(dtype=t)), lambda t=t: ref("allreduce", arr(dtype=t)))
                            for t in (f32, i32)],
        "allreduce op": [(lambda: mpicoll.allreduce(arr(), "sum"), lambda: ref("allreduce", arr(), MPI.SUM)),
                         (lambda: mpicoll.allreduce(arr(), "max"), lambda: ref("allreduce", arr(), MPI.MAX))],
        "Comm.Allreduce dtype": [(lambda t=t: allreduce_method(arr(dtype=t), MPI.SUM),
                                  lambda t=t: ref("allreduce", arr(dtype=t))) for t in (f32, i32)],
        "Comm.Allreduce op": [(lambda o=o: allreduce_method(arr(), o), lambda o=o: ref("allreduce", arr(), o))
                              for o in (MPI.SUM, MPI.MAX)],
        "bcast root": [(lambda q=q: bcast_door(arr(), q), lambda q=q: ref("bcast", arr(), root=q)) for q in (0, root1)],
        "Comm.Bcast root": [(lambda q=q: bcast_door(arr(), q, True), lambda q=q: ref("bcast", arr(), root=q))
                            for q in (0, root1)],
        "reduce root": [(lambda q=q: mpicoll.reduce(arr(), root=q), lambda q=q: ref("reduce", arr(), root=q))
                        for q in (0, root1)],
        "gather shape": [(lambda s=s: mpicoll.gather(arr(s), 0), lambda s=s: ref("gather", arr(s))) for s in shapes],
        "allgather shape": [(lambda s=s: mpicoll.allgather(arr(s)), lambda s=s: ref("allgather", arr(s)))
                            for s in shapes],
        "Comm.Allgather shape": [(lambda s=s: allgather_method(arr(s)), lambda s=s: ref("allgather", arr(s)))
                                 for s in shapes],
        "scatter shape": [(lambda s=s: scatter_door(s, 0), lambda s=s: scatter_ref(s, 0)) for s in shapes],
        "scatter root": [(lambda q=q: scatter_door((6,), q), lambda q=q: scatter_ref((6,), q)) for q in (0, root1)],
        "Comm.Scatter shape": [(lambda s=s: scatter_door(s, 0, True), lambda s=s: scatter_ref(s, 0)) for s in shapes],
    }
    for what, calls in cases.items():
        wants = [want() for _, want in calls]
        for rnd in range(4):
            got = [call() for call, _ in calls]  # back to back: each after a hit of its neighbour
            for i, (g, w) in enumerate(zip(got, wants)):
                if w is None:
                    continue
                assert g.shape == w.shape and g.dtype == w.dtype and np.array_equal(g, w), (what, rnd, i, g, w)


def test_shm_programs_and_remembering_doors_off_the_main_road():
    """This session's paths off the main road, four rounds each, back to
    back on one door (so that each call follows a remembered hit): shm's
    program (shm, hierarchical) on a strided view, a misaligned buffer and
    a contiguous array of the same shape, with NaN under max, blocking and
    I-form; mpicoll.Comm.Allreduce with algorithm shm, IN_PLACE and mpi4py's
    [buf, MPI.FLOAT] specs in turn; bcast and Comm.Bcast on an array and
    with a spec, between them bcast of a strided view of its shape (a
    ValueError on every rank: bcast writes in place). Each result against
    mpi4py's own call, identical bits on every rank."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    mc = mpicoll.Comm(comm)
    vals = np.arange(7, dtype=np.float32) * (r + 1)
    vals[r % 7] = np.nan
    want = np.empty_like(vals)
    comm.Allreduce(vals, want, MPI.MAX)  # (MPI's max: NaN where some rank has NaN is checked below)
    nan_at = {q % 7 for q in range(p)}

    def right(got, what):
        for j in range(7):
            assert np.isnan(got[j]) if j in nan_at else got[j] == want[j], (what, j, got, want)
        _same_everywhere(comm, got, what)

    base = np.zeros(14, np.float32)
    raw = bytearray(4 * 7 + 1)
    mis = np.frombuffer(raw, dtype=np.float32, offset=1, count=7)
    for alg in ("shm", "hierarchical"):
        for rnd in range(4):
            strided = base[::2]
            strided[:] = vals
            mis[:] = vals
            contig = vals.copy()
            right(mpicoll.allreduce(strided, "max", algorithm=alg), f"{alg} strided")
            right(mpicoll.allreduce(mis, "max", algorithm=alg), f"{alg} misaligned")
            right(mpicoll.allreduce(contig, "max", out=contig, algorithm=alg), f"{alg} in place")
            right(mpicoll.iallreduce(strided, "max", algorithm=alg).wait(), f"{alg} I strided")
            right(mpicoll.iallreduce(mis, "max", algorithm=alg).wait(), f"{alg} I misaligned")
            right(mpicoll.iallreduce(vals, "max", algorithm=alg).wait(), f"{alg} I")
            y, y2, y3 = np.empty(7, np.float32), vals.copy(), np.empty(7, np.float32)
            mc.Allreduce(vals, y, MPI.MAX, algorithm=alg)
            right(y, f"Comm {alg}")
            mc.Allreduce(MPI.IN_PLACE, y2, MPI.MAX, algorithm=alg)
            right(y2, f"Comm {alg} IN_PLACE")
            mc.Allreduce([vals, MPI.FLOAT], [y3, MPI.FLOAT], MPI.MAX, algorithm=alg)
            right(y3, f"Comm {alg} specs")
    root = p - 1
    src = (np.arange(6, dtype=np.float64) + 1) * 3
    for rnd in range(4):
        a = src.copy() if r == root else np.zeros(6)
        bs = np.zeros(12)
        sv = bs[::2]
        if r == root:
            sv[:] = src
        a2 = src.copy() if r == root else np.zeros(6)
        a3 = src.copy() if r == root else np.zeros(6)
        mpicoll.bcast(a, root)
        with pytest.raises(ValueError, match="C-contiguous"):  # (on every rank, before any message)
            mpicoll.bcast(sv, root)
        mc.Bcast(a2, root)
        mc.Bcast([a3, MPI.DOUBLE], root)
        for got, what in ((a, "bcast"), (a2, "Comm.Bcast"), (a3, "Comm.Bcast spec")):
            assert np.array_equal(got, src), (what, rnd, got)
            _same_everywhere(comm, got, what)


def test_program_i_calls_in_c_off_the_main_road():
    """A compiled schedule's (and shm's) I-call whole in C (csrc/native.c,
    "a program's I-call"): from a signature's third I-call on, the C start
    runs it on the Call's I-run and returns the engine's NativeRequest. For
    every such algorithm, awkward counts, out given, made, or in place,
    four calls each: the exact sums on every rank, identical bits; the input
    a temporary that only the request holds, freed once the request is
    (nothing of the caller's stays referenced); two calls of the signature
    in flight (the second on the Python path's kit), a library I-call
    between them, waits in reverse order, test() polling and a done-callback.
    Then, on two ranks, counts that differ (one rank posting late, then the
    other): MismatchError from wait() on both, and the signature's next
    calls run in C again, on a new I-run."""
    import gc
    import time
    import weakref

    from mpicoll import algorithms as alg
    from mpicoll import engine, executor, native
    from mpicoll.errors import MismatchError
    comm = MPI.COMM_WORLD.Dup()
    p, r = comm.size, comm.rank
    in_c = p > 1 and executor.enabled() and native.module() is not None
    names = [n for n in mpicoll.algorithms("allreduce")
             if n != "auto" and (alg.get("allreduce", n).compilable or alg.get("allreduce", n).program is not None)]
    try:
        for name in names:
            for n in (1, p + 2, 37):
                want = np.arange(n, dtype=np.float64) * p + p * (p - 1) / 2
                y = np.empty(n)
                for form in ("out", "new", "in place"):
                    for i in range(4):
                        x = np.arange(n, dtype=np.float64) + r
                        seen = weakref.ref(x)
                        out = {"out": y, "new": None, "in place": x}[form]
                        req = mpicoll.iallreduce(x, out=out, algorithm=name, comm=comm)
                        if i > 1 and in_c:  # (the first call builds the plan, the second gates it)
                            assert type(req) is engine.NativeRequest, (name, n, form, type(req))
                        del x, out
                        got = req.wait()
                        assert np.array_equal(got, want), (name, n, form, i, got)
                        _same_everywhere(comm, got, f"{name} {form}")
                        del req, got
                        if form != "in place":
                            assert seen() is None, (name, n, form, "the input outlived its request")
                # two in flight, a library I-call between them, waited for in reverse
                x = np.arange(n, dtype=np.float64) + r
                called = []
                a = mpicoll.iallreduce(x, out=y, algorithm=name, comm=comm)
                a.add_done_callback(called.append)
                b = mpicoll.iallreduce(x, algorithm=name, comm=comm)
                lib = comm.Iallreduce(x, z := np.empty(n))
                while not b.test():
                    time.sleep(0)
                lib.Wait()
                got_b, got_a = b.wait(), a.wait()
                assert called == [a] and np.array_equal(got_a, want) and np.array_equal(got_b, want), name
                assert np.array_equal(z, want)
        if in_c:
            two = comm.Split(0 if r < 2 else MPI.UNDEFINED, r)
            if two != MPI.COMM_NULL:
                try:
                    for late in (0, 1):
                        for k in (4, 5):  # both signatures warm and in C
                            for _ in range(2):
                                got = mpicoll.iallreduce(np.ones(k), algorithm="recursive_doubling", comm=two).wait()
                                assert np.array_equal(got, np.full(k, 2.0))
                        two.Barrier()
                        if r == late:
                            time.sleep(0.05)  # the peer's message is there when this rank posts
                        req = mpicoll.iallreduce(np.ones(4 + r), algorithm="recursive_doubling", comm=two)
                        assert type(req) is engine.NativeRequest
                        with pytest.raises(MismatchError, match="recursive doubling round 0"):
                            req.wait()
                        two.Barrier()
                        for _ in range(2):
                            req = mpicoll.iallreduce(np.ones(4), algorithm="recursive_doubling", comm=two)
                            assert type(req) is engine.NativeRequest
                            assert np.array_equal(req.wait(), np.full(4, 2.0))
                finally:
                    two.Free()
        gc.collect()
    finally:
        comm.Free()
