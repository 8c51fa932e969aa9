"""The nonblocking driver: requests and the progress engine.

A nonblocking call (``mpicoll.iallreduce``, ``ireduce_scatter``, ... or a
persistent plan's ``start()``) hands its schedule (a generator, see
``mpicoll.schedule``) to a ``Request``. The request posts the operations
the schedule yields and keeps them; whenever they have all completed it
checks the received sizes and resumes the schedule, which reduces and
yields the next operations, until the schedule ends. A call whose
algorithm is the MPI library's own (``mpi``) needs no schedule: its
``NativeRequest`` holds the library's MPI_I... request and nothing else.

Requests are advanced by ``progress()``:

* on every ``Request.test()`` and ``Request.wait()`` (``wait`` loops on it);
* by a background progress thread, when the MPI library was initialised with
  ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default; the MPICH and Open
  MPI wheels both grant it). It runs only while operations are outstanding,
  so communication advances while the caller computes. It is on by default;
  ``MPICOLL_PROGRESS_THREAD=0`` or ``set_progress_thread(False)`` turns it
  off, and then progress happens only inside test()/wait() (and inside the
  MPI library whenever the caller makes other MPI calls). A thread in
  ``wait()`` drives progress itself and the progress thread sleeps
  meanwhile; and an operation shorter than ``WAKE_MIN_BYTES`` does not wake a
  sleeping progress thread (waking it costs the caller a GIL hand-over, up
  to a millisecond on a busy machine, which a short operation that is waited
  for at once would pay for nothing).

``progress()`` always advances *every* outstanding operation, not only the
one being waited for: another rank may be waiting for a different operation
whose next message this rank has not posted yet, and waiting for ours alone
would deadlock. The one exception: a ``NativeRequest`` waited for while no
other request is outstanding blocks inside the MPI library (mpi4py releases
the GIL there), which is how a native collective reaches native cost.

The threading contract (docs/architecture.md, "Threading contract"):

* One process-wide lock guards every MPI request and schedule step, so the
  progress thread and the callers' test()/wait() never run a step
  concurrently. The engine's threads are the only background threads
  mpicoll runs: its progress thread (torch's futures are completed by it
  too) and, where csrc/native.c is built, that module's C thread, which
  tests the library's 1-4 MiB I-calls handed to it (NATIVE_BG_MIN_BYTES)
  under a mutex of its own, never touching a Python object; both exist only
  under ``MPI_THREAD_MULTIPLE`` and stop at interpreter exit, before
  MPI_Finalize.
* An error while posting, stepping or finishing one request is recorded on
  that request, raised by its own wait()/test(), and the request leaves the
  outstanding list: it never reaches another request's wait() nor ends the
  progress thread.
* A request is complete for its callers only once its done-callbacks have
  run: wait() does not return earlier, even when another thread observed the
  completion. Callbacks run without the lock held.
* A callback must not start a collective (``runtime.enter`` raises
  RuntimeError): it runs whenever the request completes, at a different
  point of the program on each rank, so the ranks would not start their
  collectives in the same order.
* Each request holds its communicator's state (``CommState.hold``), so a
  communicator freed with requests pending keeps mpicoll's duplicate until
  the last of them completes.

Deadlines: a request started with a deadline raises ``CollectiveTimeout``
(from wait()/test()) once the deadline passes with operations still
pending; the message names the step and the peers it was waiting for.

The caller must not modify the input, nor read or modify the output, until
the request is complete (as with ``MPI_Iallreduce``).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback

from mpi4py import MPI

from . import schedule as _sched
from .schedule import CUSTOM
from .builds import library_module
from .poll import poll

ENV_PROGRESS_THREAD = "MPICOLL_PROGRESS_THREAD"

# How often (seconds) the interpreter hands the GIL to the progress thread
# while operations are outstanding (see _Engine._run).
SWITCH_INTERVAL = 100e-6

# A waiting thread polls for this long before it starts yielding the core
# at each poll (as MPI's own blocking waits spin). Short: with more ranks
# than cores the peer we wait for needs this core. Measured (8-byte forced
# ring iallreduce().wait(), generator path, 2 cores, a loaded machine):
# p=3 2.4 ms per call with the earlier 2000 polls, 1.2 ms with 1 ms of spin,
# 0.36 ms with 0.2 ms; p=2 33 us with each of these, but 133 us without
# any spin (a yield to a busy machine's other processes).
SPIN_S = 2e-4

class _PerThread(threading.local):
    callbacks = 0  # > 0 while this thread runs done-callbacks (see in_callback())


_tls = _PerThread()
# How many threads are running done-callbacks right now: every collective
# asks in_callback(), and a thread-local read costs ~0.4 us, so the common
# answer (no thread is) comes from this count first. Changed under its lock.
_running_callbacks = 0
_running_lock = threading.Lock()


def in_callback() -> bool:
    """Whether this thread is running a request's done-callbacks."""
    return _running_callbacks > 0 and _tls.callbacks > 0


