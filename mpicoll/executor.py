"""The C executor (csrc/executor.c) from Python: run a recorded program
(program.py) on a call's buffers, blocking or as an engine request.

The extension is built per MPI library (csrc/build_executor.py, run by
``make install``) and named after it; ``available()`` says whether the one
for mpi4py's library is here, and why not. Without it kept plans keep
running their schedule generators: the same results, with Python's cost per
message.

Blocking: one C call runs the whole program; cffi releases the GIL for it,
so other threads run while it waits in MPI_Waitall. Nonblocking
(``ProgramRequest``): the engine's progress (test(), wait(), the progress
thread) calls the executor with ``blocking=0``: it runs steps until a wait
step is incomplete (one MPI_Testall) and returns; a wait() with no other
request in flight takes the request out of the engine's list and finishes
it in one blocking C call, the GIL released. Once a kept call's program is
gated in C (point()), its I-calls are made there too, on the gated Call's
I-run (_point_i; csrc/native.c, "a program's I-call").

Scratch: a program's scratch regions come from the pool the generator
would have used (the communicator's for blocking calls, one per request for
nonblocking ones), under names of their own.
"""
from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from . import engine
from . import native as _native
from . import program as _program
from . import schedule as _sched
from ._kernels import ffi as _kffi, lib as _klib
from .builds import library_module


def _kernel(mod, fn):
    """A function of mpicoll._kernels as the executor module's void pointer."""
    return mod.ffi.cast("void *", int(_kffi.cast("uintptr_t", fn)))


def _load():
    mod, why = library_module("_executor")
    if mod is None:
        return None, why
    mod.lib.mpicoll_x_set_kernels(_kernel(mod, _klib.mpicoll_reduce), _kernel(mod, _klib.mpicoll_reduce_many))
    return mod, ""


_mod, _why = _load()
if _mod is not None:
    ffi, lib = _mod.ffi, _mod.lib
    _XRUN = int(ffi.cast("uintptr_t", lib.mpicoll_x_run))  # for csrc/native.c's gated programs (point())
    DONE, PENDING = lib.MPICOLL_X_DONE, lib.MPICOLL_X_PENDING
    EMPI, EMISMATCH, EKERNEL = lib.MPICOLL_X_EMPI, lib.MPICOLL_X_EMISMATCH, lib.MPICOLL_X_EKERNEL
    ESHM, DECLINED, EINTR, PROBE = lib.MPICOLL_X_ESHM, lib.MPICOLL_X_DECLINED, lib.MPICOLL_X_EINTR, lib.MPICOLL_X_PROBE


def use_shm(spins: int, yield_s: float, round_s: float) -> None:
    """Give the executor's shared-memory step (program.SHM) its functions,
    csrc/shmsync.c's mpicoll_shm_run and mpicoll_shm_ready, and its
    blocking waits' back-off (spin polls, then seconds yielding the core)
    and round (a blocking run comes back PENDING after it: run_blocking):
    shmwindow.py's, which calls this when it is imported (before that no
    shm program exists, and the step would decline)."""
    if _mod is not None:
        lib.mpicoll_x_set_shm(_kernel(_mod, _klib.mpicoll_shm_run), _kernel(_mod, _klib.mpicoll_shm_ready), spins,
                              int(yield_s * 1e9), int(round_s * 1e9))


def run_blocking(state, steps, nsteps, lists, buf, src, scratch, op, dtype, handle, tag, info) -> int:
    """A blocking run (the GIL released in each C call): a shared-memory
    step's wait comes back every round (PENDING) and Python's signal
    handlers run between rounds (Ctrl-C while a peer is late raises here,
    the run left where it stopped: the caller gives up its kit or keeps
    the request pending)."""
    rc = lib.mpicoll_x_run(state, steps, nsteps, lists, buf, src, scratch, op, dtype, handle, tag, 1, info)
    while rc == PENDING:
        rc = lib.mpicoll_x_run(state, steps, nsteps, lists, buf, src, scratch, op, dtype, handle, tag, 1, info)
    return rc


def _address(cdata) -> int:
    return int(ffi.cast("uintptr_t", cdata))


