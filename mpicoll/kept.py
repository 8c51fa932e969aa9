"""Kept plans: a call's decision replayed on new buffers.

The front doors file each kept plan in the communicator's plan cache
(mpicoll/plancache.py) under the call's signature: collective, shape,
dtype, op, root, counts vectors, algorithm and whether out is absent, x
itself or another array. A hit runs the kept decision - the MPI library's
own collective, a copy on one rank, or (all-reduce) the compiled or bound
schedule of any algorithm - on the call's arrays without building a plan
again. A call it cannot serve exactly as the full path would (a
non-contiguous or misaligned array, an overlap, a changed environment) is
a MISS and takes the full path, which also raises the usual errors.

Every kept class has one shape: ``_bufs(x, out)`` checks the call and
returns (x, out, result) or MISS; ``_blocking``/``_nonblocking`` make the
MPI library's call in its two forms (the same collective as the full
path's, so ranks that hit and ranks that miss still match); ``_finish``
runs after it (avg's division). ``call`` is False when there is nothing to
exchange (one rank, no bytes).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import _env
from . import engine
from . import executor as _executor
from . import native as _native
from . import program as _program
from . import schedule as _sched
from .algorithms import mpi as _mpi
from .buffers import may_share_memory as _share
from .plancache import MISS as _MISS, Kept as _Kept, env_unchanged as _env_unchanged
from .runtime import Plan, _finish, enter


_IN_PLACE = MPI.IN_PLACE


def _plain(a) -> bool:
    """A numpy array the MPI library can take as it is."""
    fl = a.flags
    return fl.c_contiguous and fl.aligned


def _out_ok(out, shape, dtype) -> bool:
    """``out`` can receive a ``shape``/``dtype`` result without staging."""
    if type(out) is not np.ndarray or out.shape != shape:
        return False
    od = out.dtype
    if od is not dtype and od != dtype:  # (identity first: the usual case, and cheaper)
        return False
    fl = out.flags
    return fl.c_contiguous and fl.aligned and fl.writeable


def _free_out(out, shape, dtype, x) -> bool:
    """``out`` can receive a ``shape``/``dtype`` result without staging and
    does not overlap ``x``."""
    if not _out_ok(out, shape, dtype):
        return False
    # Two arrays that each own their memory are two allocations, which cannot
    # overlap: the usual call skips may_share_memory (~0.7 us here).
    if out is not x and out.flags.owndata and x.flags.owndata:
        return True
    return not _share(x, out)


def _place(x, out, a: int, b: int) -> bool:
    """Put ``x`` (plain, ``b - a`` elements of out's dtype) at elements
    [a, b) of ``out``; nothing to copy when x already is that block (the
    in-place forms). False when x overlaps out any other way: the full path
    then decides (and raises)."""
    if x.size and _share(x, out):
        return x.ctypes.data == out.ctypes.data + a * out.itemsize
    out.reshape(-1)[a:b] = x.reshape(-1)
    return True


def _gate(kept, nat, allowed: bool) -> None:
    """Once a call ran through ``nat``, gate it (csrc/native.c ``gate``) so
    that the front door runs the whole kept call in C from then on
    (``kept.fast``), where ``allowed`` (its checks are C's: bcast's, and an
    all-reduce's but for avg's division)."""
    if allowed and kept.fast is None and _env._DATA is not None:
        nat.gate(kept.st, kept, _env._DATA, engine, _MISS)
        kept.fast = nat


def _gate_program(kept, exe) -> None:
    """Once a kept all-reduce's compiled schedule ran, a native Call of kind
    PROGRAM runs its blocking calls whole in C (kept.fast; api.allreduce
    calls it first): the checks, the gate, the call number and tag, the
    executor, as for the library's algorithm (_gate). Not for avg (its
    division stays here) nor for a program whose scratch comes from the
    communicator's pool; never where native calls are off or not built."""
    exe.gated = False
    if kept.fast is None and not kept.avg and exe.own and _env._DATA is not None and _native.PROGRAM is not None:
        call = _native.call(_native.PROGRAM, kept.st.comm)
        if call is not None:
            exe.point(call)
            _gate(kept, call, True)