class Request:
    """An outstanding nonblocking collective. ``wait()`` returns the result
    (the output array; None on non-root ranks of a reduce); ``test()`` says
    whether it is complete (and advances every outstanding operation).
    ``Wait()``/``Test()`` are mpi4py-style aliases.

    Completion has two stages: ``_finished`` (set under the engine lock once
    the last step ran or an error was recorded) and ``_done`` (set once the
    done-callbacks have run, by ``_settle``). Callers only ever see the
    second."""

    def __init__(self, result=None, gen=None, finish=None, deadline=None, st=None):
        self.result = result
        self._gen = gen
        self._finish = finish  # called once, after the last step (avg's scaling, copies)
        self._ops = []
        self._reqs = []
        self._statuses = []
        self._custom = False
        self._error = None
        self._deadline = deadline
        self._callbacks = []
        self._finished = False
        self._done = False
        self._settler = None  # the thread running the callbacks (it may wait() for this request)
        self._st = st  # the CommState this request holds (released by _settle)

    @staticmethod
    def completed(result=None) -> "Request":
        """A request that is complete as it is made."""
        return _Done(result)

    # ---- called with the engine lock held ----
    def _start(self) -> None:
        self._step(True)

    def _step(self, first=False) -> None:
        try:
            ops = next(self._gen) if first else self._gen.send(None)
            while not ops:  # an empty batch: nothing to wait for
                ops = self._gen.send(None)
            for op in ops:
                if op.req is None:
                    _sched._post(op)
        except StopIteration:
            self._end()
            return
        except BaseException as exc:  # reported by this request's wait()/test(), on the caller's thread
            self._fail(exc)
            return
        self._ops = list(ops)
        self._custom = any(op.kind == CUSTOM for op in ops)
        self._reqs = [op.req for op in ops if op.kind != CUSTOM]
        self._statuses = [MPI.Status() for _ in self._reqs]

    def _end(self) -> None:
        """The last step ran: the finishing work, then complete."""
        try:
            if self._finish is not None:
                self._finish()
        except BaseException as exc:
            self._error = exc
        self._complete()

    def _fail(self, exc) -> None:
        # Operations already posted stay with the MPI library (a collective
        # cannot be cancelled); their buffers are kept by _abandoned.
        if self._ops:
            _abandoned.append(self._ops)
        self._error = exc
        self._complete()

    def _complete(self) -> None:
        self._ops, self._reqs, self._statuses, self._gen = [], [], [], None
        self._finished = True

    def _ready(self) -> bool:
        if self._custom:
            if not all(op.custom.test() for op in self._ops if op.kind == CUSTOM):
                return False
        try:
            done = MPI.Request.Testall(self._reqs, self._statuses) if self._reqs else True
        except MPI.Exception as exc:
            mops = [op for op in self._ops if op.kind != CUSTOM]
            err = _sched.receive_error(mops, exc, self._statuses)
            raise err if err is not None else exc
        if done:
            mops = [op for op in self._ops if op.kind != CUSTOM] if self._custom else self._ops
            _sched.check_received(mops, self._statuses)
        return done

    def _expired(self) -> BaseException:
        return _sched.timeout_error(self._ops)

    def _advance(self) -> int:
        """Run as many steps as the completed operations allow; returns how
        many ran (-1 once the request is finished). Never raises: an error
        is recorded on this request."""
        steps = 0
        while not self._finished:
            try:
                ready = self._ready()
                if not ready and self._deadline is not None and time.monotonic() >= self._deadline:
                    raise self._expired()
            except BaseException as exc:
                self._fail(exc)
                break
            if not ready:
                return steps
            self._step()
            steps += 1
        return -1

    # ---- public ----
    def _seen_done(self) -> bool:
        """Complete for this thread: done, or finished and this thread is the
        one running its callbacks (a callback sees its request complete and
        may wait() for it)."""
        return self._done or (self._finished and self._settler == threading.get_ident())

    done = property(_seen_done)

    def test(self) -> bool:
        if not self._done:
            _engine.progress()
            if not self._seen_done():
                return False
        self._raise()
        return True

    def wait(self):
        _engine.wait(self)
        self._raise()
        return self.result

    def add_done_callback(self, fn, wake: bool = True) -> None:
        """Call ``fn(request)`` once the request is complete (at once if it
        already is). It runs on whichever thread completed the request,
        possibly the progress thread, after the engine lock is released,
        and before wait() returns on any thread; it must not block on other
        mpicoll requests nor start a collective. Exceptions it raises are
        printed, not propagated.

        A callback usually means that someone relies on completion without
        calling wait() (a torch future waited on in C++), so the progress
        thread is woken, even for a short operation. ``wake=False`` leaves
        it asleep, for a caller that has another thread wait() for the
        request (waking it would cost a thread hand-over for nothing)."""
        _engine._not_stepping()
        with _engine.lock:
            if not self._finished:
                self._callbacks.append(fn)
                if wake:
                    _engine.wake_locked()
                return
        _call(fn, self)

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def Test(self, status=None) -> bool:  # noqa: N802 (mpi4py's spelling)
        return self.test()

    def Wait(self, status=None):  # noqa: N802
        self.wait()
        return True

    def __repr__(self):
        return f"<mpicoll.Request {'complete' if self.done else 'pending'}>"


