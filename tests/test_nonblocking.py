"""Nonblocking all-reduce: every state machine x awkward counts x dtypes,
several outstanding operations on one communicator completed in different
orders on different ranks, with the progress thread on and off, against
numpy and blocking MPI_Allreduce. Run under mpiexec (``make test``)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import IdenticalEverywhere, assert_identical_everywhere, exact_values, reference
from mpicoll import engine

pytestmark = pytest.mark.mpi

ALGORITHMS = mpicoll.algorithms("allreduce")


@pytest.fixture(params=["thread", "no-thread"])
def progress_mode(request):
    """Runs a test with the progress thread on, then off (collectively: every
    rank switches at the same point, between operations)."""
    was = engine._engine.enabled
    engine.set_progress_thread(request.param == "thread")
    yield request.param
    engine.set_progress_thread(was)


def counts_for(p):
    return sorted({0, 1, max(p - 1, 1), 2 * p + 1, 1000, 70001})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_iallreduce_exact(algorithm):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    same = IdenticalEverywhere(comm)
    for name, op in (("float32", "sum"), ("int64", "bxor"), ("float16", "max"), ("float64", "avg"),
                     ("bfloat16", "sum")):
        for n in counts_for(p) if name == "float32" else (0, p + 1, 5000):
            inputs = [exact_values(name, "sum" if op == "avg" else op, n, 31 * r + 7) for r in range(p)]
            want = reference(inputs, op, p)
            x = inputs[rank].copy()
            got = mpicoll.iallreduce(x, op=op, algorithm=algorithm).wait()
            np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64),
                                          err_msg=f"{algorithm} {op} {name} n={n}")
            np.testing.assert_array_equal(x, inputs[rank])  # input untouched
            same.add(got, what=f"{algorithm} {op} {name} n={n}")
            req = mpicoll.iallreduce(x, op=op, out=x, algorithm=algorithm)  # in place
            assert req.wait() is x
            np.testing.assert_array_equal(x.astype(np.float64), want.astype(np.float64))
    same.check()


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_iallreduce_without_progress_thread(algorithm):
    """The state machines advanced only by wait()/test() calls."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    was = engine._engine.enabled
    engine.set_progress_thread(False)
    try:
        for n in counts_for(p):
            inputs = [exact_values("float32", "sum", n, 5 * r + 1) for r in range(p)]
            req = mpicoll.iallreduce(inputs[rank], algorithm=algorithm)
            while not req.test():
                pass
            np.testing.assert_array_equal(req.wait(), reference(inputs, "sum", p), err_msg=f"n={n}")
    finally:
        engine.set_progress_thread(was)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_outstanding_operations_of_one_kept_signature(algorithm, progress_mode):
    """Seven calls of one signature in flight at once, rounds after rounds:
    a compiled kept plan gives each run its own kit and files completed
    ones for the next runs (executor.take_kit); each rank waits in its own
    order. Every result is checked, and the filed kits stay few."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    n, k = 2 * p + 3, 7
    rng = np.random.default_rng(rank)
    for rnd in range(6):
        xs = [np.full(n, rank + 10 * i + rnd, np.float32) for i in range(k)]
        outs = [np.empty_like(x) for x in xs]
        reqs = [mpicoll.iallreduce(x, out=o, algorithm=algorithm) for x, o in zip(xs, outs)]
        for i in rng.permutation(k):
            reqs[i].wait()
        for i in range(k):
            want = sum(q + 10 * i + rnd for q in range(p))
            np.testing.assert_array_equal(outs[i], np.full(n, want, np.float32), err_msg=f"round {rnd}, call {i}")
    from mpicoll.commstate import state
    for kept in state(comm).plans._d.values():
        exe = getattr(kept, "exe", None)
        if exe:
            assert len(exe.idle) <= exe.IDLE_KITS


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_outstanding_operations_complete_in_any_order(algorithm, progress_mode):
    """Five operations of different sizes in flight on one communicator (and
    one on a split of it); each rank waits for them in its own order, some
    with test() polling, some with waitall."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    sizes = [70001, 1, 0, 3000, 2 * p + 1]
    inputs = [[exact_values("float32", "sum", n, 1000 * k + r) for r in range(p)] for k, n in enumerate(sizes)]
    reqs = [mpicoll.iallreduce(inputs[k][rank], algorithm=algorithm) for k in range(len(sizes))]
    half = comm.Split(rank % 2, rank)
    hx = np.full(4097, rank + 1, np.int32)
    hreq = mpicoll.iallreduce(hx, comm=half, algorithm=algorithm)
    order = np.random.default_rng(rank).permutation(len(sizes))
    for k in order[:2]:
        while not reqs[k].test():
            pass
    for k in order[2:4]:
        reqs[k].wait()
    results = mpicoll.waitall(reqs + [hreq])
    for k in range(len(sizes)):
        np.testing.assert_array_equal(results[k], reference(inputs[k], "sum", p), err_msg=f"op {k}")
        assert reqs[k].test() and reqs[k].done
    assert (results[-1] == sum(r + 1 for r in range(rank % 2, p, 2))).all()
    half.Free()


