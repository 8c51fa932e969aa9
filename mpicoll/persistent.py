"""Persistent requests (MPI-4 ``MPI_Allreduce_init`` semantics): a plan
built once by ``mpicoll.allreduce_init`` and the other ``*_init``, then
``start()``/``wait()`` many times.
"""
from __future__ import annotations

import time

from mpi4py import MPI

from . import engine
from . import executor as _executor
from . import native as _native
from . import program as _program
from . import schedule as _sched
from .buffers import Copy
from .runtime import Plan, Then, _then, enter


class _PyFront:
    """start/wait and mpi4py's spellings, in Python (where csrc/native.c's
    PersistFront, which runs the common start and wait itself, is not built
    or turned off): Persistent's ``_start`` and ``_wait``."""

    def start(self) -> None:
        self._start()

    def wait(self):
        return self._wait()

    def __call__(self):
        self._start()
        return self._wait()

    Start = start

    def Wait(self, status=None):  # noqa: N802 (mpi4py's spelling)
        self._wait()
        return True


_nat = _native.module()


def steps(*fs) -> tuple:
    """A plan's steps as the C front runs them (csrc/native.c run_steps):
    None dropped, ``_then`` chains flattened, a buffers.Copy as its
    ``(dst, src)``, any other callable as it is."""
    out = []
    for f in fs:
        if type(f) is Then:
            out += steps(*f.parts)
        elif type(f) is Copy:
            out.append((f.dst, f.src))
        elif f is not None:
            out.append(f)
    return tuple(out)

_Front = _nat.PersistFront if _nat is not None else _PyFront
# The completed request a program's run that its C start finished stands as
# (the C front's ``_req`` until wait(); test() and wait() of it return at once).
_RAN = engine.Request.completed(None)

