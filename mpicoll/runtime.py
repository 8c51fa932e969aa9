"""The ``Plan``: one validated collective call, and how it runs.

A builder (mpicoll/plan.py) makes it; the drivers run it: blocking
(``Plan.run``, through the C executor when the schedule was compiled),
nonblocking (``Plan.start`` -> ``engine.Request``), or under a persistent
request (mpicoll/persistent.py). ``enter`` is the one gate every blocking
run and every start passes: one thread per communicator, no collective
from a done-callback.
"""
from __future__ import annotations

import time

from . import engine
from . import schedule as _sched


def enter(st) -> None:
    """Take ``st.busy`` for one thread's blocking run or start of a collective.

    MPI requires the collectives of one communicator to be called in the
    same order on every rank, which two threads of a rank calling at once
    cannot promise; mpicoll's blocking scratch and call sequence are per
    communicator too. So a second thread on the same communicator is an
    error, said at once rather than found later as a wrong sum (use one
    communicator per thread: ``comm.Dup()``). ``acquire(False)`` is atomic:
    the check cannot race.

    A request's done-callback may not start a collective either: it runs
    when the request completes, which is a different point of the program
    on each rank, so the ranks would not call their collectives in the same
    order (engine.py, the threading contract)."""
    if engine.in_callback():
        raise RuntimeError(
            f"mpicoll: a collective was started from a request's done-callback (rank {st.rank}); callbacks "
            "run whenever the request completes, at a different point on each rank, so collectives started "
            "there cannot be matched in order across ranks - start it from the program's own flow (after wait())")
    if not st.busy.acquire(False):
        raise RuntimeError(
            f"mpicoll: another thread is inside a collective on this communicator (rank {st.rank}); mpicoll "
            "collectives on one communicator must not be called from two threads at once - give each "
            "thread its own communicator (comm.Dup())")


class Plan:
    """One validated collective call, ready to run.

    ``schedule(ctx)`` makes the schedule generator; ``stage()`` runs first at
    every (re)start (it refreshes a private copy of an input that was not
    contiguous or aligned, see buffers.as_input), then ``prologue()`` (copy
    the input into a work buffer),
    ``finish()`` after it (avg's scaling, copies out); both may be None.
    """

    __slots__ = ("st", "collective", "algorithm", "nbytes", "result", "schedule", "prologue", "finish",
                 "timeout", "pool", "native", "check_sig", "stage", "kept", "recordable")

    def __init__(self, st, collective, algorithm, nbytes, result, schedule, *, prologue=None, finish=None,
                 timeout=None, native=None, stage=None):
        self.st = st
        self.stage = stage
        self.collective = collective
        self.algorithm = algorithm
        self.nbytes = nbytes
        self.result = result
        self.schedule = schedule
        self.prologue = prologue
        self.finish = finish
        self.timeout = timeout
        self.pool = None  # scratch: st.pool when blocking, own dict when nonblocking/persistent
        self.native = native  # schedule.NativeCall for the MPI library's collective (fast paths)
        self.check_sig = False  # the pre-flight check ran when the plan was built (per call: not reusable)
        # A plancache.Kept that replays this call's decision on new buffers
        # (set by the builders whose call it can serve; the front door files
        # it under the call's signature), or None.
        self.kept = None
        # (entry, buf, red, src, knobs) of an all-reduce schedule that is
        # compilable or has a program of its own (registry): what a
        # persistent request records (or has written) once for the C executor.
        self.recordable = None

    def _context(self, pool):
        st = self.st
        seq, tag = st.next_seq()
        return _sched.Context(st, tag, pool, (self.collective, self.algorithm, self.nbytes, seq))

    def inputs(self) -> None:
        """What every (re)start does first: refresh a staged input, then the prologue."""
        if self.stage is not None:
            self.stage()
        if self.prologue is not None:
            self.prologue()

    def run(self):
        """Blocking."""
        st = self.st
        enter(st)
        try:
            self.inputs()
            if self.schedule is not None:
                if self.native is not None and self.timeout is None:
                    st.next_seq()  # the call's number, for the flight recorder
                    self.native.blocking()
                    if self.native.after is not None:
                        self.native.after()
                else:
                    deadline = None if self.timeout is None else time.monotonic() + self.timeout
                    _sched.run(self.schedule(self._context(self.pool if self.pool is not None else st.pool)),
                               deadline)
            if self.finish is not None:
                self.finish()
        finally:
            st.busy.release()
        return self.result

    def start(self, pool=None) -> engine.Request:
        """Nonblocking: the request runs the schedule under the progress engine."""
        enter(self.st)
        try:
            return self._start(pool)
        finally:
            self.st.busy.release()

    def _start(self, pool):
        self.inputs()
        if self.schedule is None:
            if self.finish is not None:
                self.finish()
            return engine.Request.completed(self.result)
        native = self.native
        if native is not None and self.timeout is None:
            # The MPI library's own collective: its MPI_I... request is the
            # whole request (no schedule, context or scratch), and wait()
            # can block in the library (engine.NativeRequest).
            self.st.next_seq()
            # The request holds the plan: its scratch and staged copies are
            # what the library reads and writes (NativeRequest's ``keep``).
            return engine.start_native(native.start(), self.result, _then(native.after, self.finish), self.nbytes,
                                       self.st, keep=self)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        finish = self.finish
        if pool is None:
            pool, give_back = self.st.borrow_pool()
            done = finish

            def finish():
                if done is not None:
                    done()
                give_back()

        gen = self.schedule(self._context(pool))
        return engine.start(gen, self.result, finish, deadline, self.nbytes, self.st)


class Then:
    """Two steps run one after the other (see ``_then``); ``parts`` lets
    the persistent front read the chain (persistent.steps)."""

    __slots__ = ("parts",)

    def __init__(self, first, second):
        self.parts = (first, second)

    def __call__(self) -> None:
        first, second = self.parts
        first()
        second()


def _then(first, second):
    """Two optional finishing steps as one (None when both are None)."""
    if first is None or second is None:
        return first or second
    return Then(first, second)


def _finish(st, red, flat):
    """avg's division after the sum, or nothing."""
    if red.op.average:
        size = st.size
        return lambda: red.finish(flat, size)
    return None