class _KeptCall(_Kept):
    """``nat``: the call made from C (native.py), None where mpi4py makes it
    (not built, turned off, nothing to exchange); ``_nat_bufs(x, out)``
    gives its (send, receive) arrays, None for MPI_IN_PLACE or none."""

    __slots__ = ("call", "mode", "nat", "fast")

    # Whether nat, once a call ran through it, is gated to run the whole
    # call in C (csrc/native.c: bcast's, reduce's, reduce_scatter's,
    # allgather's, allgatherv's, alltoall's, alltoallv's, scatter's and
    # gather's, whose checks it knows); the front door then calls ``fast``
    # first (api._door).
    GATED = False

    def __init__(self, st, call):
        super().__init__(st)
        self.call, self.mode, self.nat, self.fast = call, 0, None, None

    def _gate(self, nat):
        _gate(self, nat, self.GATED)

    def _native(self, kind, **how):
        if self.call:
            self.nat = _native.call(kind, self.st.comm, **how)

    def _usable(self, x) -> bool:
        return not self.st.freed and _plain(x) and _env_unchanged(self)

    def _given_out(self, x, out, shape):
        """The result array of a call whose ``out`` may overlap ``x`` (the
        caller sorts that out): a new one (mode 0), ``out`` if it can take
        a ``shape`` result of x's dtype, else MISS (also for an unusable x)."""
        if not self._usable(x):
            return _MISS
        if self.mode == 0:
            return np.empty(shape, x.dtype)
        return out if _out_ok(out, shape, x.dtype) else _MISS

    def _finish(self, out, result):
        pass

    def __call__(self, x, out=None):
        """Blocking: the result, or MISS."""
        b = self._bufs(x, out)
        if b is _MISS:
            return b
        x, out, result = b
        if self.call:
            st = self.st
            enter(st)
            try:
                st.next_seq()
                nat = self.nat
                if nat is None:
                    self._blocking(x, out)
                else:
                    rc = nat.run(*self._nat_bufs(x, out))
                    if rc:
                        _native.check(rc)
                    self._gate(nat)
                self._finish(out, result)
            finally:
                st.busy.release()
        return result

    def start(self, x, out=None):
        """Nonblocking: an engine request over the library's I-call, or MISS."""
        b = self._bufs(x, out)
        if b is _MISS:
            return b
        x, out, result = b
        if not self.call:
            return engine.Request.completed(result)
        st = self.st
        enter(st)
        try:
            st.next_seq()
            nat = self.nat
            if nat is None:
                req = self._nonblocking(x, out)
            else:
                req = nat.start(*self._nat_bufs(x, out))
                self._gate(nat)
        finally:
            st.busy.release()
        return engine.start_native(req, result, self._after(out, result), x.nbytes, st, keep=(x, out))

    def _after(self, out, result):
        """What the request runs once the library's call completed, or None."""
        return None


