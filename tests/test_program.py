"""Compiled schedules (program.py, executor.c) against the generators they
were recorded from: the same bits, for every compilable algorithm.

Serial part: all p ranks simulated in one process (counting.simulate runs the
generators, program.run_simulated the recorded programs), p = 1..9 with
awkward counts, every dtype family, in place and out of place. MPI part:
the C executor against the generator's blocking driver on the same inputs,
p = 1..5, and the executor's errors.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from mpicoll import algorithms as alg
from mpicoll import counting, dtypes, program, schedule
from mpicoll.arguments import reduction as _reduction

COMPILABLE = [n for n in alg.names("allreduce") if n != "auto" and alg.get("allreduce", n).compilable]
KNOBS = {"knomial": [{}, {"radix": 3}, {"radix": 5}], "ring": [{}, {"segment_bytes": 16}],
         "hetero_ring": [{}, {"segment_bytes": 8}],
         # no node layout in the simulation: nodes of ppn ranks, one node included
         "cascade": [{"ppn": 2}, {"ppn": 3}, {"ppn": 3, "cross": "ring"}, {"ppn": 9}]}


def reduction(op, dtype):
    return _reduction(op, dtypes.of_numpy(np.dtype(dtype)))


COUNTS = lambda p: sorted({0, 1, max(p - 1, 0), p + 1, 37, 3 * p + 2})  # noqa: E731


def test_registry_marks_the_point_to_point_allreduces():
    # A test that cannot pass by accident: these are the algorithms whose
    # recording must match; a new algorithm opts in explicitly.
    assert {"ring", "recursive_doubling", "rabenseifner", "tree", "knomial", "hetero_ring", "cascade"} \
        <= set(COMPILABLE)
    for name in ("mpi", "shm", "hierarchical"):
        assert not alg.get("allreduce", name).compilable


def _inputs(p, n, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        xs = [rng.standard_normal(n).astype(dtype) for _ in range(p)]
        if n > 3:
            xs[p // 2][3] = np.nan  # NaN travels through min/max and sum alike
            xs[0][1] = -0.0
    else:
        xs = [rng.integers(-50, 50, n).astype(dtype) for _ in range(p)]
    return xs


class _St:
    def __init__(self, rank, size):
        self.rank, self.size, self.comm, self.extra = rank, size, None, {}


def _generator_result(name, knobs, xs, red, in_place):
    p = len(xs)
    bufs = [x.copy() if in_place else np.full_like(x, 7) for x in xs]
    srcs = [None if in_place else x.copy() for x in xs]
    sched = alg.get("allreduce", name).schedule
    counting.simulate(p, lambda ctx, s: sched(ctx, bufs[ctx.rank], red, srcs[ctx.rank], **knobs))
    return bufs


def _program_result(name, knobs, xs, red, in_place):
    p = len(xs)
    sched = alg.get("allreduce", name).schedule
    progs = [program.record(sched, _St(r, p), xs[r].size, xs[r].dtype, red, not in_place, knobs) for r in range(p)]
    bufs = [x.copy() if in_place else np.full_like(x, 7) for x in xs]
    srcs = [None if in_place else x.copy() for x in xs]
    program.run_simulated(progs, bufs, srcs, red)
    return bufs, progs


@pytest.mark.parametrize("p", range(1, 10))
@pytest.mark.parametrize("name", COMPILABLE)
def test_program_matches_generator(p, name):
    for knobs in KNOBS.get(name, [{}]):
        for n in COUNTS(p):
            for dtype, op in (("float32", "sum"), ("float64", "max"), ("int32", "sum"), ("int16", "min"),
                              ("float16", "sum")):
                red = reduction(op, dtype)
                xs = _inputs(p, n, dtype, seed=p * 1000 + n)
                for in_place in (True, False):
                    want = _generator_result(name, knobs, xs, red, in_place)
                    got, progs = _program_result(name, knobs, xs, red, in_place)
                    for r in range(p):
                        assert got[r].tobytes() == want[r].tobytes(), (name, knobs, p, n, dtype, op, in_place, r)
                    if dtype == "float32" and op == "sum":
                        # and against numpy (the generator could be wrong too)
                        ref = np.sum(np.stack(xs), axis=0, dtype=np.float32) if n else np.zeros(0, np.float32)
                        np.testing.assert_allclose(got[0], ref, rtol=1e-5, atol=1e-5)


def test_program_counts_match_the_counting_driver():
    p, n = 6, 1000
    red = reduction("sum", "float32")
    for name in COMPILABLE:
        sched = alg.get("allreduce", name).schedule
        knobs = KNOBS.get(name, [{}])[0]  # (cascade: a layout; the simulation has no nodes)
        bufs = [np.ones(n, np.float32) for _ in range(p)]
        stats = counting.simulate(p, lambda ctx, s: sched(ctx, bufs[ctx.rank], counting.CountingReduction(red, s),
                                                          None, **knobs))
        for r in range(p):
            prog = program.record(sched, _St(r, p), n, np.float32, red, False, knobs)
            sends = [s for s in prog.steps if s[0] == program.SEND]
            assert len(sends) == stats[r].messages, name
            assert sum(int(s[4]) for s in sends) == stats[r].bytes_sent, name


def test_not_compilable_is_refused():
    red = reduction("sum", "float32")

    def makes_its_own_array(ctx, buf, red, src=None):
        tmp = np.empty_like(buf)  # not from ctx.scratch: the recording cannot rebind it
        yield [ctx.send(tmp, 0), ctx.recv(buf, 0)]

    def native(ctx, buf, red, src=None):
        yield [ctx.native(lambda: None, lambda: None)]

    for sched in (makes_its_own_array, native):
        with pytest.raises(program.NotCompilable):
            program.record(sched, _St(0, 2), 8, np.float32, red, False)


def test_simulated_mismatch_is_caught():
    red = reduction("sum", "float32")
    sched = alg.get("allreduce", "recursive_doubling").schedule
    progs = [program.record(sched, _St(0, 2), 4, np.float32, red, False),
             program.record(sched, _St(1, 2), 5, np.float32, red, False)]
    with pytest.raises(RuntimeError, match="expected"):
        program.run_simulated(progs, [np.zeros(4, np.float32), np.zeros(5, np.float32)],
                              [np.ones(4, np.float32), np.ones(5, np.float32)], red)


# ---- under MPI: the C executor against the generator's blocking driver ----------

def _mpi_state():
    from mpi4py import MPI

    from mpicoll.commstate import state
    return state(MPI.COMM_WORLD, None, "allreduce")


def _by_generator(st, name, knobs, x, red, in_place):
    buf = x.copy() if in_place else np.full_like(x, 7)
    src = None if in_place else x
    seq, tag = st.next_seq()
    ctx = schedule.Context(st, tag, st.pool, ("allreduce", name, buf.nbytes, seq))
    schedule.run(alg.get("allreduce", name).schedule(ctx, buf, red, src, **knobs))
    return buf


@pytest.mark.mpi
def test_executor_matches_generator_mpi():
    from mpicoll import executor
    if not executor.available():
        if os.environ.get("MPICOLL_EXPECT_MPI"):  # set by the Makefile, whose install builds it
            pytest.fail(f"the executor is not built: {executor.why_not()}")
        pytest.skip(executor.why_not())
    st = _mpi_state()
    p, r = st.size, st.rank
    for name in COMPILABLE:
        sched = alg.get("allreduce", name).schedule
        for knobs in KNOBS.get(name, [{}]):
            for n in COUNTS(p):
                for dtype, op in (("float32", "sum"), ("float64", "max"), ("int32", "sum"), ("float16", "sum")):
                    red = reduction(op, dtype)
                    x = _inputs(p, n, dtype, seed=p * 1000 + n)[r]
                    for in_place in (True, False):
                        want = _by_generator(st, name, knobs, x, red, in_place)
                        prog = program.record(sched, st, n, x.dtype, red, not in_place, knobs)
                        exe = executor.Executable(prog, st, red, "allreduce", name)
                        for blocking in (True, False):
                            buf = x.copy() if in_place else np.full_like(x, 7)
                            src = None if in_place else x
                            seq, tag = st.next_seq()
                            if blocking:
                                exe.run(buf, src, tag, seq)
                            else:
                                exe.start(buf, src, tag, seq, exe.new_kit({}), buf, None, None, buf.nbytes).wait()
                            assert buf.tobytes() == want.tobytes(), (name, knobs, n, dtype, op, in_place, blocking)


@pytest.mark.mpi
def test_kept_allreduce_runs_compiled_and_matches_mpi():
    """Through the front door: the second call of a signature runs the
    compiled program (its kept entry holds an Executable), and every call
    equals MPI_Allreduce's values."""
    import mpicoll
    from mpi4py import MPI

    from mpicoll import executor
    from mpicoll.commstate import state
    comm = MPI.COMM_WORLD.Dup()  # its plan cache holds this test's entries only
    try:
        p, r = comm.size, comm.rank
        for name in ("recursive_doubling", "ring", "rabenseifner"):
            for n in (1, p + 1, 1000):
                x = np.arange(n, dtype=np.float64) * (r + 1) + 0.5
                ref = np.empty_like(x)
                comm.Allreduce(x, ref)
                for _ in range(3):
                    got = mpicoll.allreduce(x, out=np.empty_like(x), algorithm=name, comm=comm)
                    np.testing.assert_array_equal(got, ref)
                    np.testing.assert_array_equal(mpicoll.iallreduce(x.copy(), algorithm=name, comm=comm).wait(), ref)
                    y = x.copy()
                    np.testing.assert_array_equal(mpicoll.allreduce(y, out=y, algorithm=name, op="avg", comm=comm),
                                                  ref / p)
        if p > 1 and executor.enabled():
            kept = [k for k in state(comm).plans._d.values() if getattr(k, "entry", None) is not None]
            assert len(kept) == 3 * 3 * 3 and all(isinstance(k.exe, executor.Executable) for k in kept)
    finally:
        comm.Free()