# MPICOLL_EXECUTOR=0 keeps every schedule on its generator (read when a kept
# plan first tries to compile, so set it before the calls; set_enabled()
# from a program or test).
_enabled = os.environ.get("MPICOLL_EXECUTOR", "1").strip().lower() not in ("0", "false", "no", "off")


def available() -> bool:
    return _mod is not None


def enabled() -> bool:
    """Whether kept plans compile their schedules for the executor."""
    return _enabled and _mod is not None


def set_enabled(on: bool) -> None:
    """Turn compiling on or off for kept plans made from now on."""
    global _enabled
    _enabled = bool(on)


def why_not() -> str:
    """Why the executor is not available ("" when it is)."""
    return _why


def _new_state(prog):
    x = lib.mpicoll_x_new(max(prog.messages, 1), prog.maxk)
    if x == ffi.NULL:
        raise MemoryError("mpicoll: no memory for the executor's state")
    return ffi.gc(x, lib.mpicoll_x_free)


# shm's program (a probe program) in flight wakes the engine's progress
# thread only from this size (ProgramRequest's passes, in which the thread
# does the copies and the reduction while the caller computes). Below it
# the wake-up cost an I-call waited for at once more than it gave:
# `iallreduce(x, out=y, algorithm="shm").wait()` at p = 2, median of 7
# interleaved rounds of 300, us, woken / not: 64 KiB 33-34 / 18-22,
# 256 KiB 47-48 / 35-37, 1 MiB 113-142 / 99-100; overlap with numpy compute
# (`bench overlap --algorithms shm`, two runs each) 0 % either way at
# 256 KiB, 9-27 / 0-8 % at 1 MiB, 20-30 / 0 % at 4 MiB.
SHM_WAKE_MIN_BYTES = 1 << 20

# From this size a compiled schedule's nonblocking and persistent runs take
# its generator under the progress thread, woken (kept.py, persistent.py):
# with numpy compute it overlapped far better there (4 MiB: 64-95 %; the
# program's pending run only listed: 10 % at 1 MiB, docs/results/
# compiled-executor.md). Below it they run here; a pending run of 1-4 MiB
# on the C progress thread (started(): _in_c; engine.start_native; the
# persistent C front's bg), as the library's own I-calls of that size.
# It was 64 KiB (engine.WAKE_MIN_BYTES). Measured at p = 2
# (docs/results/native-calls.md, "64 KiB to 1 MiB", "1-4 MiB"): waited for
# at once, the generator's I-call took 68-424 us from 64 to 512 KiB, the
# program's 18-152 (mpi4py's Iallreduce 21-97); at 1-2 MiB the C thread's
# 1.3-3x faster than the generator's, with pure-Python compute 1.4-3x
# faster end to end, with numpy compute 0.8-1.6x.
LONG_BYTES = engine.NATIVE_LIST_MIN_BYTES

# A program whose scratch is at most this many bytes owns it (blocking runs:
# no pool look-up per call, which is a measurable share of a short call);
# larger scratch comes from the communicator's pool, as the generators'
# does, so that 128 kept plans do not each hold megabytes.
OWN_SCRATCH_BYTES = 64 << 10


class Kit:
    """What one run in flight needs besides the program: its C state, the
    error words, the scratch pointers and the bound buffers. A blocking
    Executable keeps one; each nonblocking request has its own (a
    persistent request reuses one: it is never started twice at once, and
    its buffers are bound for its life, ``keep``)."""

    __slots__ = ("state", "info", "scratch", "ptrs", "buf", "src", "c_buf", "c_src", "dead", "keep")

    def __init__(self, prog, scratch):
        self.dead = False  # a failed run left it to the library (engine._abandoned)
        self.keep = False  # release() leaves the buffers bound (a persistent request's)
        self.state = _new_state(prog)
        self.info = ffi.new("int64_t[4]")
        self.scratch = scratch  # the arrays ptrs points into
        self.ptrs = ffi.new("char *[]", [ffi.from_buffer(b) for b in scratch]) if scratch else ffi.NULL
        self.buf = self.src = None
        self.c_buf = self.c_src = ffi.NULL

    def bind(self, buf, src):
        self.buf, self.src = buf, src
        self.c_buf = ffi.from_buffer(buf, require_writable=True)
        self.c_src = ffi.NULL if src is None else ffi.from_buffer(src)

    def abandon(self, *also) -> None:
        """Leave this kit of a failed run to the library: the messages it
        posted may still land in what it points into (and in ``also``, the
        arrays a run bound elsewhere), so all of it is kept for good
        (engine._abandoned) and the kit is never used again."""
        self.dead = True
        engine._abandoned.append((self, *also) if also else self)

    def release(self):
        """Drop the bound buffers (nothing of the caller's stays exported)."""
        if self.keep:
            return
        self.buf = self.src = None
        self.c_buf = self.c_src = ffi.NULL