class _Done(Request):
    """A request complete when it was made (a one-rank call, a short
    program that finished while it was being posted): none of the
    bookkeeping of one in flight, which would cost more than such a call
    takes. The class attributes stand in for what __init__ sets."""

    _finished = _done = True
    _gen = _finish = _error = _deadline = _settler = _st = None
    _ops = _reqs = _statuses = ()
    _custom = False

    def __init__(self, result=None):
        self.result = result
        self._callbacks = []

    def test(self) -> bool:
        self._raise()
        return True

    def wait(self):
        self._raise()
        return self.result


class _PyCore:
    """NativeRequest's fields where csrc/native.c is not built: what every
    request starts with, as class attributes (a short native call makes one
    request per call, and each instance attribute set in __init__ cost
    ~25 ns). Where it is built, its ``RequestCore`` holds them as a C
    struct, which the C wait reads and writes directly."""

    result = None
    _mpi = None
    _error = None
    _finished = False
    _done = False
    _settler = None
    _listed = False  # in the engine's list (engine lock)
    _blocking = False  # a thread waits for it in MPI_Wait: nobody else may touch _mpi
    _deadline = None
    _expired_fn = None
    _keep = None
    _finish = None
    _callbacks = None  # made by the first add_done_callback
    _st = None


_native_mod, _ = library_module("_native")
_Core = _native_mod.RequestCore if _native_mod is not None else _PyCore