class KeptAllreduce(_Kept):
    """allreduce: the decision (algorithm, knobs, Reduction) replayed on the
    call's arrays. The MPI library's algorithm is called straight away
    (``datatype``/``op`` set), one rank copies, any other algorithm gets a
    plan bound to the call's arrays (``bind``: its schedule over them).
    ``mode``: 0 no out, 1 out is x, 2 another out (set by the front door)."""

    __slots__ = ("name", "entry", "knobs", "red", "datatype", "op", "mode", "avg", "exe", "nat", "fast")

    def __init__(self, st, name, entry, knobs, red, native):
        super().__init__(st)
        self.name, self.entry, self.knobs, self.red, self.mode = name, entry, knobs, red, 0
        self.avg = red.op.average
        self.datatype, self.op = _mpi._typed(red) if native else (None, None)
        self.nat = (_native.call(_native.ALLREDUCE, st.comm, self.datatype, self.op)
                    if native and st.size > 1 else None)
        # nat gated (csrc/native.c, gate()): this whole method for the
        # library's algorithm in C, from the second hit on; None until then
        # or where there is no nat (or avg, whose division stays here).
        self.fast = None
        # The schedule compiled for the C executor (or the program the
        # algorithm writes itself: registry ``program``, shm's): None until
        # the first hit tries, then an executor.Executable or False (not
        # compilable, no executor, or turned off).
        self.exe = None

    def _compiled(self, x):
        """This signature's Executable, made at the first hit, or False."""
        exe = False
        entry = self.entry
        if entry is not None and (entry.compilable or entry.program is not None) and self.st.size > 1 \
                and _executor.enabled():
            prog = _program.for_entry(entry, self.st, x.size, x.dtype, self.red, self.mode != 1, self.knobs)
            if prog is not None:
                exe = _executor.Executable(prog, self.st, self.red, "allreduce", self.name)
        self.exe = exe
        return exe

    def _schedule(self, x, out, tag, seq):
        """The schedule, blocking, on call number ``seq`` (taken): a call
        the program's window did not take (Executable.ready)."""
        st, red, entry, knobs = self.st, self.red, self.entry, self.knobs
        flat = out.reshape(-1)
        if entry.prepare is not None:
            entry.prepare(st, flat, red, **knobs)
        ctx = _sched.Context(st, tag, st.pool, ("allreduce", self.name, flat.nbytes, seq))
        _sched.run(entry.schedule(ctx, flat, red, None if out is x else x.reshape(-1), **knobs))

    def _out(self, x, out):
        """The result array for this call, or MISS."""
        fl = x.flags
        if self.st.freed or not (fl.c_contiguous and fl.aligned) or not _env_unchanged(self):
            return _MISS
        mode = self.mode
        if mode == 0:
            return np.empty(x.shape, x.dtype)
        if mode == 1:
            return x if fl.writeable else _MISS
        if self.nat is not None:
            return out if self.nat.fits(x, out) else _MISS
        return out if _free_out(out, x.shape, x.dtype, x) else _MISS

    def __call__(self, x, out):
        # (api.allreduce calls self.fast itself first: all of the below in
        # one C call, MISS for anything unusual, which this then decides.)
        # The hot path of every short all-reduce: the checks of _out and
        # enter() written out (each Python call costs ~0.1 us here).
        st = self.st
        fl = x.flags
        if st.freed or not (fl.c_contiguous and fl.aligned) or not _env_unchanged(self):
            return _MISS
        mode = self.mode
        if mode == 0:
            out = np.empty(x.shape, x.dtype)
        elif mode == 1:
            if not fl.writeable:
                return _MISS
        elif not (_free_out(out, x.shape, x.dtype, x) if self.nat is None else self.nat.fits(x, out)):
            return _MISS
        if st.size == 1:
            if mode != 1:
                out[...] = x
            return out
        dt = self.datatype
        if dt is None:
            exe = self.exe
            if exe is None:
                exe = self._compiled(x)
            if not exe:
                return self._plan(x, out, st.pool).run()
        busy = st.busy
        if engine._running_callbacks or not busy.acquire(False):
            enter(st)  # raises the error that applies
        try:
            if dt is None:
                seq, tag = st.next_seq()
                if exe.probe and not exe.ready():  # shm's window busy or too small: the schedule waits its turn
                    self._schedule(x, out, tag, seq)  # (the same call number)
                else:  # the program, one C call
                    exe.run(out, None if mode == 1 else x, tag, seq)
                    if exe.gated is None:
                        _gate_program(self, exe)
            else:
                st.next_seq()
                nat = self.nat
                if nat is None:
                    st.comm.Allreduce(_IN_PLACE if mode == 1 else [x, dt], [out, dt], self.op)
                else:
                    rc = nat.run(None if mode == 1 else x, out)
                    if rc:
                        _native.check(rc)
                    _gate(self, nat, not self.avg)
            if self.avg:
                self.red.finish(out.reshape(-1), st.size)
        finally:
            busy.release()
        return out

    def start(self, x, out):
        """Nonblocking: a request of this decision over the call's arrays, or MISS."""
        out = self._out(x, out)
        if out is _MISS:
            return out
        st = self.st
        if st.size == 1:
            return self._plan(x, out, None).start()
        if self.datatype is None:
            # Nonblocking: a recorded schedule on the executor below
            # executor.LONG_BYTES (from 1 MiB its pending run on the C
            # progress thread); from there the generator under the
            # progress thread, which overlapped numpy compute better. shm's
            # program (its copies and reduction are the call) at every size
            # it serves, while its window takes it.
            if self.entry.program is None and x.nbytes >= _executor.LONG_BYTES:
                return self._plan(x, out, None).start()
            exe = self.exe
            if exe is None:
                exe = self._compiled(x)
            if not exe or (exe.probe and not exe.ready()):
                return self._plan(x, out, None).start()
            return self._start_compiled(exe, x, out)
        busy = st.busy
        if engine._running_callbacks or not busy.acquire(False):
            enter(st)  # raises the error that applies
        try:
            st.next_seq()
            nat = self.nat
            if nat is None:
                dt = self.datatype
                req = st.comm.Iallreduce(_IN_PLACE if out is x else [x, dt], [out, dt], self.op)
            else:
                req = nat.start(None if out is x else x, out)
                _gate(self, nat, not self.avg)  # (the next starts: api._door)
        finally:
            busy.release()
        if self.avg:
            red, size = self.red, st.size
            finish = lambda: red.finish(out.reshape(-1), size)  # noqa: E731
        else:
            finish = None
        return engine.start_native(req, out, finish, x.nbytes, st, keep=(x, out))

    def _start_compiled(self, exe, x, out):
        st, red = self.st, self.red
        kit, give_back = exe.take_kit()
        avg, size = self.avg, st.size

        def finish():
            if avg:
                red.finish(out.reshape(-1), size)
            give_back()

        enter(st)
        try:
            seq, tag = st.next_seq()
            req = exe.start(out, None if out is x else x, tag, seq, kit, out, finish, None, x.nbytes)
        finally:
            st.busy.release()
        if exe.gated is None:  # the next I-calls whole in C (csrc/native.c, "a program's I-call")
            _gate_program(self, exe)
        return req

    def _plan(self, x, out, pool):
        st, red = self.st, self.red
        flat = out.reshape(-1)
        src = None if out is x else x.reshape(-1)
        if st.size == 1:
            def copy():
                if src is not None:
                    flat[...] = src
            return Plan(st, "allreduce", self.name, flat.nbytes, out, None, prologue=copy)
        entry, knobs = self.entry, self.knobs
        if entry.prepare is not None:  # as the full path does at every call (window sizes)
            entry.prepare(st, flat, red, **knobs)  # its decisions are in knobs already
        sched = entry.schedule
        plan = Plan(st, "allreduce", self.name, flat.nbytes, out,
                    (lambda ctx: sched(ctx, flat, red, src, **knobs)) if knobs else
                    (lambda ctx: sched(ctx, flat, red, src)), finish=_finish(st, red, flat))
        if entry.native is not None:
            plan.native = entry.native(st.comm, flat, red, src)
        plan.pool = pool
        return plan


