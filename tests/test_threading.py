"""The engine's threading contract (docs/architecture.md, "Threading
contract"): errors stay on their request, a freed communicator keeps its
duplicate while requests are pending, tags are taken under a lock,
callbacks have run when wait() returns and may not start collectives, the
progress thread survives errors. Run under mpiexec (``make test``)."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import native
from conftest import exact_values, reference
from mpicoll import commstate as _comm
from mpicoll import engine
from mpicoll import schedule as _sched

pytestmark = pytest.mark.mpi


@pytest.fixture
def thread_on():
    """The progress thread on (restored afterwards), collectively."""
    was = engine._engine.enabled
    engine.set_progress_thread(True)
    yield engine.progress_thread_active()
    MPI.COMM_WORLD.Barrier()
    engine.set_progress_thread(was)


def _self_context():
    """A schedule context on this rank alone (mpicoll's duplicate of COMM_SELF)."""
    st = _comm.state(MPI.COMM_SELF)
    _, tag = st.next_seq()
    return _sched.Context(st, tag, {}, ("test", "local", 8, 0))


def _fails_at_step_2():
    """A local schedule: one message to itself, then an error."""
    ctx = _self_context()
    out = np.zeros(2)
    yield [ctx.send(np.ones(2), 0), ctx.recv(out, 0)]
    raise ValueError("step 2 failed")


def _fails_posting():
    """A local schedule whose first message goes to a rank that does not exist."""
    ctx = _self_context()
    yield [ctx.recv(np.zeros(2), 0), ctx.send(np.ones(2), 5)]


def _truncated():
    """A receive too short for its message: the size check fails in _ready."""
    ctx = _self_context()
    yield [ctx.send(np.ones(2), 0), ctx.recv(np.zeros(1), 0)]


def _fine():
    ctx = _self_context()
    yield [ctx.send(np.ones(2), 0), ctx.recv(np.zeros(2), 0)]


def _bad_finish():
    raise KeyError("finish failed")


def _expect_good(req, inputs, p):
    np.testing.assert_array_equal(req.wait(), reference(inputs, "sum", p))


@pytest.mark.parametrize("mode", ["thread", "no-thread"])
def test_error_stays_on_its_request(mode):
    """Four requests fail (in a step, while posting, in the size check, in
    the finishing work) while a real all-reduce is in flight: each failure is
    raised by its own wait() only, none stays in the active list, and the
    progress thread lives on."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    was = engine._engine.enabled
    engine.set_progress_thread(mode == "thread")
    try:
        n = 70001
        inputs = [exact_values("float32", "sum", n, 3 * r + 1) for r in range(p)]
        good = mpicoll.iallreduce(inputs[rank], algorithm="ring")
        bad = [(engine.start(_fails_at_step_2()), ValueError),
               (engine.start(_fails_posting()), MPI.Exception),
               (engine.start(_truncated()), mpicoll.MismatchError),
               (engine.start(_fine(), finish=_bad_finish), KeyError)]
        good2 = mpicoll.iallreduce(inputs[rank], algorithm="recursive_doubling")
        _expect_good(good, inputs, p)  # none of the failures shows up here
        for req, kind in bad:
            with pytest.raises(kind):
                req.wait()
            assert req.done
        _expect_good(good2, inputs, p)
        assert not any(r for r, _ in bad if r in engine._engine.active)
        if engine.progress_thread_active() and engine._engine.thread is not None:
            assert engine._engine.thread.is_alive()
    finally:
        comm.Barrier()
        engine.set_progress_thread(was)


def test_error_on_the_progress_thread_keeps_it_alive(thread_on):
    """A request that fails while the progress thread advances it: the
    thread records the error and serves the next requests."""
    if not thread_on:
        pytest.skip("no progress thread (MPI_THREAD_MULTIPLE unavailable)")
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    mpicoll.iallreduce(np.ones(4, np.float32), algorithm="ring").wait()  # the thread exists
    for _ in range(3):
        req = engine.start(_fails_posting_at_step_2())  # nbytes defaults to "large": the thread is woken
        deadline = time.monotonic() + 60
        while not req.done and time.monotonic() < deadline:
            time.sleep(0.001)  # left to the thread: this thread does not drive progress
        assert req.done
        with pytest.raises(MPI.Exception):
            req.test()
        assert engine._engine.thread.is_alive()
    inputs = [exact_values("float32", "sum", 1000, r) for r in range(p)]
    _expect_good(mpicoll.iallreduce(inputs[rank], algorithm="ring"), inputs, p)


@pytest.mark.parametrize("algorithm", ["ring", "mpi", "auto"])
def test_free_communicator_with_request_pending(algorithm):
    """MPI lets a program free a communicator while a nonblocking collective
    on it is pending: mpicoll's duplicate must live until that request
    completes, and another communicator's request is unaffected."""
    world = MPI.COMM_WORLD
    p, rank = world.size, world.rank
    n = 5000
    inputs = [exact_values("float32", "sum", n, 7 * r + 2) for r in range(p)]
    mine = world.Dup()
    other = world.Dup()
    try:
        mpicoll.allreduce(np.zeros(1), comm=mine)  # the state exists
        st = _comm.state(mine)
        req = mpicoll.iallreduce(inputs[rank], comm=mine, algorithm=algorithm)
        req_other = mpicoll.iallreduce(inputs[rank], comm=other, algorithm=algorithm)
        mine.Free()
        assert st.freed
        if not req.done:
            assert st.comm != MPI.COMM_NULL, "the duplicate was freed with a request pending"
        _expect_good(req, inputs, p)
        _expect_good(req_other, inputs, p)
        assert st.pending == 0 and st.comm == MPI.COMM_NULL  # freed by the last request
        _expect_good(mpicoll.iallreduce(inputs[rank], comm=other, algorithm=algorithm), inputs, p)
    finally:
        other.Free()
        if mine != MPI.COMM_NULL:
            mine.Free()


def test_next_seq_numbers_are_never_taken_twice():
    """Threads taking call numbers at once each get their own: with a thread
    switch every microsecond, 4 threads x 20000 numbers are exactly the
    numbers 0..79999 after the start. (Checked: a plain counter read and
    written with a function call between the two loses numbers here;
    without the call CPython 3.11 happens not to switch threads between
    them, which no Python promises.)"""
    st = _comm.state(MPI.COMM_SELF)
    start = st.next_seq()[0] + 1
    got = [[] for _ in range(4)]

    def take(mine):
        for _ in range(20000):
            mine.append(st.next_seq()[0])

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=take, args=(g,)) for g in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(old)
    numbers = sorted(n for g in got for n in g)
    assert numbers == list(range(start, start + 80000))
    assert st.seq == start + 80000


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_every_call_takes_one_number_from_the_counter(algorithm, monkeypatch):
    """Blocking, nonblocking and persistent calls, scheduled and native, kept
    or not, each take exactly one number from the state's counter - through
    CommState.next_seq, or in C from the same itertools.count (a kept
    blocking call of the library's algorithm or of a compiled schedule,
    from its third call: csrc/native.c) - and
    ``seq`` always says the next one."""
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("one rank: nothing is sent, no number is taken")
    x = np.ones(10)
    mpicoll.allreduce(x, algorithm=algorithm)  # the state exists
    st = _comm.state(comm)
    calls = []
    plain = type(st).next_seq

    def counted():
        calls.append(1)
        return plain(st)

    monkeypatch.setattr(st, "next_seq", counted, raising=False)
    before = st.seq
    for _ in range(4):
        mpicoll.allreduce(x, algorithm=algorithm)
    mpicoll.iallreduce(x, algorithm=algorithm).wait()
    pers = mpicoll.allreduce_init(x, algorithm=algorithm)
    pers()
    pers()
    pers.free()
    assert st.seq - before == 7
    from mpicoll import executor
    if not native.enabled() or (algorithm == "ring" and not executor.enabled()):
        assert len(calls) == 7  # every one through next_seq
    else:
        assert len(calls) < 7  # the kept blocking calls took theirs in C (the library's call, or ring's program)
    taken = plain(st)[0]
    assert taken == before + 7 and st.seq == taken + 1  # the counter and seq agree