class NativeRequest(_Core, Request):
    """A request that is one MPI request: the MPI library's own nonblocking
    (or started persistent) collective, or a point-to-point request handed
    to the engine (``watch``). No schedule, context or scratch: ``finish``
    runs once when the MPI request completes.

    It joins the engine's list only when something must notice its
    completion without its owner: a done-callback, a deadline, or a wait()
    while other requests are outstanding (then it is driven with them) -
    or when it is long (``NATIVE_LIST_MIN_BYTES``), so that the progress thread's
    tests advance it while the caller computes (the library moves a
    collective only inside MPI calls). Otherwise the MPI library advances it
    inside the caller's next MPI call (MPI's progress rule), and ``wait()``
    with no other request in the list (a long one is taken back from the
    thread) blocks in ``MPI_Wait``, the GIL released: a native collective at
    native cost.
    ``expired`` makes the timeout error when a deadline is given.

    ``keep``: whatever holds the memory the MPI call reads and writes (the
    caller's arrays, a plan with its scratch and staged copies), held until
    the request completes. mpi4py does not keep a nonblocking call's
    buffers alive, and Open MPI reads a send buffer after the I-call has
    returned: a temporary input, or a plan nobody else holds, would be freed
    and reused while the library still reads it."""

    # (the fields' defaults, and their storage, come from _Core: a
    # class attribute here would hide the C struct's member)

    def __init__(self, mpi_req, result=None, finish=None, deadline=None, st=None, expired=None, keep=None):
        self.result = result
        self._keep = keep
        self._mpi = mpi_req
        self._finish = finish
        self._st = st
        if deadline is not None:
            self._deadline = deadline
            self._expired_fn = expired

    def _start(self) -> None:
        pass  # posted by the caller (the I-call or Prequest.Start)

    def _complete(self) -> None:
        self._finished = True
        self._keep = None  # the library is done with the memory

    def _fail(self, exc) -> None:
        if self._mpi is not None and self._deadline is not None:
            # Still pending in the library: its buffers must outlive it.
            _abandoned.append((self._mpi, self._keep))
        self._error = exc
        self._complete()

    def _expired(self) -> BaseException:
        return self._expired_fn()

    def _advance(self) -> int:
        if self._finished:
            return -1
        try:
            if not self._mpi.Test():
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    raise self._expired()
                return 0
        except BaseException as exc:
            self._fail(exc)
            return -1
        self._end()
        return -1

    def test(self) -> bool:
        if not self._seen_done():
            _engine.list_native(self)  # from now on driven with the others
        return Request.test(self)

    def wait(self):
        if not self._done and not (self._finished and self._settler == threading.get_ident()):
            _engine.wait_native(self)
        if self._error is not None:
            self._raise()
        return self.result

    # Where csrc/native.c is built, ``wait`` is its C version (use_native):
    # the alone path of wait_native in C, falling back to this one.
    _wait_py = wait

    def add_done_callback(self, fn, wake: bool = True) -> None:
        _engine._not_stepping()
        with _engine.lock:
            if not self._finished:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                if not self._blocking:  # (a thread in MPI_Wait for it runs the callbacks itself)
                    _engine.list_locked(self)
                    if wake:
                        _engine.wake_locked()
                return
        _call(fn, self)

    def __repr__(self):
        return f"<mpicoll.NativeRequest {'complete' if self.done else 'pending'}>"


# Requests abandoned by an error or a deadline: MPI cannot cancel a
# collective, and if the missing rank turns up later the library still
# writes into their buffers, so these must outlive the exception.
_abandoned = []


def _call(fn, req) -> None:
    global _running_callbacks
    with _running_lock:
        _running_callbacks += 1
    _tls.callbacks += 1
    try:
        fn(req)
    except BaseException:  # a callback's failure must not take the progress thread down
        traceback.print_exc()
    finally:
        _tls.callbacks -= 1
        with _running_lock:
            _running_callbacks -= 1


def _settle(req, fns) -> None:
    """The last stage of completion, without the lock: run the callbacks,
    release the communicator, then mark the request done (so wait() returns
    only after its callbacks ran)."""
    if fns:
        req._settler = threading.get_ident()
        for fn in fns:
            _call(fn, req)
    st = req._st
    if st is not None:
        req._st = None
        try:
            st.release()
        except BaseException:  # freeing the duplicate failed: nothing the request can do about it
            traceback.print_exc()
    req._done = True
    req._settler = None