class Executable:
    """A program bound to the executor and to one communicator's state."""

    __slots__ = ("prog", "st", "steps", "lists", "nsteps", "op", "dtype", "handle", "keys", "own", "kit",
                 "collective", "algorithm", "idle", "gated", "probe", "ikit", "ixr")

    def __init__(self, prog, st, red, collective, algorithm):
        self.prog, self.st = prog, st
        self.collective, self.algorithm = collective, algorithm
        # The arrays stay referenced by prog: the C pointers point into them.
        self.steps = ffi.cast("int64_t *", ffi.from_buffer(prog.steps))
        self.lists = ffi.cast("int64_t *", ffi.from_buffer(prog.lists))
        self.nsteps = len(prog.steps)
        self.op, self.dtype = red.op.code, red.dtype.code
        # mpi4py gives the handle as an unsigned integer; MPICH's handles
        # are ints whose top bit is set (sign-extended to 64 bits there).
        h = MPI._handleof(st.comm)
        self.handle = h - (1 << 64) if h >= 1 << 63 else h
        self.keys = tuple(f"exec-{i}" for i in range(len(prog.scratch)))
        self.own = sum(prog.scratch) <= OWN_SCRATCH_BYTES
        self.kit = self._blocking_kit()
        # A shared-memory program (its step SHM) runs only while its window
        # takes it (ready(); the C callers probe the same way).
        self.probe = len(prog.steps) > 0 and int(prog.steps[0, 0]) == _program.SHM
        self.idle = []  # kits of completed nonblocking runs (own scratch only): see take_kit
        # The native Call that runs this program's blocking calls whole in
        # C (kept.py's _gate_program; point()), False where there is none,
        # None until the first blocking run tries.
        self.gated = None
        # The gated Call's I-run (an XRun over a kit of its own, _point_i),
        # None where it has none.
        self.ikit = self.ixr = None

    def _blocking_kit(self):
        return Kit(self.prog, [np.empty(max(n, 64), np.uint8) for n in self.prog.scratch] if self.own else [])

    def scratch(self, pool):
        """The scratch arrays from ``pool`` (grown as needed)."""
        bases = []
        for key, nbytes in zip(self.keys, self.prog.scratch):
            b = pool.get(key)
            if b is None or b.nbytes < nbytes:
                b = pool[key] = np.empty(max(nbytes, 64), np.uint8)
            bases.append(b)
        return bases

    def new_kit(self, pool):
        """A kit for one nonblocking run at a time, scratch from ``pool``."""
        return Kit(self.prog, self.scratch(pool))

    # Kits kept for the next nonblocking runs of a program that owns its
    # scratch: making one (C state, error words, scratch and its pointers)
    # was most of a short iallreduce's cost. A few, for overlapping requests.
    IDLE_KITS = 4

    def take_kit(self):
        """(kit, give_back) for one nonblocking run: with own scratch a kept
        kit (or a new one), ``give_back()`` files it again once the run has
        completed; otherwise a kit on a pool of the communicator's, which
        ``give_back()`` returns. A failed run's kit is abandoned, never
        given back (the library may still write into it)."""
        if self.own:
            idle = self.idle
            kit = idle.pop() if idle else self._blocking_kit()

            def give_back():
                if len(idle) < self.IDLE_KITS:
                    idle.append(kit)
            return kit, give_back
        pool, give_back = self.st.borrow_pool()
        return self.new_kit(pool), give_back

    def ready(self) -> bool:
        """Whether a run may start now (a shared-memory program's window
        takes it); False: the caller runs the schedule instead."""
        return lib.mpicoll_x_run(ffi.NULL, self.steps, self.nsteps, self.lists, ffi.NULL, ffi.NULL, ffi.NULL,
                                 self.op, self.dtype, self.handle, 0, PROBE, self.kit.info) == DONE

    def run(self, buf, src, tag, seq):
        """Blocking run on ``buf`` (result, written) and ``src`` (input or None)."""
        kit = self.kit
        if not self.own:
            bases = self.scratch(self.st.pool)
            if any(a is not b for a, b in zip(bases, kit.scratch)) or not kit.scratch:
                kit.scratch = bases
                kit.ptrs = ffi.new("char *[]", [ffi.from_buffer(b) for b in bases]) if bases else ffi.NULL
        try:
            rc = run_blocking(kit.state, self.steps, self.nsteps, self.lists,
                              ffi.from_buffer(buf, require_writable=True),
                              ffi.NULL if src is None else ffi.from_buffer(src), kit.ptrs, self.op, self.dtype,
                              self.handle, tag, kit.info)
        except BaseException:  # Ctrl-C between a shared-memory wait's rounds: this kit's run is given up
            self._abandon(buf, src, EINTR, tag, seq)
            raise
        if rc != DONE:
            raise self._abandon(buf, src, rc, tag, seq)

    def _abandon(self, buf, src, rc, tag, seq) -> BaseException:
        """After a failed blocking run: the error to raise. Requests the run
        left in flight stay with their state, and the state with the
        abandoned list (the library may still write into the buffers); the
        next run gets a fresh kit, and the gated Call is pointed at it."""
        kit = self.kit
        kit.bind(buf, src)
        kit.abandon()
        self.kit = self._blocking_kit()
        if self.gated:
            self.point(self.gated)
        return self.error(rc, kit.info, tag, seq)

    def point(self, call) -> None:
        """Make ``call``, a native Call of kind PROGRAM (csrc/native.c), run
        this program on the blocking kit: what run() passes to the
        executor, as addresses; the Call holds self and the kit, which own
        what they point into. Only for programs that own their scratch (a
        pool's scratch is looked up per call)."""
        kit = self.kit
        call.program(_XRUN, _address(kit.state), _address(self.steps), self.nsteps, _address(self.lists),
                     None if kit.ptrs == ffi.NULL else _address(kit.ptrs), _address(kit.info), self.op, self.dtype,
                     self.handle, self.prog.nbytes, self, kit)
        self.gated = call
        if self.ixr is None:
            self._point_i(call)

    def _point_i(self, call) -> None:
        """Give ``call`` an I-run: an XRun over a kit of its own, on which its
        start_kept runs this program's I-calls whole in C, one at a time
        (csrc/native.c, "a program's I-call"); a run left pending of 1 MiB
        or more goes to engine.start_native (the C progress thread, or from
        4 MiB the engine's list, the progress thread woken)."""
        nat = _native.module()
        if nat is None:
            return
        kit = self._blocking_kit()
        self.ikit, self.ixr = kit, nat.XRun(*self.xrun_args(kit), self._ifailed)
        call.program_i(self.ixr)

    def _ifailed(self, rc, tag, seq) -> BaseException:
        """The I-run's pass ended with executor error ``rc`` (its XRun calls
        this): its kit, and the call's arrays it points into, stay with the
        library (the messages it posted may still land); the Call gets a new
        I-run; the error is returned for the run to record or raise."""
        kit, xr = self.ikit, self.ixr
        kit.abandon(xr.bufs)
        self.ixr = None
        self.gated.program_i(None)  # (its state stopped mid-run: never run again)
        self._point_i(self.gated)
        return self.error(rc, kit.info, tag, seq)

    def xrun_args(self, kit) -> tuple:
        """What csrc/native.c's XRun takes to run this program on ``kit``
        (bound; unbound for an I-run, whose C start binds each call's
        arrays): the addresses run() and post() pass to the executor, the
        owner of what they point into (self and the kit) last but one."""
        return (_XRUN, _address(kit.state), _address(self.steps), self.nsteps, _address(self.lists),
                None if kit.ptrs == ffi.NULL else _address(kit.ptrs), _address(kit.info), self.op, self.dtype,
                self.handle, None if kit.c_buf == ffi.NULL else _address(kit.c_buf),
                None if kit.c_src == ffi.NULL else _address(kit.c_src), (self, kit))

    def gated_failed(self, buf, src, rc, tag, seq):
        """The gated Call's run on (buf, src) ended with executor status
        ``rc``: raise what run() would have (csrc/native.c calls this)."""
        raise self._abandon(buf, src, rc, tag, seq)

    def error(self, rc, info, tag, seq):
        """The exception for executor status ``rc`` with ``info``."""
        prog = self.prog
        ctx = _sched.Context(self.st, tag, {}, (self.collective, self.algorithm, prog.nbytes, seq))

        def op_of(slot):
            kind, peer, nbytes, phase = prog.slots[slot]
            ctx.phase = phase
            return _sched.Op(kind, ctx, np.empty(nbytes, np.uint8), peer)

        if rc == EMISMATCH:
            return _sched.size_mismatch(op_of(int(info[0])), int(info[1]))
        if rc == EMPI:
            code, slot, slot_code = int(info[0]), int(info[2]), int(info[3])
            if slot >= 0:
                err = _sched.receive_error([op_of(slot)], MPI.Exception(slot_code if slot_code else code))
                if err is not None:
                    return err
            return MPI.Exception(code)
        if rc == ESHM:
            return prog.explain(int(info[0]), ctx)
        if rc == EINTR:
            return KeyboardInterrupt(f"mpicoll: {self.collective}/{self.algorithm}: interrupted while waiting")
        if rc == DECLINED:
            return RuntimeError(f"mpicoll: {self.collective}/{self.algorithm}: a run started while its "
                                "shared-memory window could not take it (a bug: callers ask ready() first)")
        if rc == EKERNEL:
            return RuntimeError(f"mpicoll: a reduction kernel refused its arguments (status {int(info[0])}) at step "
                                f"{int(info[1])} of {self.collective}/{self.algorithm}")
        return RuntimeError(f"mpicoll: the executor stopped at a bad step {int(info[0])} (status {rc})")

    def start(self, buf, src, tag, seq, kit, result, finish, deadline, nbytes):
        """A nonblocking run on ``kit`` (new_kit) as an engine request."""
        kit.bind(buf, src)
        return self.started(kit, self.post(kit, tag), tag, seq, result, finish, deadline, nbytes)

    def post(self, kit, tag) -> int:
        """Begin a nonblocking run on ``kit`` (bound): the executor's status
        after its first pass, which posts the first messages and goes on
        for as long as they have completed. DONE is common for a short
        message whose peers are there already."""
        return lib.mpicoll_x_run(kit.state, self.steps, self.nsteps, self.lists, kit.c_buf, kit.c_src, kit.ptrs,
                                 self.op, self.dtype, self.handle, tag, 0, kit.info)

    def started(self, kit, rc, tag, seq, result, finish, deadline, nbytes):
        """The request for a run that post() began with status ``rc``.
        Complete already: ``finish`` runs now and the request is a plain
        completed one (the engine's bookkeeping for a request in flight was
        most of a short call's cost). Otherwise the engine takes it over."""
        if rc == DONE:
            kit.release()
            try:
                if finish is not None:
                    finish()
            except BaseException as exc:  # reported by wait(), as the engine would
                req = engine.Request.completed(result)
                req._error = exc
                return req
            return engine.Request.completed(result)
        nat = _native.module()
        if rc == PENDING and deadline is None and nbytes >= engine.NATIVE_BG_MIN_BYTES and nat is not None:
            return self._in_c(nat, kit, tag, seq, result, finish, nbytes)
        wake = nbytes if nbytes >= (SHM_WAKE_MIN_BYTES if self.probe else LONG_BYTES) else 0
        return engine.submit(ProgramRequest(self, kit, tag, seq, result, finish, deadline, self.st, rc), wake)

    def _in_c(self, nat, kit, tag, seq, result, finish, nbytes):
        """A long run that post() left pending, as an XRun over its kit
        (csrc/native.c) for engine.start_native: the C progress thread runs
        its passes without the GIL while the caller computes (or, without
        that thread, the engine's list). ``finish`` after the kit's
        release; a failed run's kit stays with the library."""
        def failed(rc, tag, seq):
            kit.abandon()
            return self.error(rc, kit.info, tag, seq)

        def done():
            kit.release()
            if finish is not None:
                finish()
        xr = nat.XRun(*self.xrun_args(kit), failed)
        xr.posted(tag, seq)
        return engine.start_native(xr, result, done, nbytes, self.st, keep=kit)