def _fails_posting_at_step_2():
    ctx = _self_context()
    yield [ctx.send(np.ones(2), 0), ctx.recv(np.zeros(2), 0)]
    yield [ctx.send(np.ones(2), 5)]


def test_collective_from_a_callback_is_an_error():
    """A done-callback that starts a collective gets a clear RuntimeError
    (the ranks could not order it), whichever thread runs it."""
    comm = MPI.COMM_WORLD
    seen = []

    def cb(r):
        try:
            mpicoll.iallreduce(np.ones(3), algorithm="ring")
        except RuntimeError as exc:
            seen.append(str(exc))

    req = mpicoll.iallreduce(np.ones(1000), algorithm="ring")
    req.add_done_callback(cb)
    req.wait()
    req.add_done_callback(cb)  # already complete: runs at once, same rule
    assert len(seen) == 2 and all("done-callback" in s for s in seen)
    comm.Barrier()
    # The thread-local mark is gone: a collective from the program's flow works.
    np.testing.assert_array_equal(mpicoll.allreduce(np.ones(2)), np.full(2, comm.size))


def test_persistent_start_keeps_the_gate_and_the_callback_rule():
    """A persistent request's start (the library's algorithm: its checks
    written out in persistent.py) refuses another thread inside a collective
    on the communicator and a start from a done-callback, as every door
    does, and then starts as usual."""
    comm = MPI.COMM_WORLD
    x, y = np.ones(4), np.empty(4)
    pers = mpicoll.allreduce_init(x, out=y, algorithm="mpi")
    st = _comm.state(comm)
    try:
        assert st.busy.acquire(False)  # as if another thread were inside a collective
        try:
            with pytest.raises(RuntimeError, match="another thread"):
                pers.start()
        finally:
            st.busy.release()
        seen = []

        def cb(r):
            try:
                pers.start()
            except RuntimeError as exc:
                seen.append(str(exc))

        req = mpicoll.iallreduce(np.ones(3))
        req.wait()
        req.add_done_callback(cb)  # complete: runs at once, under the callback rule
        assert len(seen) == 1 and "done-callback" in seen[0]
        before = st.seq
        np.testing.assert_array_equal(pers(), np.full(4, comm.size))
        assert st.seq == before + (comm.size > 1)  # (one rank: nothing is sent, no number taken)
    finally:
        pers.free()