class _Engine:
    """The process-wide list of outstanding operations and the progress thread."""

    def __init__(self):
        # threading.Lock's meaning; csrc/native.c's Lock where it is built,
        # which the C wait takes and gives without calling its methods.
        self.lock = _native_mod.Lock() if _native_mod is not None else threading.Lock()
        self.active = []
        self.wake = threading.Condition(self.lock)
        self.waiters = 0  # threads in wait(), which drive progress themselves
        self._wlock = threading.Lock()
        self.sleeping = False  # the thread is blocked on `wake`
        self.saved_interval = None  # the switch interval before we lowered it (None: not lowered)
        self.lowered_to = None  # the interval we set, as the interpreter reports it
        self.thread = None
        self.stopping = False
        self.enabled = os.environ.get(ENV_PROGRESS_THREAD, "1").strip().lower() not in ("0", "false", "no", "off")
        # The thread running a step or a finish under the lock (see _not_stepping), or None.
        self.stepper = None

    def _not_stepping(self) -> None:
        """Refuse a call into the engine from a schedule step or a finish.

        The engine runs steps and finishes with its lock held, and the lock
        is not reentrant (a reentrant one would let a step start, test or
        wait for requests in the middle of advancing the list it is
        iterating). So nothing a step or a finish calls may use the engine:
        collective set-up in a step (shm's window growing, after a sync
        every rank of the node passed) calls MPI directly. A step that did
        call in would wait for itself for ever; this makes it a clear error,
        recorded on the request whose step it was."""
        s = self.stepper
        if s is not None and s == threading.get_ident():
            raise RuntimeError("mpicoll: a schedule step or a request's finishing work called into the progress "
                               "engine (start, test, wait or a callback); steps run under the engine's lock, "
                               "which is not reentrant - call MPI directly there")

    def stepping(self, fn, *args):
        """``fn(*args)`` (a step, a finish, the list's advance) marked as run
        by this thread under the lock, for _not_stepping. Lock held."""
        self.stepper = threading.get_ident()
        try:
            return fn(*args)
        finally:
            self.stepper = None

    def thread_available(self) -> bool:
        return MPI.Is_initialized() and not MPI.Is_finalized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE

    def start(self, req: Request, wake: bool = True) -> Request:
        self._not_stepping()
        st = req._st
        if st is not None:
            st.hold()
        with self.lock:
            self.stepping(req._start)
            if not req._finished:
                self.active.append(req)
                if wake:
                    # Waking the thread costs a GIL hand-over (measured: up to
                    # ~1 ms on a loaded 2-core machine), more than a short
                    # operation takes when its caller waits for it at once:
                    # short operations (wake=False) are left to the caller's
                    # wait()/test() unless the thread is awake anyway.
                    self.wake_locked()
                fns = None
            else:
                fns, req._callbacks = req._callbacks, []
        if fns is not None:
            _settle(req, fns)
        elif self.thread is None and self.use_thread():
            self._spawn()
        return req

    def use_thread(self) -> bool:
        return self.enabled and not self.stopping and self.thread_available()

    def _lower_interval(self) -> None:
        """Have the interpreter hand the GIL over within SWITCH_INTERVAL, not
        after the default 5 ms, remembering the interval in force now (the
        program may have set its own since import). Lock held."""
        if self.saved_interval is None:
            self.saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self.saved_interval, SWITCH_INTERVAL))
            self.lowered_to = sys.getswitchinterval()  # (rounded to microseconds by the interpreter)

    def _restore_interval(self) -> None:
        """Put back the interval in force before _lower_interval, unless the
        program has set one of its own meanwhile: that one stays."""
        if self.saved_interval is not None:
            if sys.getswitchinterval() == self.lowered_to:
                sys.setswitchinterval(self.saved_interval)
            self.saved_interval = None

    def wake_locked(self) -> None:
        """Wake the sleeping progress thread (called with the lock held)."""
        if self.sleeping and self.use_thread():
            self.wake.notify()
            # The woken thread needs the GIL to run at all (restored when
            # the thread goes idle).
            self._lower_interval()

    def _spawn(self) -> None:
        with self.lock:
            self._spawn_locked()

    def _spawn_locked(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="mpicoll-progress", daemon=True)
            self.thread.start()

    def _progress_locked(self):
        """(moved, [(finished request, its callbacks)] to settle after the
        lock is released)."""
        return self.stepping(self._advance_all)

    def _advance_all(self):
        moved = False
        still = []
        finished = []
        for req in self.active:
            steps = req._advance()  # never raises: errors stay on their request
            moved = moved or steps != 0
            if steps >= 0:
                still.append(req)
            else:
                finished.append((req, req._callbacks))
                req._callbacks = []
        self.active = still
        return moved, finished

    @staticmethod
    def _settle_all(finished) -> None:
        for req, fns in finished:
            _settle(req, fns)

    def progress(self) -> None:
        self._not_stepping()
        finished = ()
        with self.lock:
            if self.active:
                _, finished = self._progress_locked()
        if finished:
            self._settle_all(finished)

    def wait(self, req: Request, hot_for=None) -> bool:
        """The waiting thread drives progress itself: handing completion over
        from the progress thread (an Event, a GIL switch) costs hundreds of
        microseconds, more than a short all-reduce. While someone waits, the
        progress thread steps back (see _run). With ``hot_for`` (seconds)
        and a progress thread, stop after that long and leave the request to
        the thread (woken on the way out); returns whether it is complete."""
        if req._seen_done():
            return True
        self._not_stepping()
        until = None if hot_for is None or not self.use_thread() else time.monotonic() + hot_for
        with self._wlock:  # not the engine lock: the progress thread may hold that one
            self.waiters += 1

        def advance():
            finished = ()
            if not req._finished and self.lock.acquire(blocking=False):
                try:
                    if self.active:
                        _, finished = self._progress_locked()
                finally:
                    self.lock.release()
            if finished:
                self._settle_all(finished)
            # (A finished request not yet done: another thread is
            # running its callbacks; wait for it to end.)

        try:
            # Spin, then only yield the core at each poll (max_pause=0): on an
            # oversubscribed node the peer we wait for may need it, but a
            # sleep's wake-up would cost more than a short collective.
            poll(req._seen_done, until, advance=advance, spin_s=SPIN_S, max_pause=0.0)
        finally:
            with self._wlock:
                self.waiters -= 1
                last = self.waiters == 0
            if last and self.active:
                with self.lock:
                    self.wake_locked()
        return req._seen_done()

    def list_locked(self, req: NativeRequest) -> None:
        """Put a NativeRequest in the list (lock held), once."""
        if not req._listed and not req._finished:
            req._listed = True
            self.active.append(req)
            if self.thread is None and self.use_thread():
                self._spawn_locked()

    def list_native(self, req: NativeRequest) -> None:
        self._not_stepping()
        with self.lock:
            if not req._blocking:
                self.list_locked(req)

    def wait_native(self, req: NativeRequest) -> None:
        """wait() for a NativeRequest: in MPI_Wait (GIL released) while no
        request is in the list; otherwise listed and driven with the others."""
        if self.stepper is not None:
            self._not_stepping()
        with self.lock:
            alone = not req._finished and not req._blocking and (
                not self.active and not req._listed
                # listed only because it is long (start_native), and the only
                # one: taken back from the progress thread (it tests under
                # this lock, so it is not testing now)
                or req._listed and req._deadline is None and len(self.active) == 1 and self.active[0] is req)
            if alone:
                if req._listed:
                    self.active.clear()
                    req._listed = False
                req._blocking = True
            elif not req._blocking:
                self.list_locked(req)
        if not alone:
            self.wait(req)
            return
        try:
            req._mpi.Wait()
        except BaseException as exc:
            self.waited_failed(req, exc)
            return
        with self.lock:  # add_done_callback reads _finished under the lock
            if req._finish is None:  # nothing to run: no step to mark (see stepping)
                req._complete()
            else:
                self.stepping(req._end)
            fns, req._callbacks = req._callbacks, []
        _settle(req, fns)

    def waited_failed(self, req: NativeRequest, exc: BaseException) -> None:
        """The library's error from MPI_Wait in wait_native's alone path (or
        csrc/native.c's): recorded on the request, which is then settled."""
        with self.lock:
            req._fail(exc)
            fns, req._callbacks = req._callbacks, []
        _settle(req, fns)

    def _run(self) -> None:
        pause = 0.0
        while True:
            try:
                with self.lock:
                    # Block while there is nothing to do, or while a thread in
                    # wait() drives progress itself (two threads polling would
                    # only pass the GIL back and forth).
                    if not self.stopping and (not self.active or not self.enabled or self.waiters):
                        self.sleeping = True
                        while not self.stopping and (not self.active or not self.enabled or self.waiters):
                            # (Again after each wake-up: a waker lowered it.)
                            self._restore_interval()
                            pause = 0.0
                            self.wake.wait()
                        self.sleeping = False
                        # A computing caller releases the GIL inside every
                        # numpy loop but takes it straight back; a waiting
                        # thread only gets it when the interpreter forces a
                        # switch. While operations are outstanding, force it
                        # after SWITCH_INTERVAL so that the progress thread
                        # gets a turn about that often.
                        self._lower_interval()
                    if self.stopping:
                        self._restore_interval()
                        return
                    moved, finished = self._progress_locked()
                if finished:
                    self._settle_all(finished)
            except BaseException:  # a bug of ours: reported, and the thread goes on serving the others
                traceback.print_exc()
                moved = False
            # Poll fast while things move; otherwise back off to at most
            # 200 us so a computing caller keeps its cores.
            if moved:
                pause = 0.0
                time.sleep(0)
            else:
                pause = min(max(pause * 2, 10e-6), 200e-6)
                time.sleep(pause)

    def stop(self) -> None:
        """Stop the thread (at interpreter exit, before MPI_Finalize: mpi4py
        finalizes MPI after every atexit function has run), and csrc/native.c's
        C progress thread."""
        with self.lock:
            self.stopping = True
            self.wake.notify_all()
        if _native_mod is not None:
            _native_mod.stop_background()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        with self.lock:
            self._restore_interval()