class Persistent(_Front):
    """A persistent collective (MPI-4 ``MPI_Allreduce_init`` semantics).

    Built once by ``mpicoll.allreduce_init`` (and the other ``*_init``):
    arguments validated, algorithm decided, scratch and (for ``mpi``) the MPI
    library's own persistent request created, all once. Then, as often as
    needed and in the same order on every rank: ``start()``, and ``wait()``
    (returns the result) or ``test()``; calling the request does both. The
    buffers are bound at creation: write the new input into them between
    runs. ``Start``/``Wait``/``Test`` are mpi4py's spellings; ``free()``
    releases the MPI request.

    ``start``, ``wait``, calling and ``Start``/``Wait`` come from the base
    class: where the native module is built, a C front that runs a run of
    the library's persistent request - the gate, the inputs, the call
    number, MPI_Start; MPI_Wait when nothing else is in flight - and calls
    ``_start``/``_wait`` below for everything else.
    """

    def __init__(self, plan: Plan):
        self._plan = plan
        self._pool = {}
        self._req = None  # the active request (engine.Request, or NativeRequest over _mpi)
        self._mpi = None  # MPI.Prequest of the native persistent collective
        if plan.schedule is not None and plan.native is not None and plan.native.init is not None:
            self._mpi = plan.native.init()
        self._active = False
        self._seq = -1  # the number of the call in flight (timeout messages)
        self._finish = _then(plan.native.after, plan.finish) if self._mpi is not None else None
        self._fast = None
        if _nat is not None and type(self._mpi) is _nat.Req and plan.timeout is None:
            self._front(plan.st, engine, plan.result, steps(plan.stage, plan.prologue), steps(self._finish))
            self._fast = self._mpi
        # A compilable schedule is recorded once, here, and every start runs
        # the recording in the C executor (executor.py); shm writes its
        # program itself (registry ``program``), run at each start where its
        # window takes it.
        self._exe = self._kit = None
        rec = plan.recordable
        if self._mpi is None and rec is not None and plan.st.size > 1 and _executor.enabled() \
                and (rec[0].program is not None or (rec[0].compilable and plan.nbytes < _executor.LONG_BYTES)):
            # (long messages of a recorded schedule overlap better on the generator: see kept.py)
            entry, buf, red, src, knobs = rec
            prog = _program.for_entry(entry, plan.st, buf.size, buf.dtype, red, src is not None, knobs)
            if prog is not None:
                self._exe = _executor.Executable(prog, plan.st, red, plan.collective, plan.algorithm)
                self._kit = self._new_kit()
                self._bind_program()

    def _bind_program(self) -> None:
        """Let the C front (csrc/native.c) run this program's starts and
        waits: an XRun over the kit, the plan's inputs and finish as steps.
        Not with a timeout (Python's start sets the deadline)."""
        plan = self._plan
        if _nat is None or plan.timeout is not None:
            return
        self._front(plan.st, engine, plan.result, steps(plan.stage, plan.prologue), steps(plan.finish))
        xr = _nat.XRun(*self._exe.xrun_args(self._kit), self._xfailed)
        # (a run left pending of 1-4 MiB: the C progress thread too, as an I-call's)
        bg = engine.NATIVE_BG_MIN_BYTES <= plan.nbytes < engine.NATIVE_LIST_MIN_BYTES and engine._engine.use_thread()
        self._program(xr, plan.finish, _RAN, bg)

    def _xfailed(self, rc, tag, seq) -> BaseException:
        """The C front's run ended with executor error ``rc`` (XRun calls
        this): its kit stays with the library (the messages it posted may
        still land), the C path is off until the next start makes a new kit,
        and the error is returned for the run to raise."""
        kit = self._kit
        kit.abandon()
        self._program(None, None, None)
        return self._exe.error(rc, kit.info, tag, seq)

    def _xstarted(self, rc, tag, seq):
        """The C start's first pass ended with executor error ``rc``: the
        request Python's start makes of it (it records the error, raised by
        wait(), and abandons the kit); the C path is off until the next
        start makes a new kit."""
        self._program(None, None, None)
        plan = self._plan
        return self._exe.started(self._kit, rc, tag, seq, plan.result, plan.finish, None, plan.nbytes)

    def _new_kit(self):
        """The executor's kit for this request's runs, bound to its buffers
        for good (MPI's persistent requests keep theirs too)."""
        kit = self._exe.new_kit(self._pool)
        _, buf, _, src, _ = self._plan.recordable
        kit.bind(buf, src)
        kit.keep = True
        return kit

    @property
    def algorithm(self) -> str:
        return self._plan.algorithm

    @property
    def result(self):
        return self._plan.result

    def _start(self) -> None:
        if self._active:
            raise RuntimeError("mpicoll: persistent request started again before it completed (wait() first)")
        plan = self._plan
        if self._mpi is not None:
            # The library's persistent request, started, is the whole request:
            # the same thin request as a native nonblocking call's (Plan._start).
            st = plan.st
            busy = st.busy
            # (enter's checks, written out for this hot path: it raises the
            # error that applies when either fails)
            if engine._running_callbacks or not busy.acquire(False):
                enter(st)
            try:
                if plan.stage is not None or plan.prologue is not None:
                    plan.inputs()
                self._seq, _ = st.next_seq()
                self._mpi.Start()
            finally:
                busy.release()
            if plan.timeout is None:
                # Handed to the engine only if wait() finds other requests
                # in flight, or on test(): a start+wait pair with nothing
                # else outstanding is Start and MPI_Wait, as in plain mpi4py.
                self._req = None
            else:
                self._req = engine.start_native(self._mpi, plan.result, self._finish, plan.nbytes, st,
                                                time.monotonic() + plan.timeout, self._expired, keep=plan)
        elif self._exe is not None and (not self._exe.probe or self._exe.ready()):
            st = plan.st
            enter(st)
            try:
                plan.inputs()
                seq, tag = st.next_seq()
                kit = self._kit
                if kit.dead:  # the last run failed: its kit stays with the library
                    kit = self._kit = self._new_kit()
                    self._bind_program()  # (the C front again, from the next start)
                exe = self._exe
                self._req = exe.started(kit, exe.post(kit, tag), tag, seq, plan.result, plan.finish, None,
                                        plan.nbytes)
            finally:
                st.busy.release()
        else:  # the schedule (also a shm program's start its window does not take now)
            self._req = plan.start(self._pool)
        self._active = True

    def _wait(self):
        if not self._active:
            return self._plan.result  # MPI: waiting on an inactive persistent request returns at once
        try:
            if self._req is None:
                # Nothing else in flight (read without the engine's lock: one
                # read of a list under the GIL; one taken under the lock could
                # be as stale by the time MPI_Wait is entered).
                if not engine._engine.active:
                    self._mpi.Wait()
                    if self._finish is not None:
                        self._finish()
                    return self._plan.result
                self._listed()
            self._req.wait()
        finally:
            self._active = False
            self._req = None
        return self._plan.result

    def _listed(self) -> None:
        """The started library request, handed to the engine (see start)."""
        plan = self._plan
        self._req = engine.start_native(self._mpi, plan.result, self._finish, plan.nbytes, plan.st, keep=plan)

    def _expired(self) -> _sched.CollectiveTimeout:
        st, plan = self._plan.st, self._plan
        return _sched.CollectiveTimeout(
            f"mpicoll: {plan.collective} timed out on rank {st.rank}: algorithm {plan.algorithm} "
            f"(the MPI library's persistent collective), {plan.nbytes} B, call #{self._seq} on this "
            "communicator. A rank probably skipped this call, called another collective, or died.",
            collective=plan.collective, algorithm=plan.algorithm, step="-", peers=[], nbytes=plan.nbytes,
            seq=self._seq, rank=st.rank)

    def test(self) -> bool:
        if not self._active:
            return True
        if self._req is None:
            self._listed()
        try:
            if not self._req.test():
                return False
        except BaseException:
            self._active = False
            self._req = None
            raise
        self._active = False
        self._req = None
        return True

    def free(self) -> None:
        if self._active:
            self.wait()
        self._fast = None
        if self._mpi is not None and not MPI.Is_finalized():
            self._mpi.Free()
        self._mpi = None

    def Test(self, status=None) -> bool:  # noqa: N802
        return self.test()

    def Free(self):  # noqa: N802
        self.free()

    def __repr__(self):
        return f"<mpicoll persistent {self._plan.collective}/{self._plan.algorithm} {'active' if self._active else 'inactive'}>"