class ProgramRequest(engine.Request):
    """A program in flight: the engine advances it through the executor's
    nonblocking mode; wait() alone finishes it in one blocking C call."""

    def __init__(self, exe, kit, tag, seq, result, finish, deadline, st, rc=None):
        super().__init__(result, None, finish, deadline, st)
        self._exe, self._kit = exe, kit
        self._tag, self._seq = tag, seq
        self._rc = rc  # the status of the pass that posted it (Executable.post), None: not posted

    def _run(self, blocking) -> int:
        exe, kit = self._exe, self._kit
        if blocking:
            return run_blocking(kit.state, exe.steps, exe.nsteps, exe.lists, kit.c_buf, kit.c_src, kit.ptrs, exe.op,
                                exe.dtype, exe.handle, self._tag, kit.info)
        return lib.mpicoll_x_run(kit.state, exe.steps, exe.nsteps, exe.lists, kit.c_buf, kit.c_src, kit.ptrs,
                                 exe.op, exe.dtype, exe.handle, self._tag, 0, kit.info)

    def _settle_rc(self, rc) -> None:
        if rc == DONE:
            self._kit.release()
            self._end()
        else:
            self._fail(self._exe.error(rc, self._kit.info, self._tag, self._seq))

    # ---- called with the engine lock held ----
    def _start(self) -> None:
        # Not posted yet, or posted and pending: a pass (its messages may
        # have arrived since); or the error the posting pass met.
        rc = self._rc
        if rc is None or rc == PENDING:
            rc = self._run(0)
        if rc != PENDING:
            self._settle_rc(rc)

    def _fail(self, exc) -> None:
        # Posted messages stay with the library: keep what they point into
        # (the kit holds the state, the buffers and the scratch).
        self._kit.abandon()
        self._kit = None
        self._error = exc
        self._complete()

    def _expired(self) -> BaseException:
        exe, prog = self._exe, self._exe.prog
        pos = int(lib.mpicoll_x_position(self._kit.state))
        step = prog.steps[min(pos, len(prog.steps) - 1)]
        ctx = _sched.Context(exe.st, self._tag, {}, (exe.collective, exe.algorithm, prog.nbytes, self._seq))
        ops = []
        if step[0] == 3:  # a wait step: its messages are what is late
            pairs = prog.lists[step[1]:step[1] + 2 * step[2]]
            for slot in pairs[0::2]:
                kind, peer, nbytes, phase = prog.slots[int(slot)]
                ctx.phase = phase
                ops.append(_sched.Op(kind, ctx, np.empty(nbytes, np.uint8), peer))
        return _sched.timeout_error(ops, [False] * len(ops)) if ops else _sched.timeout_error([])

    def _advance(self) -> int:
        if self._finished:
            return -1
        state = self._kit.state
        before = lib.mpicoll_x_mark(state)
        rc = self._run(0)
        if rc == PENDING:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._fail(self._expired())
                return -1
            return int(lib.mpicoll_x_mark(state) != before)
        self._settle_rc(rc)
        return -1

    def _complete(self) -> None:
        self._finished = True

    def wait(self):
        if not self._seen_done() and self._deadline is None and engine.claim_alone(self):
            # Nothing else in flight: finish in one blocking C call (GIL released).
            try:
                rc = self._run(1)
            except BaseException:  # Ctrl-C while a shm peer is late: back to the engine, still pending
                engine.unclaim(self)
                raise
            engine.finish_claimed(self, self._settle_rc, rc)
        else:
            engine._engine.wait(self)
        self._raise()
        return self.result

    def __repr__(self):
        return f"<mpicoll.ProgramRequest {'complete' if self.done else 'pending'}>"
