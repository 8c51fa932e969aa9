"""scatter, gather, allgatherv, alltoall, alltoallv: every algorithm against
the MPI library's own call, blocking, nonblocking and persistent, and the
mpicoll.Comm methods against plain mpi4py."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll

pytestmark = pytest.mark.mpi

DTYPES = [np.dtype(np.uint8), np.dtype(np.float64), np.dtype([("a", np.int32), ("b", np.int16)])]
SHAPES = [(0,), (1,), (3, 5), (1001,)]


def _vals(dt, n, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt) if n else np.zeros(0, dt)


def _counts(p, seed):
    rng = np.random.default_rng(seed)
    c = [int(v) for v in rng.integers(0, 9, p)]
    if p > 1:
        c[-1] = 0
    return c


def _eq(a, b):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("scatter"))
def test_scatter(algorithm):
    for root in sorted({0, P - 1, P // 2}):
        for dt in DTYPES:
            for shape in SHAPES:
                n = int(np.prod(shape))
                x = _vals(dt, P * n, 7 + root).reshape((P,) + shape)
                want = np.empty(shape, dt)
                COMM.Scatter([_bytes(x), MPI.BYTE] if RANK == root else None, [_bytes(want), MPI.BYTE], root)
                got = mpicoll.scatter(x, root, comm=COMM, algorithm=algorithm)
                assert got.shape == shape and got.dtype == dt
                _eq(got, want)
            counts = _counts(P, root)
            flat = _vals(dt, sum(counts), root)
            got = mpicoll.scatter(flat, root, comm=COMM, counts=counts, algorithm=algorithm)
            s = sum(counts[:RANK])
            _eq(got, flat[s:s + counts[RANK]])
            if RANK != root:  # x=None with out
                out = np.empty(counts[RANK], dt)
                mpicoll.scatter(None, root, comm=COMM, out=out, counts=counts, algorithm=algorithm)
            else:  # in place at the root
                out = flat[s:s + counts[RANK]]
                mpicoll.scatter(flat, root, comm=COMM, out=out, counts=counts, algorithm=algorithm)
            _eq(out, flat[s:s + counts[RANK]])


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("gather"))
def test_gather(algorithm):
    for root in sorted({0, P - 1, P // 2}):
        for dt in DTYPES:
            for shape in SHAPES:
                n = int(np.prod(shape))
                x = _vals(dt, n, RANK + 3).reshape(shape)
                want = np.empty((P,) + shape, dt) if RANK == root else None
                COMM.Gather([_bytes(x), MPI.BYTE], [_bytes(want), MPI.BYTE] if RANK == root else None, root)
                got = mpicoll.gather(x, root, comm=COMM, algorithm=algorithm)
                if RANK == root:
                    assert got.shape == (P,) + shape
                    _eq(got, want)
                else:
                    assert got is None
            counts = _counts(P, root + 1)
            x = _vals(dt, counts[RANK], RANK)
            full = np.concatenate([_vals(dt, counts[r], r) for r in range(P)])
            got = mpicoll.gather(x, root, comm=COMM, counts=counts, algorithm=algorithm)
            if RANK == root:
                _eq(got, full)
                out = np.zeros(sum(counts), dt)  # in place: x is root's block of out
                s = sum(counts[:RANK])
                out[s:s + counts[RANK]] = x
                mpicoll.gather(out[s:s + counts[RANK]], root, comm=COMM, out=out, counts=counts, algorithm=algorithm)
                _eq(out, full)
            else:
                mpicoll.gather(x, root, comm=COMM, counts=counts, algorithm=algorithm)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("allgatherv"))
def test_allgatherv(algorithm):
    for dt in DTYPES:
        for seed in range(3):
            counts = _counts(P, seed) if seed else [0] * P
            x = _vals(dt, counts[RANK], RANK + seed)
            want = np.empty(sum(counts), dt)
            cb = [c * dt.itemsize for c in counts]
            COMM.Allgatherv([_bytes(x), MPI.BYTE], [_bytes(want), (cb, None), MPI.BYTE])
            got = mpicoll.allgatherv(x, counts, comm=COMM, algorithm=algorithm)
            _eq(got, want)
            out = np.zeros(sum(counts), dt)
            s = sum(counts[:RANK])
            out[s:s + counts[RANK]] = x
            mpicoll.allgatherv(out[s:s + counts[RANK]], counts, comm=COMM, out=out, algorithm=algorithm)
            _eq(out, want)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("alltoall"))
def test_alltoall(algorithm):
    for dt in DTYPES:
        for shape in SHAPES:
            x = _vals(dt, P * int(np.prod(shape)), RANK).reshape((P,) + shape)
            want = np.empty_like(x)
            COMM.Alltoall([_bytes(x), MPI.BYTE], [_bytes(want), MPI.BYTE])
            _eq(mpicoll.alltoall(x, comm=COMM, algorithm=algorithm), want)
            y = x.copy()
            mpicoll.alltoall(y, comm=COMM, out=y, algorithm=algorithm)
            _eq(y, want)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("alltoallv"))
def test_alltoallv(algorithm):
    for dt in DTYPES:
        for seed in range(3):
            table = np.random.default_rng(seed).integers(0, 6, (P, P)) * (seed > 0)  # [i][j]: i sends j
            sc, rc = [int(c) for c in table[RANK]], [int(c) for c in table[:, RANK]]
            x = _vals(dt, sum(sc), RANK * 5 + seed)
            want = np.empty(sum(rc), dt)
            isz = dt.itemsize
            COMM.Alltoallv([_bytes(x), ([c * isz for c in sc], None), MPI.BYTE],
                           [_bytes(want), ([c * isz for c in rc], None), MPI.BYTE])
            _eq(mpicoll.alltoallv(x, sc, rc, comm=COMM, algorithm=algorithm), want)


def _cases():
    """(name, start(), expected) for several nonblocking calls at once."""
    dt = np.dtype(np.int32)
    counts = [r + 1 for r in range(P)]
    x = np.arange(P * 4, dtype=dt).reshape(P, 4) + 100 * RANK
    cases = []
    for alg in mpicoll.algorithms("alltoall"):
        want = np.empty_like(x)
        COMM.Alltoall(x, want)
        cases.append((f"alltoall/{alg}", lambda a=alg: mpicoll.ialltoall(x, comm=COMM, algorithm=a), want))
    for alg in mpicoll.algorithms("allgatherv"):
        mine = np.full(counts[RANK], RANK, dt)
        want = np.concatenate([np.full(c, r, dt) for r, c in enumerate(counts)])
        cases.append((f"allgatherv/{alg}", lambda a=alg, m=mine: mpicoll.iallgatherv(m, counts, comm=COMM,
                                                                                    algorithm=a), want))
    for alg in mpicoll.algorithms("scatter"):
        full = np.arange(P * 3, dtype=dt).reshape(P, 3)
        cases.append((f"scatter/{alg}", lambda a=alg, f=full: mpicoll.iscatter(f, P - 1, comm=COMM, algorithm=a),
                      full[RANK]))
    for alg in mpicoll.algorithms("gather"):
        mine = np.full(2, RANK, dt)
        want = np.repeat(np.arange(P, dtype=dt), 2).reshape(P, 2) if RANK == 0 else None
        cases.append((f"gather/{alg}", lambda a=alg, m=mine: mpicoll.igather(m, 0, comm=COMM, algorithm=a), want))
    for alg in mpicoll.algorithms("alltoallv"):
        sc = [(RANK + j) % 3 for j in range(P)]
        rc = [(i + RANK) % 3 for i in range(P)]
        xs = np.arange(sum(sc), dtype=dt) + 1000 * RANK
        want = np.empty(sum(rc), dt)
        COMM.Alltoallv([xs, (sc, None)], [want, (rc, None)])
        cases.append((f"alltoallv/{alg}", lambda a=alg, xs=xs, sc=sc, rc=rc: mpicoll.ialltoallv(
            xs, sc, rc, comm=COMM, algorithm=a), want))
    return cases


def test_nonblocking_many_outstanding():
    cases = _cases()
    reqs = [start() for _, start, _ in cases]
    order = list(range(len(reqs)))
    np.random.default_rng(RANK).shuffle(order)  # a different completion order on every rank
    for i in order:
        got = reqs[i].wait()
        name, _, want = cases[i]
        if want is None:
            assert got is None, name
        else:
            _eq(got, want)


@pytest.mark.parametrize("collective", ["scatter", "gather", "allgatherv", "alltoall", "alltoallv"])
def test_persistent(collective):
    dt = np.dtype(np.float32)
    for alg in mpicoll.algorithms(collective):
        for it in range(3):
            if collective == "scatter":
                full = (np.arange(P * 5, dtype=dt).reshape(P, 5))
                if it == 0:
                    req = mpicoll.scatter_init(full, 0, comm=COMM, algorithm=alg)
                    buf = full
                buf[...] = full + it
                want = full[RANK] + it if False else buf[RANK].copy()
            elif collective == "gather":
                if it == 0:
                    buf = np.zeros(5, dt)
                    req = mpicoll.gather_init(buf, 0, comm=COMM, algorithm=alg)
                buf[...] = RANK + it
                want = np.repeat(np.arange(P, dtype=dt) + it, 5).reshape(P, 5) if RANK == 0 else None
            elif collective == "allgatherv":
                counts = [r % 3 for r in range(P)]
                if it == 0:
                    buf = np.zeros(counts[RANK], dt)
                    req = mpicoll.allgatherv_init(buf, counts, comm=COMM, algorithm=alg)
                buf[...] = RANK + it
                want = np.concatenate([np.full(c, r + it, dt) for r, c in enumerate(counts)])
            elif collective == "alltoall":
                if it == 0:
                    buf = np.zeros((P, 2), dt)
                    req = mpicoll.alltoall_init(buf, comm=COMM, algorithm=alg)
                buf[...] = np.arange(P)[:, None] * 10 + RANK + it
                want = np.empty_like(buf)
                COMM.Alltoall(buf, want)
            else:
                sc = [1 + (j % 2) for j in range(P)]
                rc = [1 + (RANK % 2)] * P
                if it == 0:
                    buf = np.zeros(sum(sc), dt)
                    req = mpicoll.alltoallv_init(buf, sc, rc, comm=COMM, algorithm=alg)
                buf[...] = np.arange(buf.size) + RANK * 100 + it
                want = np.empty(sum(rc), dt)
                COMM.Alltoallv([buf, (sc, None)], [want, (rc, None)])
            req.start()
            got = req.wait()
            if want is None:
                assert got is None
            else:
                _eq(got, want)
        req.free()


def _comm_cases(mc, plain, alg):
    """(label, call(comm, ...) -> None) pairs run on mpicoll.Comm and on plain
    mpi4py with fresh, identical buffers; returns the buffers to compare."""
    dt = np.float64
    counts = [(r * 3) % 5 for r in range(P)]
    displs = [sum(counts[:r]) for r in range(P)]
    total = sum(counts)
    root = P - 1
    yield "Scatter", lambda c: (lambda s, r: (c.Scatter(s, r, root), r))(
        np.arange(P * 4, dtype=dt) if RANK == root else None, np.zeros(4, dt))
    yield "Scatterv", lambda c: (lambda s, r: (c.Scatterv([s, (counts, displs), MPI.DOUBLE] if RANK == root else None,
                                                          r, root), r))(np.arange(total, dtype=dt), np.zeros(counts[RANK], dt))
    yield "Gather", lambda c: (lambda s, r: (c.Gather(s, r, root), r))(np.full(3, RANK, dt), np.zeros(3 * P, dt))
    yield "Gatherv", lambda c: (lambda s, r: (c.Gatherv(s, [r, (counts, displs), MPI.DOUBLE], root), r))(
        np.full(counts[RANK], RANK, dt), np.zeros(total, dt))
    yield "Gather in place", lambda c: (lambda r: (c.Gather(MPI.IN_PLACE if RANK == root else r[:2], r, root), r))(
        np.full(2 * P, RANK, dt))
    yield "Allgatherv", lambda c: (lambda s, r: (c.Allgatherv(s, [r, (counts, None), MPI.DOUBLE]), r))(
        np.full(counts[RANK], RANK + 0.5, dt), np.zeros(total, dt))
    yield "Allgatherv in place", lambda c: (lambda r: (r.__setitem__(slice(displs[RANK], displs[RANK] + counts[RANK]), RANK),
                                                       c.Allgatherv(MPI.IN_PLACE, [r, counts]), r)[1:])(np.zeros(total, dt))
    yield "Alltoall", lambda c: (lambda s, r: (c.Alltoall(s, r), r))(np.arange(2 * P, dtype=np.int32) + 100 * RANK,
                                                                     np.zeros(2 * P, np.int32))
    yield "Alltoall in place", lambda c: (lambda r: (c.Alltoall(MPI.IN_PLACE, r), r))(np.arange(P, dtype=np.int16) + RANK)
    sc = [(RANK + j) % 3 for j in range(P)]
    rc = [(i + RANK) % 3 for i in range(P)]
    yield "Alltoallv", lambda c: (lambda s, r: (c.Alltoallv([s, (sc, None), MPI.INT], [r, (rc, None), MPI.INT]), r))(
        np.arange(sum(sc), dtype=np.int32) + 10 * RANK, np.zeros(sum(rc), np.int32))


@pytest.mark.parametrize("algorithm", ["auto", "mpi", "linear", "tree", "ring", "shift", "pairwise", "bruck"])
def test_comm_methods(algorithm):
    mc = mpicoll.Comm(COMM)
    method_coll = {"Scatter": "scatter", "Scatterv": "scatter", "Gather": "gather", "Gatherv": "gather",
                   "Allgatherv": "allgatherv", "Alltoall": "alltoall", "Alltoallv": "alltoallv"}
    for label, call in _comm_cases(mc, COMM, algorithm):
        coll = method_coll[label.split()[0]]
        if algorithm not in mpicoll.algorithms(coll):
            continue
        _, want = call(COMM)

        class _Wrap:  # the same calls, with algorithm= added
            def __getattr__(self, name):
                return lambda *a: getattr(mc, name)(*a, algorithm=algorithm)
        _, got = call(_Wrap())
        _eq(got, want)


def test_comm_nonblocking_and_persistent():
    mc = mpicoll.Comm(COMM)
    x = np.arange(3 * P, dtype=np.float32) + RANK
    want = np.empty_like(x)
    COMM.Alltoall(x, want)
    y1, y2 = np.empty_like(x), np.empty_like(x)
    reqs = [mc.Ialltoall(x, y1, algorithm="bruck"), mc.Ialltoall(x, y2, algorithm="pairwise")]
    for i in ((1, 0) if RANK % 2 else (0, 1)):
        reqs[i].Wait()
    _eq(y1, want)
    _eq(y2, want)
    counts = [1 + r % 2 for r in range(P)]
    mine = np.full(counts[RANK], RANK, np.int64)
    out = np.zeros(sum(counts), np.int64)
    req = mc.Allgatherv_init(mine, [out, counts], algorithm="ring")
    for it in range(3):
        mine[...] = RANK + it
        req.Start()
        req.Wait()
        _eq(out, np.concatenate([np.full(c, r + it, np.int64) for r, c in enumerate(counts)]))
    req.Free()
    # a derived datatype: mpi4py's own method
    vec = MPI.INT.Create_vector(2, 1, 2).Commit()
    s = np.arange(4 * P, dtype=np.int32)
    r1, r2 = np.zeros(4 * P, np.int32), np.zeros(4 * P, np.int32)
    COMM.Alltoall([s, 1, vec], [r1, 1, vec])
    mc.Alltoall([s, 1, vec], [r2, 1, vec])
    vec.Free()
    _eq(r1, r2)