_engine = _Engine()
atexit.register(_engine.stop)


# Operations of at least this many bytes wake the progress thread at start
# (see _Engine.start); shorter ones are advanced by the caller's wait()/test()
# and by the thread whenever it is awake for other operations.
WAKE_MIN_BYTES = 64 << 10


def start(gen, result=None, finish=None, deadline=None, nbytes: int = WAKE_MIN_BYTES, st=None) -> Request:
    """Start schedule ``gen`` as a nonblocking request (holding CommState
    ``st`` until it completes, if given)."""
    return _engine.start(Request(result, gen, finish, deadline, st), wake=nbytes >= WAKE_MIN_BYTES)


def submit(req: Request, nbytes: int = WAKE_MIN_BYTES) -> Request:
    """Start ``req``, a Request subclass that advances itself (``_start``,
    ``_advance``: the C executor's ProgramRequest), under the engine."""
    return _engine.start(req, wake=nbytes >= WAKE_MIN_BYTES)


def claim_alone(req: Request) -> bool:
    """Take ``req`` out of the engine's list when it is the only request
    there, so that the calling thread may finish it without the engine (one
    blocking call, the GIL released) and then hand it to finish_claimed.
    False (nothing done) when other requests are in flight: they need this
    thread's progress too."""
    _engine._not_stepping()
    with _engine.lock:
        active = _engine.active
        if req._finished or len(active) != 1 or active[0] is not req:
            return False
        _engine.active = []
        return True