def test_callbacks_have_run_when_wait_returns(thread_on):
    """The progress thread observes completion and runs a slow callback;
    wait() on the caller's thread returns only after it ran. A callback may
    wait() for its own request."""
    if not thread_on:
        pytest.skip("no progress thread (MPI_THREAD_MULTIPLE unavailable)")
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("one rank: the request completes as it starts")
    for _ in range(3):
        ran = []

        def slow(r):
            r.wait()  # its own request, from inside its callback: returns at once
            time.sleep(0.2)
            ran.append(r)

        req = mpicoll.iallreduce(np.ones(1 << 20, np.float32), algorithm="ring")  # 4 MiB: wakes the thread
        req.add_done_callback(slow)
        deadline = time.monotonic() + 60
        while not req._finished and time.monotonic() < deadline:
            time.sleep(0.001)  # the thread, not this one, observes completion
        req.wait()
        assert ran == [req]
        comm.Barrier()


@pytest.mark.parametrize("when", ["idle", "in flight"])
def test_switch_interval_restored_to_the_one_in_force(when):
    """The engine lowers the interpreter's switch interval while the progress
    thread works, and then restores the value the program set since import,
    also when the program set it while the lowered one was in force (it
    once put back the value from before, losing the program's)."""
    if not engine.progress_thread_active():
        pytest.skip("no progress thread")
    comm = MPI.COMM_WORLD
    if when == "in flight" and comm.Get_size() == 1:
        pytest.skip("one rank: a request completes when it starts")
    was = sys.getswitchinterval()
    try:
        if when == "idle":
            sys.setswitchinterval(0.0123)
        for _ in range(3):
            req = mpicoll.iallreduce(np.ones(1 << 20, np.float32), algorithm="ring")  # 4 MiB: wakes the thread
            if when == "in flight":
                with engine._engine.lock:
                    lowered = engine._engine.saved_interval is not None
                sys.setswitchinterval(0.0123)
            req.wait()
        if when == "in flight":
            # The case this checks happened at least once on some rank.
            assert any(comm.allgather(lowered)), "the interval was never lowered while a request was in flight"
        # Once the thread sleeps with nothing to do (a late wake-up lowers
        # it again for a moment: wait for that to pass).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine._engine.lock:
                if engine._engine.sleeping and abs(sys.getswitchinterval() - 0.0123) < 1e-9:
                    break
            time.sleep(0.001)
        assert abs(sys.getswitchinterval() - 0.0123) < 1e-9
    finally:
        comm.Barrier()
        sys.setswitchinterval(was)