class KeptBcast(_KeptCall):
    """bcast: MPI_Bcast of the call's array as bytes (in place)."""

    GATED = True

    __slots__ = ("root",)

    def __init__(self, st, root, call):
        super().__init__(st, call)
        self.root = root
        self._native(_native.BCAST, root=root)

    def _bufs(self, x, out):
        fl = x.flags
        if self.st.freed or not (fl.c_contiguous and fl.writeable) or not _env_unchanged(self):
            return _MISS
        return x, x, x

    def _nat_bufs(self, x, out):
        return (None, x)

    def _blocking(self, x, out):
        self.st.comm.Bcast([x, MPI.BYTE], self.root)

    def _nonblocking(self, x, out):
        return self.st.comm.Ibcast([x, MPI.BYTE], self.root)


class KeptReduce(_KeptCall):
    """reduce: MPI_Reduce from the call's array into root's result (one rank
    copies). ``mode`` as KeptAllreduce's, on the root; None off root."""

    __slots__ = ("datatype", "op", "red", "root")

    def __init__(self, st, datatype, op, red, root):
        super().__init__(st, st.size > 1)
        self.datatype, self.op, self.red, self.root = datatype, op, red, root
        self._native(_native.REDUCE, datatype=datatype, op=op, root=root)

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        if self.st.rank != self.root:
            return x, None, None
        if self.mode == 0:
            out = np.empty(x.shape, x.dtype)
        elif self.mode == 1:
            if not x.flags.writeable:
                return _MISS
        elif not _free_out(out, x.shape, x.dtype, x):
            return _MISS
        if self.st.size == 1 and out is not x:
            out[...] = x
        return x, out, out

    def _args(self, x, out):
        dt = self.datatype
        if out is None:
            return [x, dt], None, self.op, self.root
        return MPI.IN_PLACE if out is x else [x, dt], [out, dt], self.op, self.root

    def _gate(self, nat):
        # (gated whole in C, but for avg: its division stays here)
        _gate(self, nat, not self.red.op.average)

    def _nat_bufs(self, x, out):
        return (None if out is x else x, out)

    def _blocking(self, x, out):
        self.st.comm.Reduce(*self._args(x, out))

    def _nonblocking(self, x, out):
        return self.st.comm.Ireduce(*self._args(x, out))

    def _finish(self, out, result):
        if out is not None and self.red.op.average:
            self.red.finish(out.reshape(-1), self.st.size)

    def _after(self, out, result):
        return (lambda: self._finish(out, result)) if out is not None and self.red.op.average else None