def unclaim(req: Request) -> None:
    """Give a request claimed by claim_alone back to the engine, still
    pending (its caller was interrupted: Ctrl-C while a peer was late)."""
    with _engine.lock:
        if not req._finished and req not in _engine.active:
            _engine.active.append(req)


def finish_claimed(req: Request, settle, outcome) -> None:
    """End a request claimed by claim_alone: ``settle(outcome)`` under the
    lock (it ends or fails the request), then its callbacks."""
    with _engine.lock:
        _engine.stepping(settle, outcome)
        fns, req._callbacks = req._callbacks, []
    _settle(req, fns)


# From this many bytes a native request is listed for the progress thread
# (start_native). Waking the thread costs a GIL hand-over, paid by a caller
# that waits at once; measured at p=2 (MPICH): 64 KiB ibcast/iallreduce
# took 2x as long listed; 1 MiB 10-25 % longer, for 0-29 % overlap (a wash);
# 4 MiB 3 % longer, for 0 -> 59-60 % overlap (compute + comm 28 % shorter).
NATIVE_LIST_MIN_BYTES = 4 << 20

# From this many bytes (up to NATIVE_LIST_MIN_BYTES) a native request of
# csrc/native.c (the library's I-call made in C) is handed to that module's
# C progress thread (Req.background): it tests the request every 10 us
# without the GIL, so the library moves the message while the caller
# computes, pure Python included, where before nothing moved it until
# wait(). Measured at p = 2 on 2 cores (make bench-overlap, algorithm mpi,
# three runs each, overlap %): 1 MiB 0/0/12 -> 13-45 with numpy compute,
# 0/0/12 -> 9-47 with pure-Python compute; a wait() right after the start
# pays the thread's wake-up and tests (1 MiB: 0.17 -> 0.21 ms). From
# NATIVE_LIST_MIN_BYTES the Python progress thread's listing stays: with
# the C thread as well, numpy compute overlapped less there (16 MiB
# 56-66 % -> 28-51 %; two threads and two ranks on two cores), pure Python
# more (0-20 % -> 29-49 %).
NATIVE_BG_MIN_BYTES = 1 << 20
_native_req = _native_mod.Req if _native_mod is not None else None
# A program's run in flight (csrc/native.c's XRun: a gated program Call's
# I-run, long): the C thread runs its passes from NATIVE_BG_MIN_BYTES at
# every size (it needs the executor's passes, not only the library's
# tests, so nothing else would move it while the caller computes).
_native_xrun = _native_mod.XRun if _native_mod is not None else None


