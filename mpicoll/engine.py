"""The nonblocking driver: requests and the progress engine.

A nonblocking call (``mpicoll.iallreduce``, ``ireduce_scatter``, ... or a
persistent plan's ``start()``) hands its schedule (a generator, see
``mpicoll.schedule``) to a ``Request``. The request posts the operations
the schedule yields and keeps them; whenever they have all completed it
checks the received sizes and resumes the schedule, which reduces and
yields the next operations, until the schedule ends.

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
would deadlock.

Thread safety: all MPI requests and schedule steps are touched only under
one process-wide lock, so the progress thread and the caller's test()/wait()
never run a step concurrently. Done-callbacks run after the lock is
released.

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

from mpi4py import MPI

from . import schedule as _sched
from .schedule import CUSTOM

ENV_PROGRESS_THREAD = "MPICOLL_PROGRESS_THREAD"

# How often (seconds) the interpreter hands the GIL to the progress thread
# while operations are outstanding (see _Engine._run).
SWITCH_INTERVAL = 100e-6

# A waiting thread polls this many times before it starts yielding the core
# at each poll (as MPI's own blocking waits spin): a yield can cost a whole
# scheduler time slice when the machine is busy.
SPIN_POLLS = 2000


class Request:
    """An outstanding nonblocking collective. ``wait()`` returns the result
    (the output array; None on non-root ranks of a reduce); ``test()`` says
    whether it is complete (and advances every outstanding operation).
    ``Wait()``/``Test()`` are mpi4py-style aliases."""

    def __init__(self, result=None, gen=None, finish=None, deadline=None):
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
        self._done = threading.Event()

    @classmethod
    def completed(cls, result=None) -> "Request":
        req = cls(result)
        req._done.set()
        return req

    # ---- called with the engine lock held ----
    def _start(self) -> None:
        self._step(True)

    def _step(self, first=False) -> None:
        try:
            ops = next(self._gen) if first else self._gen.send(None)
            while not ops:  # an empty batch: nothing to wait for
                ops = self._gen.send(None)
        except StopIteration:
            try:
                if self._finish is not None:
                    self._finish()
            except BaseException as exc:
                self._error = exc
            self._complete()
            return
        except BaseException as exc:  # reported by wait()/test() on the caller's thread
            self._error = exc
            self._complete()
            return
        for op in ops:
            if op.req is None:
                _sched._post(op)
        self._ops = list(ops)
        self._custom = any(op.kind == CUSTOM for op in ops)
        self._reqs = [op.req for op in ops if op.kind != CUSTOM]
        self._statuses = [MPI.Status() for _ in self._reqs]

    def _complete(self) -> None:
        self._ops, self._reqs, self._statuses, self._gen = [], [], [], None
        self._done.set()

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

    def _advance(self) -> int:
        """Run as many steps as the completed operations allow; returns how
        many ran (-1 once the operation is complete)."""
        steps = 0
        while not self._done.is_set():
            try:
                ready = self._ready()
                if not ready and self._deadline is not None and time.monotonic() >= self._deadline:
                    raise _sched.timeout_error(self._ops)
            except BaseException as exc:
                self._error = exc
                self._complete()
                break
            if not ready:
                return steps
            self._step()
            steps += 1
        return -1

    # ---- public ----
    @property
    def done(self) -> bool:
        return self._done.is_set()

    def test(self) -> bool:
        if not self._done.is_set():
            _engine.progress()
        if self._done.is_set():
            self._raise()
            return True
        return False

    def wait(self):
        _engine.wait(self)
        self._raise()
        return self.result

    def add_done_callback(self, fn, wake: bool = True) -> None:
        """Call ``fn(request)`` once the request is complete (at once if it
        already is). It runs on whichever thread completed the request,
        possibly the progress thread, after the engine lock is released; it
        must not block on other mpicoll requests. Exceptions it raises are
        printed, not propagated.

        A callback usually means that someone relies on completion without
        calling wait() (a torch future waited on in C++), so the progress
        thread is woken, even for a short operation. ``wake=False`` leaves
        it asleep, for a caller that has another thread wait() for the
        request (waking it would cost a thread hand-over for nothing)."""
        with _engine.lock:
            if not self._done.is_set():
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


def _call(fn, req) -> None:
    try:
        fn(req)
    except BaseException:  # a callback's failure must not take the progress thread down
        import traceback

        traceback.print_exc()


class _Engine:
    """The process-wide list of outstanding operations and the progress thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active = []
        self.wake = threading.Condition(self.lock)
        self.waiters = 0  # threads in wait(), which drive progress themselves
        self._wlock = threading.Lock()
        self.normal_interval = sys.getswitchinterval()
        self.sleeping = False  # the thread is blocked on `wake`
        self._wlock = threading.Lock()
        self.thread = None
        self.stopping = False
        self.enabled = os.environ.get(ENV_PROGRESS_THREAD, "1").strip().lower() not in ("0", "false", "no", "off")

    def thread_available(self) -> bool:
        return MPI.Is_initialized() and not MPI.Is_finalized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE

    def start(self, req: Request, wake: bool = True) -> Request:
        with self.lock:
            req._start()
            if not req.done:
                self.active.append(req)
                if wake:
                    # Waking the thread costs a GIL hand-over (measured: up to
                    # ~1 ms on a loaded 2-core machine), more than a short
                    # operation takes when its caller waits for it at once:
                    # short operations (wake=False) are left to the caller's
                    # wait()/test() unless the thread is awake anyway.
                    self.wake_locked()
            done = req._callbacks if req.done else None
            req._callbacks = [] if done else req._callbacks
        if done:
            for fn in done:
                _call(fn, req)
        if not req.done and self.use_thread() and self.thread is None:
            self._spawn()
        return req

    def use_thread(self) -> bool:
        return self.enabled and not self.stopping and self.thread_available()

    def wake_locked(self) -> None:
        """Wake the sleeping progress thread (called with the lock held)."""
        if self.sleeping and self.use_thread():
            self.wake.notify()
            # The woken thread needs the GIL to run at all: have the caller
            # hand it over within SWITCH_INTERVAL, not after the default 5 ms
            # (restored when the thread goes idle).
            sys.setswitchinterval(min(self.normal_interval, SWITCH_INTERVAL))

    def _spawn(self) -> None:
        with self.lock:
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self._run, name="mpicoll-progress", daemon=True)
            self.thread.start()

    def _progress_locked(self):
        """(moved, callbacks to run after the lock is released)."""
        moved = False
        still = []
        finished = []
        for req in self.active:
            steps = req._advance()
            moved = moved or steps != 0
            if steps >= 0:
                still.append(req)
            elif req._callbacks:
                finished.append((req, req._callbacks))
                req._callbacks = []
        self.active = still
        return moved, finished

    def _run_callbacks(self, finished) -> None:
        for req, fns in finished:
            for fn in fns:
                _call(fn, req)

    def progress(self) -> None:
        finished = ()
        with self.lock:
            if self.active:
                _, finished = self._progress_locked()
        if finished:
            self._run_callbacks(finished)

    def wait(self, req: Request, hot_for=None) -> bool:
        """The waiting thread drives progress itself: handing completion over
        from the progress thread (an Event, a GIL switch) costs hundreds of
        microseconds, more than a short all-reduce. While someone waits, the
        progress thread steps back (see _run). With ``hot_for`` (seconds)
        and a progress thread, stop after that long and leave the request to
        the thread (woken on the way out); returns whether it is complete."""
        if req.done:
            return True
        until = None if hot_for is None or not self.use_thread() else time.monotonic() + hot_for
        with self._wlock:  # not the engine lock: the progress thread may hold that one
            self.waiters += 1
        polls = 0
        try:
            while not req.done:
                finished = ()
                if self.lock.acquire(blocking=False):
                    try:
                        if self.active:
                            _, finished = self._progress_locked()
                    finally:
                        self.lock.release()
                if finished:
                    self._run_callbacks(finished)
                polls += 1
                if until is not None and time.monotonic() > until:
                    break
                if not req.done and polls > SPIN_POLLS:
                    # Then let other threads and processes run: on an
                    # oversubscribed node the peer we wait for may need this core.
                    time.sleep(0)
        finally:
            with self._wlock:
                self.waiters -= 1
                last = self.waiters == 0
            if last and self.active:
                with self.lock:
                    self.wake_locked()
        return req.done

    def _run(self) -> None:
        pause = 0.0
        normal = self.normal_interval
        while True:
            with self.lock:
                # Block while there is nothing to do, or while a thread in
                # wait() drives progress itself (two threads polling would
                # only pass the GIL back and forth).
                if not self.stopping and (not self.active or not self.enabled or self.waiters):
                    sys.setswitchinterval(normal)
                    self.sleeping = True
                    while not self.stopping and (not self.active or not self.enabled or self.waiters):
                        pause = 0.0
                        self.wake.wait()
                    self.sleeping = False
                    # A computing caller releases the GIL inside every numpy
                    # loop but takes it straight back; a waiting thread only
                    # gets it when the interpreter forces a switch, by default
                    # after 5 ms. While operations are outstanding, force it
                    # after SWITCH_INTERVAL so that the progress thread gets a
                    # turn about that often.
                    sys.setswitchinterval(min(normal, SWITCH_INTERVAL))
                if self.stopping:
                    sys.setswitchinterval(normal)
                    return
                moved, finished = self._progress_locked()
            if finished:
                self._run_callbacks(finished)
            # Poll fast while things move; otherwise back off to at most
            # 200 us so a computing caller keeps its cores.
            if moved:
                pause = 0.0
                time.sleep(0)
            else:
                pause = min(max(pause * 2, 10e-6), 200e-6)
                time.sleep(pause)

    def stop(self) -> None:
        """Stop the thread (before MPI_Finalize: atexit runs this first)."""
        with self.lock:
            self.stopping = True
            self.wake.notify_all()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)


_engine = _Engine()
atexit.register(_engine.stop)  # registered after mpi4py's finalizer, so it runs before it


# Operations of at least this many bytes wake the progress thread at start
# (see _Engine.start); shorter ones are advanced by the caller's wait()/test()
# and by the thread whenever it is awake for other operations.
WAKE_MIN_BYTES = 64 << 10


def start(gen, result=None, finish=None, deadline=None, nbytes: int = WAKE_MIN_BYTES) -> Request:
    """Start schedule ``gen`` as a nonblocking request."""
    return _engine.start(Request(result, gen, finish, deadline), wake=nbytes >= WAKE_MIN_BYTES)


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