def test_matches_mpi_allreduce_and_overlaps_blocking_calls(progress_mode):
    """Random floats vs MPI_Allreduce, with blocking mpicoll calls and user
    point-to-point traffic issued while the operations are outstanding."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(100_003)
    native = np.empty_like(x)
    comm.Allreduce(x, native, MPI.SUM)
    reqs = [mpicoll.iallreduce(x, algorithm=a) for a in ("ring", "recursive_doubling", "mpi")]
    y = mpicoll.allreduce(x, algorithm="ring")  # a blocking call in between
    token = comm.sendrecv(comm.rank, dest=(comm.rank + 1) % comm.size, source=(comm.rank - 1) % comm.size)
    assert token == (comm.rank - 1) % comm.size
    tol = 8 * comm.size * np.finfo(np.float64).eps * np.abs(x).max() * comm.size
    for got in mpicoll.waitall(reqs) + [y]:
        np.testing.assert_allclose(got, native, rtol=0, atol=tol)
        assert_identical_everywhere(comm, got)


def test_bad_arguments_raise_before_any_message():
    """Only rank 0 makes the mistakes: had one of them sent a message or
    started an operation (taken a sequence number), the valid operation
    after it would mismatch or hang (under the test's timeout) on the
    ranks that made none."""
    comm = MPI.COMM_WORLD
    x = np.ones(8, np.float32)
    if comm.rank == 0:
        with pytest.raises(ValueError, match="unknown allreduce algorithm"):
            mpicoll.iallreduce(x, algorithm="nope")
        with pytest.raises(TypeError):
            mpicoll.iallreduce(x, algorithm=3)
        with pytest.raises(TypeError, match="integer"):
            mpicoll.iallreduce(x, op="bxor")
        with pytest.raises(ValueError, match="shape"):
            mpicoll.iallreduce(x, out=np.empty(7, np.float32))
        with pytest.raises(TypeError, match="timeout"):
            mpicoll.iallreduce(x, timeout="soon")
        with pytest.raises(TypeError):
            mpicoll.waitall([object()])
    got = mpicoll.iallreduce(np.full(5, comm.rank + 1.0)).wait()
    assert (got == comm.size * (comm.size + 1) / 2).all()


def test_progress_thread_switch():
    """The switch really starts and stops the background progress: with it
    on, a multi-step schedule completes while this rank only sleeps (and
    the thread is there); with it off, the same schedule stays where its
    first step left it until wait() drives it."""
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("MPI without MPI_THREAD_MULTIPLE: no progress thread")
    import threading
    import time

    comm = MPI.COMM_WORLD
    x = np.ones(1 << 18, np.float32)  # 1 MiB: the generator under the engine, several ring steps
    was = engine._engine.enabled
    try:
        engine.set_progress_thread(True)
        assert engine.progress_thread_active()
        req = mpicoll.iallreduce(x, algorithm="ring", comm=comm)
        end = time.monotonic() + 30
        while not req.done and time.monotonic() < end:
            time.sleep(0.01)  # neither test() nor wait()
        assert req.done, "the progress thread did not complete the operation"
        if comm.size > 1:  # (one rank: done at start, no thread needed)
            assert any(t.name == "mpicoll-progress" and t.is_alive() for t in threading.enumerate())
        assert (req.wait() == comm.size).all()

        engine.set_progress_thread(False)
        assert not engine.progress_thread_active()
        comm.Barrier()
        req = mpicoll.iallreduce(x, algorithm="ring", comm=comm)
        time.sleep(0.3)
        stalled = not req.done
        assert (req.wait() == comm.size).all()
        if comm.size > 1:  # (one rank: nothing to exchange, done at start)
            assert stalled, "the operation advanced with the progress thread off"
    finally:
        engine.set_progress_thread(was)


def test_progress_thread_advances_without_test_calls():
    """With the thread on, an operation completes while this rank never calls
    test()/wait() (it only sleeps), which is what overlap needs: the MPI
    library's own long I-call too (MPI advances it only inside MPI calls,
    so the progress thread must be testing it)."""
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("MPI without MPI_THREAD_MULTIPLE: no progress thread")
    import time

    comm = MPI.COMM_WORLD
    was = engine._engine.enabled
    engine.set_progress_thread(True)
    try:
        for algorithm in ("ring", "recursive_doubling", "mpi"):
            # long enough to be listed for the thread, the library's own call included
            n = max(engine.WAKE_MIN_BYTES, engine.NATIVE_LIST_MIN_BYTES) // 4 + 1000
            req = mpicoll.iallreduce(np.ones(n, np.float32), algorithm=algorithm)
            deadline = time.monotonic() + 30
            while not req.done and time.monotonic() < deadline:
                time.sleep(0.01)
            assert req.done, f"{algorithm}: the progress thread did not complete the operation"
            assert (req.wait() == comm.size).all()
    finally:
        engine.set_progress_thread(was)


def test_short_operations_wait_for_a_wake_up_and_a_callback_can_skip_it(monkeypatch):
    """A short operation does not wake a sleeping progress thread (its caller
    is expected to wait() soon); engine.drive() hands it over when its time
    is up, and so does a done-callback unless it says wake=False.

    What is checked is whether the engine notifies a sleeping thread, not
    whether the operation happened to complete without one: the latter is
    timing (a thread already stirring for its own bookkeeping may pick the
    request up, harmlessly), and failed now and then on a quiet machine."""
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("MPI without MPI_THREAD_MULTIPLE: no progress thread")
    import time

    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("one rank: operations complete when they start")
    eng = engine._engine
    was = eng.enabled
    engine.set_progress_thread(True)
    notified = []  # one entry per wake-up of a sleeping thread
    real_wake = eng.wake_locked

    def counting_wake():
        if eng.sleeping and eng.use_thread():
            notified.append(1)
        real_wake()

    monkeypatch.setattr(eng, "wake_locked", counting_wake)

    def completes_within(req, seconds):
        deadline = time.monotonic() + seconds
        while not req.done and time.monotonic() < deadline:
            time.sleep(0.005)
        return req.done

    def thread_asleep():
        """Whether the progress thread is asleep with nothing outstanding
        (waited for up to 60 s)."""
        mpicoll.iallreduce(np.ones(8, np.float32), algorithm="ring").wait()  # the thread exists
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with eng.lock:
                if eng.sleeping and not eng.active:
                    return True
            time.sleep(0.001)
        return False

    # Every rank runs every step and the verdicts are compared together, so
    # a rank whose check fails does not leave the other waiting in the next
    # collective.
    try:
        fired = []
        asleep = thread_asleep()
        del notified[:]
        req = mpicoll.iallreduce(np.ones(8, np.float32), algorithm="ring")  # 32 B: no wake-up
        req.add_done_callback(fired.append, wake=False)
        quiet = not notified
        engine.drive(req, 0.0)  # one round of progress here, then the thread's
        handed_over = completes_within(req, 60) and fired == [req]
        asleep_again = thread_asleep()
        del notified[:]
        req = mpicoll.iallreduce(np.ones(8, np.float32), algorithm="ring")
        req.add_done_callback(fired.append)  # wake=True: someone relies on the callback
        rung = bool(notified) or req.done  # (done already: nothing to wake for)
        woken = completes_within(req, 60) and fired[-1] is req
        verdicts = comm.allgather((asleep, quiet, handed_over, asleep_again, rung, woken))
    finally:
        comm.Barrier()
        engine.set_progress_thread(was)
    assert all(v[0] and v[3] for v in verdicts), f"the progress thread never went to sleep: {verdicts}"
    assert all(v[1] for v in verdicts), f"a short operation woke the sleeping progress thread: {verdicts}"
    assert all(v[2] for v in verdicts), f"drive() did not hand the operation to the thread: {verdicts}"
    assert all(v[4] and v[5] for v in verdicts), f"a callback with wake=True did not wake the thread: {verdicts}"


def _simulated(algorithm, xs):
    """Every rank's all-reduce of ``xs`` by ``algorithm``'s schedule, run by
    the simulated driver: all ranks in this process, no MPI."""
    from mpicoll import counting, dtypes, kernels, ops, registry

    red = kernels.Reduction(ops.resolve("sum"), dtypes.BY_NAME["float32"])
    bufs = [x.copy() for x in xs]
    counting.simulate(len(xs), lambda ctx, s: registry.get("allreduce", algorithm).schedule(ctx, bufs[ctx.rank],
                                                                                            red, None))
    return bufs


def _order_sensitive(n, p):
    """float32 vectors whose sum's bits depend on the order of the additions
    (magnitudes 1e-3 to 1e3 across ranks), the same on every rank."""
    return [(np.random.default_rng(1000 * n + r).standard_normal(n) * 10.0 ** (r % 7 - 3)).astype(np.float32)
            for r in range(p)]


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "tree", "knomial"])
def test_same_bits_as_the_blocking_algorithm(algorithm):
    """The blocking driver (the generator at the first call, then the kept
    plan's compiled program), the nonblocking driver and the simulated
    driver - a third run of the same schedule, in one process and without
    MPI, independent of the two under test - give the same bits, for counts
    0, 1, p-1 and not divisible by p. The data make the order of the
    additions show in the bits: at p >= 3 another schedule's result differs
    (checked), so agreement is not an accident of the data.

    All three run the same generator, so a bug in the schedule itself (a
    block combined twice, a contribution dropped) would make them agree on
    a wrong answer: the simulated bits are also checked against numpy's
    float64 sum of the inputs, which shares nothing with the schedule, to
    within float32 rounding of p additions."""
    comm = MPI.COMM_WORLD
    p = comm.size
    other = "ring" if algorithm != "ring" else "tree"  # (at p=3 the others all add left to right)
    order_shows = False
    for n in sorted({0, 1, max(p - 1, 1), 5, 1001, 70001}):
        xs = _order_sensitive(n, p)
        want = _simulated(algorithm, xs)[comm.rank]
        stacked = np.stack(xs).astype(np.float64) if n else np.zeros((p, 0))
        # p float32 additions: each rounds by at most eps/2 of a partial sum
        # no larger than the sum of magnitudes.
        tol = p * np.finfo(np.float32).eps * np.abs(stacked).sum(axis=0)
        np.testing.assert_array_less(np.abs(want.astype(np.float64) - stacked.sum(axis=0)), tol + 1e-30,
                                     err_msg=f"{algorithm}: the schedule's sum is not numpy's, n={n}")
        order_shows |= want.tobytes() != _simulated(other, xs)[comm.rank].tobytes()
        for i in range(3):  # a new plan, then the kept one (compiled below 64 KiB)
            a = mpicoll.allreduce(xs[comm.rank], algorithm=algorithm)
            b = mpicoll.iallreduce(xs[comm.rank], algorithm=algorithm).wait()
            assert a.tobytes() == want.tobytes(), f"blocking, n={n}, call {i}"
            assert b.tobytes() == want.tobytes(), f"nonblocking, n={n}, call {i}"
    assert order_shows or p < 3, "the data never made the order of additions visible"


@pytest.mark.parametrize("mode", ["thread", "no-thread"])
def test_native_requests_are_thin(mode):
    """With the MPI library's own algorithm, i-calls and persistent plans
    return a NativeRequest (the library's request, no schedule) that works
    wherever a Request does: wait/test/callbacks/waitall, mixed with
    scheduled requests waited for in a different order on each rank (a wait
    that blocked in the library here would deadlock), finishing work run
    exactly once (avg's division, reduce_scatter's block placement)."""

    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    was = engine._engine.enabled
    engine.set_progress_thread(mode == "thread")
    try:
        n = 3 * p + 1
        inputs = [exact_values("float64", "sum", n, 11 * r + 3) for r in range(p)]
        want_avg = reference(inputs, "avg", p)
        want_sum = reference(inputs, "sum", p)
        req = mpicoll.iallreduce(inputs[rank], op="avg", algorithm="mpi")
        assert isinstance(req, engine.NativeRequest if p > 1 else mpicoll.Request)  # p = 1: nothing to send
        fired = []
        req.add_done_callback(fired.append)
        while not req.test():
            pass
        np.testing.assert_array_equal(req.wait(), want_avg)
        assert fired == [req] and req.done
        big = [exact_values("float32", "sum", 70001, 5 * r) for r in range(p)]
        reqs = [mpicoll.iallreduce(big[rank], algorithm="ring"),
                mpicoll.iallreduce(inputs[rank], algorithm="mpi"),
                mpicoll.ireduce_scatter(inputs[rank], algorithm="mpi"),
                mpicoll.iallreduce(big[rank], algorithm="recursive_doubling")]
        order = list(range(len(reqs)))
        order = order[rank % len(order):] + order[:rank % len(order)]
        got = {}
        for i in order:
            got[i] = reqs[i].wait()
        np.testing.assert_array_equal(got[0], reference(big, "sum", p))
        np.testing.assert_array_equal(got[1], want_sum)
        np.testing.assert_array_equal(got[3], reference(big, "sum", p))
        counts = [n // p + (1 if r < n % p else 0) for r in range(p)]
        lo = sum(counts[:rank])
        np.testing.assert_array_equal(got[2], want_sum[lo:lo + counts[rank]])
        assert mpicoll.waitall([mpicoll.iallreduce(inputs[rank], algorithm="mpi")])[0].tolist() \
            == want_sum.tolist()
        x = inputs[rank].copy()
        pers = mpicoll.allreduce_init(x, op="avg", algorithm="mpi")
        for i in range(4):
            x[:] = inputs[rank]
            pers.start()
            # The library's started request itself: handed to the engine
            # only by test() or by a wait() that finds others in flight.
            assert pers._req is None or pers._mpi is None
            if i % 2:
                while not pers.test():
                    pass
            np.testing.assert_array_equal(pers.wait(), want_avg)
        other = mpicoll.iallreduce(big[rank], algorithm="ring")  # in flight: wait() goes through the engine
        pers.start()
        np.testing.assert_array_equal(pers.wait(), want_avg)
        np.testing.assert_array_equal(other.wait(), reference(big, "sum", p))
        pers.free()
        assert not engine._engine.active
    finally:
        comm.Barrier()
        engine.set_progress_thread(was)