def start_native(mpi_req, result=None, finish=None, nbytes: int = WAKE_MIN_BYTES, st=None, deadline=None,
                 expired=None, keep=None) -> NativeRequest:
    """Hand an MPI request already started (the library's I-call, a started
    persistent request) to the engine; ``finish`` runs once it completes,
    ``keep`` (what holds its buffers) is held until then. Listed at once
    with a deadline, or when it is long (see NativeRequest)."""
    req = NativeRequest(mpi_req, result, finish, deadline, st, expired, keep)
    xrun = type(mpi_req) is _native_xrun
    if (deadline is None and NATIVE_BG_MIN_BYTES <= nbytes < NATIVE_LIST_MIN_BYTES
            and (xrun or type(mpi_req) is _native_req) and _engine.use_thread() and mpi_req.background()):
        # csrc/native.c's own thread tests it while the caller computes,
        # without the GIL (see NATIVE_BG_MIN_BYTES); wait() finds it
        # complete, or waits for the rest in MPI_Wait.
        if xrun:
            # Listed as well, not woken: the engine holds a program's run
            # until it has ended, so that one whose request was dropped
            # still ends (nothing else would move the peers' run).
            req._listed = True
            return _engine.start(req, wake=False)
        if st is not None:
            st.hold()
        return req
    if deadline is not None or nbytes >= NATIVE_LIST_MIN_BYTES or xrun:
        # (a program's run is always listed: only the executor's passes move it)
        # A long one is listed too: the library advances a collective only
        # inside MPI calls, so left alone it waited for wait() and overlapped
        # nothing (`make bench-overlap`, algorithm mpi: 0 % at 1-16 MiB);
        # the progress thread's tests move it while the caller computes.
        req._listed = True  # (listed by start)
        return _engine.start(req, wake=nbytes >= WAKE_MIN_BYTES)
    if st is not None:
        st.hold()
    return req


def use_native(mod) -> None:
    """Let csrc/native.c (``mod``, native.py) make short native requests and
    run wait()'s alone path in C: what start_native and wait_native do for
    a request nobody else drives, without their Python (~1 us of a short
    call). Everything else still comes here."""
    # (from the smaller of the two sizes the C start hands the request to
    # start_native, which lists it or gives it to the C thread)
    mod.bind(_engine, NativeRequest, NativeRequest._wait_py, _engine.waited_failed, _settle,
             min(NATIVE_LIST_MIN_BYTES, NATIVE_BG_MIN_BYTES))
    NativeRequest.wait = mod.request_wait


def watch(mpi_req) -> NativeRequest:
    """An MPI request (a point-to-point message) as an engine request, so
    that the engine's callbacks and progress thread serve it too."""
    return NativeRequest(mpi_req)


def set_progress_thread(enabled: bool) -> None:
    """Turn the background progress thread on or off (default: on where
    MPI_THREAD_MULTIPLE is available; env ``MPICOLL_PROGRESS_THREAD=0``)."""
    with _engine.lock:
        _engine.enabled = bool(enabled)
        _engine.wake.notify_all()


def drive(req: Request, seconds: float) -> bool:
    """Advance the outstanding operations as ``req.wait()`` does, for up to
    ``seconds``, then leave ``req`` to the progress thread (woken) and
    return; without a progress thread, wait until it is complete. For a
    caller that cannot block on one request for long (it has others to
    drive) but expects this one to be short. Does not raise the request's
    error (``wait()``/``test()`` do). Returns whether it is complete."""
    return _engine.wait(req, hot_for=seconds)


def progress_thread_active() -> bool:
    """Whether nonblocking operations are advanced by the background thread."""
    return _engine.use_thread()


def progress() -> None:
    """Advance every outstanding nonblocking operation once."""
    _engine.progress()


# A blocking wait on a turn in a shared-memory queue advances the calls
# ahead of it, which may be this engine's (schedule.advance_others).
_sched.advance_others = progress


def waitall(requests) -> list:
    """Wait for every request (mpicoll's or mpi4py's); returns their results
    (None for MPI requests), in order."""
    requests = list(requests)
    results = []
    for req in requests:
        if isinstance(req, Request) or hasattr(req, "wait") and not isinstance(req, MPI.Request):
            results.append(req.wait())
        elif isinstance(req, MPI.Request):
            req.Wait()
            results.append(None)
        else:
            raise TypeError(f"mpicoll: waitall takes requests, not {type(req).__name__}")
    return results