class KeptAllgather(_KeptCall):
    """allgather: x placed in row ``rank`` of the result, then the MPI
    library's in-place MPI_Allgatherv over equal byte blocks (the full
    path's call). Gated (csrc/native.c does the same, x's row included)."""

    GATED = True

    __slots__ = ("spec",)

    def __init__(self, st, block, call):
        super().__init__(st, call)
        p = st.size
        self.spec = ([block] * p, [block * i for i in range(p)])
        self._native(_native.ALLGATHERV, counts=self.spec[0], displs=self.spec[1])

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        shape = (self.st.size,) + x.shape
        if self.mode == 0:
            out = np.empty(shape, x.dtype)
        elif not _free_out(out, shape, x.dtype, x):
            return _MISS
        out[self.st.rank] = x
        return x, out, out

    def _nat_bufs(self, x, out):
        return (None, out)

    def _blocking(self, x, out):
        self.st.comm.Allgatherv(MPI.IN_PLACE, [out, self.spec, MPI.BYTE])

    def _nonblocking(self, x, out):
        return self.st.comm.Iallgatherv(MPI.IN_PLACE, [out, self.spec, MPI.BYTE])


def _kept_rooted(cls, plan, root, bounds, shape, itemsize):
    """The kept scatter/gather(v) of ``plan``: the MPI library's call (or
    nothing to send: one rank, empty blocks), without a deadline.
    ``bounds``: every rank's block in bytes; ``shape``: the result's shape
    (the scatter's block, the gather's whole buffer on root)."""
    if plan.timeout is not None or not (plan.native is not None or plan.schedule is None):
        return None
    lo, hi = bounds[root]
    return cls(plan.st, root, [b - a for a, b in bounds], [a for a, _ in bounds], plan.schedule is not None,
               shape, (lo // itemsize, hi // itemsize))


class _KeptRooted(_KeptCall):
    """scatter/gather's kept call, equal blocks or counts given: byte counts
    and displacements of every rank's block (``spec``), the result's shape,
    and root's own block in elements (``own``), which root places itself."""

    __slots__ = ("root", "spec", "shape", "own")

    def __init__(self, st, root, counts, displs, call, shape, own):
        super().__init__(st, call)
        self.root, self.spec, self.shape, self.own = root, (counts, displs), shape, own
        self._native(self.NATIVE, root=root, counts=counts, displs=displs)


class KeptScatter(_KeptRooted):
    """scatter(v): root places its own block, then MPI_Scatterv as the full
    path calls it. Root's x holds every block (``(p,) + s``, or flat with
    counts); another rank's x may be None (then ``out`` is required) and is
    not read. Gated (csrc/native.c knows its checks)."""

    NATIVE = _native.SCATTERV
    GATED = True

    def _bufs(self, x, out):
        st = self.st
        if st.freed or not _env_unchanged(self) or x is not None and not _plain(x):
            return _MISS
        if out is None:
            if x is None:
                return _MISS
            out = np.empty(self.shape, x.dtype)
        elif x is not None:
            if not _out_ok(out, self.shape, x.dtype):
                return _MISS
        else:
            fl = out.flags
            if type(out) is not np.ndarray or not (fl.c_contiguous and fl.aligned and fl.writeable):
                return _MISS
        if st.rank == self.root:
            a, b = self.own
            if x.size and _share(x, out):
                # in place: out must be root's own block of x
                if out.ctypes.data != x.ctypes.data + a * x.itemsize:
                    return _MISS
            elif self.nat is None:  # (from C the library copies it: _nat_bufs)
                out.reshape(-1)[...] = x.reshape(-1)[a:b]
        elif x is not None and out.size and _share(x, out):
            return _MISS  # (the full path's rule: it decides)
        return (out if x is None else x), out, out

    def _args(self, x, out):
        if self.st.rank == self.root:
            return [x, self.spec, MPI.BYTE], MPI.IN_PLACE, self.root
        return None, [out, MPI.BYTE], self.root

    def _nat_bufs(self, x, out):
        # root: out apart from x receives root's block from the library,
        # out inside x is in place (native.c tells them apart)
        return ((x, out) if self.st.rank == self.root else (None, out))

    def _blocking(self, x, out):
        self.st.comm.Scatterv(*self._args(x, out))

    def _nonblocking(self, x, out):
        return self.st.comm.Iscatterv(*self._args(x, out))


class KeptGather(_KeptRooted):
    """gather(v): root places its own block (none to place when x already
    is that block of out), then MPI_Gatherv as the full path calls it; None
    off root. Gated (csrc/native.c knows its checks: root's out of
    ``shape``, x apart from it or exactly root's block of it)."""

    NATIVE = _native.GATHERV
    GATED = True

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        st = self.st
        if st.rank != self.root:
            return x, None, None
        if out is None:
            out = np.empty(self.shape, x.dtype)
        elif not _out_ok(out, self.shape, x.dtype):
            return _MISS
        a, b = self.own
        if self.nat is not None:  # (the library copies root's block: _nat_bufs)
            if x.size and _share(x, out) and x.ctypes.data != out.ctypes.data + a * out.itemsize:
                return _MISS  # x overlaps out but is not root's block of it: the full path decides
        elif not _place(x, out, a, b):
            return _MISS
        return x, out, out

    def _args(self, x, out):
        if out is not None:
            return MPI.IN_PLACE, [out, self.spec, MPI.BYTE], self.root
        return [x, MPI.BYTE], None, self.root

    def _nat_bufs(self, x, out):
        # root: x apart from out is sent by the library, x inside out is in
        # place (native.c tells them apart); elsewhere out is None
        return (x, out)

    def _blocking(self, x, out):
        self.st.comm.Gatherv(*self._args(x, out))

    def _nonblocking(self, x, out):
        return self.st.comm.Igatherv(*self._args(x, out))


class KeptAlltoall(_KeptCall):
    """alltoall: MPI_Alltoall of equal byte blocks between the call's arrays
    (out apart from x; one rank copies). Gated (csrc/native.c knows its
    checks: x's shape for a new out, else an out apart from x)."""

    GATED = True

    __slots__ = ("block",)

    def __init__(self, st, block, call):
        super().__init__(st, call and st.size > 1)
        self.block = block
        self._native(_native.ALLTOALL, block=block)

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        if self.mode == 0:
            out = np.empty(x.shape, x.dtype)
        elif not _free_out(out, x.shape, x.dtype, x):
            return _MISS
        if self.st.size == 1:
            out[...] = x
        return x, out, out

    def _nat_bufs(self, x, out):
        return (x, out)

    def _blocking(self, x, out):
        bs = self.block
        self.st.comm.Alltoall([x, bs, MPI.BYTE], [out, bs, MPI.BYTE])

    def _nonblocking(self, x, out):
        bs = self.block
        return self.st.comm.Ialltoall([x, bs, MPI.BYTE], [out, bs, MPI.BYTE])


class KeptReduceScatter(_KeptCall):
    """reduce_scatter: MPI_Reduce_scatter from the call's input straight
    into this rank's block (the full path's call; the library only reads its
    send buffer, so x needs no copy). An ``out`` that overlaps x receives
    through a fresh array, copied into it once the call completed; one rank
    copies. ``mode``: 0 no out, else out given."""

    __slots__ = ("datatype", "op", "red", "counts", "n")

    def __init__(self, st, red, bounds):
        super().__init__(st, st.size > 1)
        self.datatype, self.op = _mpi._typed(red)
        self.red = red
        self.counts = [b - a for a, b in bounds]
        self.n = self.counts[st.rank]
        self._native(_native.REDUCE_SCATTER, datatype=self.datatype, op=self.op, counts=self.counts)

    def _bufs(self, x, out):
        out = self._given_out(x, out, (self.n,))
        if out is _MISS:
            return out
        if not self.call:  # one rank: its block is all of x
            out[...] = x.reshape(-1)
            return x, out, out
        if not out.size or _share(x, out):
            # (MPICH refuses aliased buffers, also an empty block at x's address)
            return x, np.empty((self.n,), x.dtype), out
        return x, out, out

    def _gate(self, nat):
        # (gated whole in C, but for avg: its division stays here)
        _gate(self, nat, not self.red.op.average)

    def _nat_bufs(self, x, out):
        return (x, out)

    def _blocking(self, x, out):
        dt = self.datatype
        self.st.comm.Reduce_scatter([x, dt], [out, dt], self.counts, self.op)

    def _nonblocking(self, x, out):
        dt = self.datatype
        return self.st.comm.Ireduce_scatter([x, dt], [out, dt], self.counts, self.op)

    def _finish(self, out, result):
        if out is not result:
            result[...] = out
        if self.red.op.average:
            self.red.finish(result, self.st.size)

    def _after(self, out, result):
        return (lambda: self._finish(out, result)) if out is not result or self.red.op.average else None


class KeptAllgatherv(_KeptCall):
    """allgatherv: x placed at its block of the result (nothing to place
    when x already is that block: in place), then the MPI library's in-place
    MPI_Allgatherv over the blocks in bytes, as the full path calls it.
    ``mode``: 0 no out, else out given. Gated (csrc/native.c does the
    same, x's block included)."""

    GATED = True

    __slots__ = ("spec", "shape", "own")

    def __init__(self, st, bounds, itemsize, call):
        super().__init__(st, call)
        self.spec = ([b - a for a, b in bounds], [a for a, _ in bounds])
        self.shape = (bounds[-1][1] // itemsize,)
        lo, hi = bounds[st.rank]
        self.own = (lo // itemsize, hi // itemsize)
        self._native(_native.ALLGATHERV, counts=self.spec[0], displs=self.spec[1])

    def _bufs(self, x, out):
        out = self._given_out(x, out, self.shape)
        if out is _MISS:
            return out
        if not _place(x, out, *self.own):
            return _MISS
        return x, out, out

    def _nat_bufs(self, x, out):
        return (None, out)

    def _blocking(self, x, out):
        self.st.comm.Allgatherv(MPI.IN_PLACE, [out, self.spec, MPI.BYTE])

    def _nonblocking(self, x, out):
        return self.st.comm.Iallgatherv(MPI.IN_PLACE, [out, self.spec, MPI.BYTE])


class KeptAlltoallv(_KeptCall):
    """alltoallv: MPI_Alltoallv of the byte blocks between the call's arrays
    (the full path's call). In place (out is x's memory) sends from a copy
    of x, as the full path does; one rank copies. ``mode``: 0 no out, else
    out given. Gated (csrc/native.c: but for in place, which stays here)."""

    GATED = True

    __slots__ = ("sspec", "rspec", "shape")

    def __init__(self, st, sbounds, rbounds, itemsize, call):
        super().__init__(st, call and st.size > 1)
        self.sspec = ([b - a for a, b in sbounds], [a for a, _ in sbounds])
        self.rspec = ([b - a for a, b in rbounds], [a for a, _ in rbounds])
        self.shape = (rbounds[-1][1] // itemsize,)
        self._native(_native.ALLTOALLV, counts=self.sspec[0], displs=self.sspec[1], rcounts=self.rspec[0],
                     rdispls=self.rspec[1])

    def _bufs(self, x, out):
        out = self._given_out(x, out, self.shape)
        if out is _MISS:
            return out
        if out.size and _share(x, out):
            if out.ctypes.data != x.ctypes.data or out.nbytes != x.nbytes:
                return _MISS  # a partial overlap: the full path's error
            x = x.copy()
        if not self.call:
            out.reshape(-1)[...] = x.reshape(-1)
        return x, out, out

    def _nat_bufs(self, x, out):
        return (x, out)

    def _blocking(self, x, out):
        self.st.comm.Alltoallv([x, self.sspec, MPI.BYTE], [out, self.rspec, MPI.BYTE])

    def _nonblocking(self, x, out):
        return self.st.comm.Ialltoallv([x, self.sspec, MPI.BYTE], [out, self.rspec, MPI.BYTE])