@pytest.mark.mpi
def test_executor_size_mismatch_is_an_error_on_every_rank():
    from mpicoll import executor
    from mpicoll.errors import MismatchError
    st = _mpi_state()
    if st.size != 2:
        pytest.skip("two ranks with different counts")
    red = reduction("sum", "float32")
    n = 4 + st.rank  # rank 1 has one element more
    prog = program.record(alg.get("allreduce", "recursive_doubling").schedule, st, n, np.float32, red, False)
    exe = executor.Executable(prog, st, red, "allreduce", "recursive_doubling")
    seq, tag = st.next_seq()
    with pytest.raises(MismatchError, match="recursive doubling round 0"):
        exe.run(np.zeros(n, np.float32), None, tag, seq)
    # the state was replaced: the next (matching) call works
    prog = program.record(alg.get("allreduce", "recursive_doubling").schedule, st, 4, np.float32, red, False)
    exe = executor.Executable(prog, st, red, "allreduce", "recursive_doubling")
    buf = np.ones(4, np.float32)
    seq, tag = st.next_seq()
    exe.run(buf, None, tag, seq)
    assert (buf == 2).all()


@pytest.mark.mpi
def test_executor_start_completes_at_once_or_under_the_engine():
    """A nonblocking run whose peer's messages are already there when it is
    posted completes inside start (a completed request, its finish run
    there); the peer's, posted first, goes to the engine. An error met
    while posting is raised by wait(), as one met later would be."""
    import time

    from mpi4py import MPI

    from mpicoll import engine, executor
    from mpicoll.errors import MismatchError
    if not executor.available():
        pytest.skip(executor.why_not())
    st = _mpi_state()
    if st.size != 2:
        pytest.skip("one rank posts late: two ranks")
    comm, r = MPI.COMM_WORLD, st.rank
    sched = alg.get("allreduce", "recursive_doubling").schedule
    red = reduction("avg", "float64")
    x = np.arange(5.0) + r
    exe = executor.Executable(program.record(sched, st, 5, x.dtype, red, False), st, red, "allreduce", "rd")
    for late in (0, 1):
        buf, finished = x.copy(), []

        def finish():
            red.finish(buf, 2)
            finished.append(True)
        comm.Barrier()
        if r == late:
            time.sleep(0.05)  # the peer's message has arrived before this rank posts
        seq, tag = st.next_seq()
        req = exe.start(buf, None, tag, seq, exe.new_kit({}), buf, finish, None, buf.nbytes)
        if r == late:
            assert isinstance(req, engine._Done) and finished == [True]
        assert req.wait() is buf and finished == [True]
        np.testing.assert_array_equal(buf, np.arange(5.0) + 0.5)
    # Counts that differ: the late rank meets the mismatch while posting.
    n = 4 + r
    bad = executor.Executable(program.record(sched, st, n, x.dtype, red, False), st, red, "allreduce", "rd")
    comm.Barrier()
    if r == 0:
        time.sleep(0.05)
    seq, tag = st.next_seq()
    req = bad.start(np.zeros(n), None, tag, seq, bad.new_kit({}), None, None, None, 8 * n)
    with pytest.raises(MismatchError, match="recursive doubling round 0"):
        req.wait()
    comm.Barrier()