@pytest.mark.parametrize("mode", ["thread", "no-thread"])
def test_torch_futures_complete_through_the_engine(mode):
    """The torch backend's futures (collectives, sends and receives) are
    completed by the engine: mpicoll runs no thread of its own but the
    progress thread, and none at all when it is turned off."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    if p > 4:  # before importing torch, most of the cost (~9 s at p=8 on 2 cores)
        pytest.skip("torch tests run at p <= 4")
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    import mpicoll.torch  # noqa: F401

    was = engine._engine.enabled
    engine.set_progress_thread(mode == "thread")
    dist.init_process_group("mpicoll", init_method="mpi://")
    try:
        before = {t.name for t in threading.enumerate()}
        t = torch.full((1000,), float(rank + 1))
        fut = dist.all_reduce(t, async_op=True).get_future()
        if mode == "no-thread":
            assert fut.done(), "without a progress thread the future is completed at once"
        fut.wait()
        assert torch.equal(t, torch.full((1000,), float(p * (p + 1) // 2)))
        if p > 1:
            got = torch.zeros(5)
            right, left = (rank + 1) % p, (rank - 1) % p
            s = dist.isend(torch.full((5,), float(rank)), right)
            r = dist.irecv(got, left)
            r.get_future().wait()
            s.get_future().wait()
            assert torch.equal(got, torch.full((5,), float(left)))
        ours = {t.name for t in threading.enumerate()} - before
        assert all(name == "mpicoll-progress" for name in ours), ours
        assert not any(t.name.startswith("mpicoll") and t.name != "mpicoll-progress"
                       for t in threading.enumerate())
        if mode == "no-thread":
            assert "mpicoll-progress" not in ours
    finally:
        dist.destroy_process_group()
        comm.Barrier()
        engine.set_progress_thread(was)


def _c_requests() -> bool:
    """Whether short native requests are made and waited for in C
    (csrc/native.c, bound by engine.use_native)."""
    return native.enabled() and engine.NativeRequest.wait is not engine.NativeRequest._wait_py


@pytest.mark.parametrize("mode", ["thread", "no-thread"])
def test_short_native_requests_made_and_waited_in_c_keep_the_contract(mode, monkeypatch):
    """A repeated short ``iallreduce``/``ibcast`` of the library's algorithm
    is started whole in C, its request made there (no engine.start_native),
    and its wait() runs the engine's alone path in C. It keeps every rule
    of the Python path: the communicator's state held once and released
    once (a missed release would grow it), callbacks run before wait()
    returns, a wait with a scheduled request in flight goes through the
    engine (opposite orders on the ranks: blocking in MPI_Wait would
    deadlock), a freed communicator's duplicate lives until the request
    completes."""
    if not _c_requests():
        pytest.skip("native calls not built or turned off")
    world = MPI.COMM_WORLD
    p, rank = world.size, world.rank
    was = engine._engine.enabled
    engine.set_progress_thread(mode == "thread")
    started = []
    real = engine.start_native
    monkeypatch.setattr(engine, "start_native", lambda *a, **k: started.append(a) or real(*a, **k))
    comm = world.Dup()
    try:
        inputs = [exact_values("float64", "sum", 3, 5 * r + 1) for r in range(p)]
        want = reference(inputs, "sum", p)
        st = _comm.state(comm)
        out = np.empty(3)
        for i in range(6):  # the first calls keep and gate the signature; then C serves it
            held = st.pending
            req = mpicoll.iallreduce(inputs[rank], comm=comm, out=out, algorithm="mpi")
            assert type(req) is engine.NativeRequest or p == 1
            fired = []
            req.add_done_callback(lambda r: fired.append(r.done or r._finished))
            assert req.wait() is out
            np.testing.assert_array_equal(out, want)
            assert fired == [True] and req.done and st.pending == held
            b = np.full(4, float(rank))
            got = mpicoll.ibcast(b, 1 % p, comm=comm).wait()
            assert got is b and b.tolist() == [float(1 % p)] * 4 and st.pending == held
        n_started = len(started)
        for i in range(3):
            # plain wait()s, no callbacks: the C path whole
            req = mpicoll.iallreduce(inputs[rank], comm=comm, out=out, algorithm="mpi")
            assert req.wait() is out and req.done and st.pending == 0
            np.testing.assert_array_equal(out, want)
        assert len(started) == n_started, "a gated short call went through engine.start_native"
        # With a scheduled request in flight: rank 0 waits for its short
        # request first, while the others finish the scheduled one before
        # they even start theirs; rank 0 blocking in MPI_Wait would hang.
        big = [exact_values("float32", "sum", 50001, 3 * r) for r in range(p)]
        ring = mpicoll.iallreduce(big[rank], comm=comm, algorithm="ring")
        if rank == 0:
            mpicoll.iallreduce(inputs[rank], comm=comm, out=out, algorithm="mpi").wait()
            ring.wait()
        else:
            ring.wait()
            mpicoll.iallreduce(inputs[rank], comm=comm, out=out, algorithm="mpi").wait()
        np.testing.assert_array_equal(ring.result, reference(big, "sum", p))
        np.testing.assert_array_equal(out, want)
        assert st.pending == 0
        # the user's communicator freed with a C-made request pending
        req = mpicoll.iallreduce(inputs[rank], comm=comm, out=out, algorithm="mpi")
        comm.Free()
        assert st.freed
        if not req.done:
            assert st.comm != MPI.COMM_NULL, "the duplicate was freed with a request pending"
        assert req.wait() is out
        np.testing.assert_array_equal(out, want)
        assert st.pending == 0 and st.comm == MPI.COMM_NULL
    finally:
        if comm != MPI.COMM_NULL:
            comm.Free()
        world.Barrier()
        engine.set_progress_thread(was)


class _Failing:
    """An MPI request stand-in whose MPI_Wait fails."""

    def Test(self):  # noqa: N802
        return False

    def Wait(self):  # noqa: N802
        raise ValueError("the library's wait failed")


class _Complete:
    def Test(self):  # noqa: N802
        return True

    def Wait(self):  # noqa: N802
        return True


def test_native_wait_in_c_records_errors_and_runs_finishes_once():
    """The C wait's other roads: the library's error is recorded on that
    request (raised by its wait(), the request complete and out of the
    engine's list), and a request with finishing work goes through
    the Python wait, which runs it exactly once."""
    if not _c_requests():
        pytest.skip("native calls not built or turned off")
    req = engine.NativeRequest(_Failing())
    with pytest.raises(ValueError, match="wait failed"):
        req.wait()
    assert req.done and req not in engine._engine.active
    assert req.wait() is None  # raised once, as every request's error (Request._raise)
    ran = []
    req = engine.NativeRequest(_Complete(), "r", finish=lambda: ran.append(1))
    assert req.wait() == "r" and req.wait() == "r" and ran == [1] and req.done


@pytest.mark.skipif(not native.available(), reason="mpicoll._native_* is not built for this MPI")
@pytest.mark.parametrize("gate", [False, True])
def test_mpicolls_locks_keep_threading_locks_meaning(gate):
    """The engine's lock and the communicators' gates are csrc/native.c's
    Lock (the C paths take them in a C call): threading.Lock's
    acquire/release/locked/context manager, timeouts, mutual exclusion
    between threads, a Condition over it, and a blocking acquire that a
    signal handler's exception interrupts."""
    import signal
    m = native._mod.Lock(gate=gate)
    assert type(engine._engine.lock) is type(m) and type(_comm.state(MPI.COMM_WORLD).busy) is type(m)
    assert m.acquire() is True and m.locked() and m.acquire(False) is False
    t0 = time.monotonic()
    assert m.acquire(timeout=0.05) is False and time.monotonic() - t0 >= 0.04
    with pytest.raises(ValueError):
        m.acquire(False, 1)
    m.release()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        m.release()
    with m:
        assert m.locked()
    assert not m.locked()
    count, inside = [0], [0]

    def work():
        for _ in range(5000):
            with m:
                inside[0] += 1
                assert inside[0] == 1
                count[0] += 1
                inside[0] -= 1
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert count[0] == 20000
    c = threading.Condition(m)
    got = []

    def waiter():
        with c:
            got.append(c.wait(5))
    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        with c:
            c.notify()
        time.sleep(0.01)
    t.join()
    assert got == [True]
    if threading.current_thread() is threading.main_thread():
        def boom(*_):
            raise KeyboardInterrupt
        old = signal.signal(signal.SIGALRM, boom)
        m.acquire()
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                m.acquire()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            m.release()
