"""The native MPI collectives, as a baseline and as a legitimate choice.

Function:     allreduce(ctx, buf, red, src=None), reduce_scatter(ctx, buf, red, bounds),
              allgather(ctx, buf, bounds), bcast(ctx, buf, root),
              reduce(ctx, buf, red, root)
Description:  Calls MPI_Allreduce, MPI_Reduce_scatter, MPI_Allgatherv,
              MPI_Bcast and MPI_Reduce on mpicoll's duplicate communicator,
              whatever algorithm the MPI library picks inside. Each is
              described once by a ``NativeCall`` (the blocking call, its
              nonblocking MPI_I... form and its persistent MPI-4 ..._init
              form, over the same buffers): the blocking driver makes the
              blocking call, the nonblocking driver the I-call, and a
              persistent plan (``mpicoll.allreduce_init``) uses ..._init
              where the library has it.
              Where MPI has the datatype and op (integers, float32, float64
              with the predefined ops) the call is fully native. float16 and
              bfloat16 have no predefined MPI datatype, so they travel as
              MPI_UINT16_T with a user-defined MPI_Op whose callback runs
              mpicoll's C kernel: MPI's algorithm, our arithmetic. The same
              user op replaces a predefined op the library gets wrong
              (Open MPI's saturating 8/16-bit integer sums, see
              mpitypes.reduces_natively).
Cost:         Whatever the MPI library's tuning gives; in MPICH and Open MPI,
              recursive doubling for short and Rabenseifner or ring for long
              messages. User-defined ops add a Python callback per chunk MPI
              reduces.
Limitations:  The library decides the order of operations; MPI only
              guarantees the same result on every rank for MPI_Allreduce
              ("all processes ... receive identical results" is advice to
              implementors, which MPICH and Open MPI follow).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import native as _native
from ..buffers import Copy
from ..registry import register
from ..kernels import Reduction
from ..mpitypes import reduces_natively
from ..schedule import scratch

_user_ops = {}


def _user_op(red: Reduction) -> MPI.Op:
    """An MPI_Op that reduces with red's C kernel, created once per (op, dtype)."""
    key = (red.op.code, red.dtype.code)
    op = _user_ops.get(key)
    if op is None:
        storage = red.dtype.storage

        def fn(inbuf, inoutbuf, datatype):
            # MPI's contract: inoutbuf = inbuf OP inoutbuf, inbuf from the lower ranks.
            a = np.frombuffer(inbuf, storage)
            b = np.frombuffer(inoutbuf, storage)
            red.combine(b, a, b)

        op = MPI.Op.Create(fn, commute=True)
        _user_ops[key] = op
    return op


def _typed(red: Reduction):
    """(datatype, op) for a native call: MPI's own op where it reduces this
    dtype correctly (mpitypes.reduces_natively), else mpicoll's kernel as a
    user-defined op, over the dtype's MPI type or, for float16/bfloat16,
    which have none, MPI_UINT16_T."""
    if reduces_natively(red.dtype, red.op):
        return red.dtype.mpi, red.op.mpi
    return (red.dtype.mpi if red.dtype.native else MPI.UINT16_T), _user_op(red)


class NativeCall:
    """One native collective over fixed buffers: ``blocking()``, ``start()``
    (returns the MPI request of the I-form), ``init()`` (the persistent
    MPI-4 form's request, or None where the library lacks it) and
    ``after()`` (work once it has completed, e.g. placing a block)."""

    __slots__ = ("blocking", "start", "init", "after")

    def __init__(self, blocking, start, init=None, after=None):
        self.blocking, self.start, self.init, self.after = blocking, start, init, after


def _init(comm, name):
    """comm.<name>_init if this MPI library has persistent collectives."""
    fn = getattr(comm, name + "_init", None)
    return fn if fn is not None and MPI.Get_version() >= (4, 0) else None


def _persistent(init, args, kind, comm, sbuf, rbuf, **how):
    """A NativeCall's ``init``: the persistent request over the call's
    buffers, made from C where the native calls are built (native.py: its
    Start/Wait cost no buffer parsing) and by mpi4py's ``init(*args)``
    otherwise; None where the library has no persistent collectives.
    Decided when a persistent plan asks, not before (a plain call never
    does)."""
    if init is None:
        return None

    def make():
        nat = _native.call(kind, comm, **how)
        return init(*args) if nat is None else nat.init(sbuf, rbuf)
    return make


def allreduce_call(comm, buf, red, src=None) -> NativeCall:
    datatype, op = _typed(red)
    sb = MPI.IN_PLACE if src is None else [src, datatype]
    rb = [buf, datatype]
    init = _persistent(_init(comm, "Allreduce"), (sb, rb, op), _native.ALLREDUCE, comm, src, buf,
                       datatype=datatype, op=op)
    return NativeCall(lambda: comm.Allreduce(sb, rb, op), lambda: comm.Iallreduce(sb, rb, op), init)


def reduce_scatter_call(comm, buf, red, bounds, pool=None) -> NativeCall:
    datatype, op = _typed(red)
    counts = [b - a for a, b in bounds]
    a, b = bounds[comm.Get_rank()]
    # MPI_Reduce_scatter writes this rank's block to the front of the
    # receive buffer; reduce out of place into scratch (from the call's
    # scratch pool), then place it.
    longest = max(hi - lo for lo, hi in bounds)
    out = scratch({} if pool is None else pool, "mpi_rs", longest, buf.dtype)[:b - a]
    sb, rb = [buf, datatype], [out, datatype]
    init = _persistent(_init(comm, "Reduce_scatter"), (sb, rb, counts, op), _native.REDUCE_SCATTER, comm, buf, out,
                       datatype=datatype, op=op, counts=counts)

    return NativeCall(lambda: comm.Reduce_scatter(sb, rb, counts, op), lambda: comm.Ireduce_scatter(sb, rb, counts, op),
                      init, Copy(buf[a:b], out))


def allgather_call(comm, buf, bounds) -> NativeCall:
    counts = [(b - a) * buf.itemsize for a, b in bounds]
    displs = [a * buf.itemsize for a, _ in bounds]
    rb = [buf, (counts, displs), MPI.BYTE]
    init = _persistent(_init(comm, "Allgatherv"), (MPI.IN_PLACE, rb), _native.ALLGATHERV, comm, None, buf,
                       counts=counts, displs=displs)
    return NativeCall(lambda: comm.Allgatherv(MPI.IN_PLACE, rb), lambda: comm.Iallgatherv(MPI.IN_PLACE, rb), init)


def bcast_call(comm, buf, root) -> NativeCall:
    b = [buf, MPI.BYTE]
    init = _persistent(_init(comm, "Bcast"), (b, root), _native.BCAST, comm, None, buf, root=root)
    return NativeCall(lambda: comm.Bcast(b, root), lambda: comm.Ibcast(b, root), init)


def reduce_call(comm, buf, red, root) -> NativeCall:
    datatype, op = _typed(red)
    if comm.Get_rank() == root:
        sb, rb = MPI.IN_PLACE, [buf, datatype]
        ns, nr = None, buf
    else:
        sb, rb = [buf, datatype], None
        ns, nr = buf, None
    init = _persistent(_init(comm, "Reduce"), (sb, rb, op, root), _native.REDUCE, comm, ns, nr, datatype=datatype,
                       op=op, root=root)
    return NativeCall(lambda: comm.Reduce(sb, rb, op, root), lambda: comm.Ireduce(sb, rb, op, root), init)


def _run(ctx, call: NativeCall):
    yield [ctx.native(call.blocking, call.start)]
    if call.after is not None:
        call.after()


@register("allreduce", "mpi", native=allreduce_call)
def allreduce(ctx, buf, red, src=None):
    yield from _run(ctx, allreduce_call(ctx.comm, buf, red, src))


@register("reduce_scatter", "mpi", native=reduce_scatter_call)
def reduce_scatter(ctx, buf, red, bounds):
    yield from _run(ctx, reduce_scatter_call(ctx.comm, buf, red, bounds, ctx.pool))


@register("allgather", "mpi", native=allgather_call)
def allgather(ctx, buf, bounds):
    yield from _run(ctx, allgather_call(ctx.comm, buf, bounds))


@register("bcast", "mpi", native=bcast_call)
def bcast(ctx, buf, root):
    yield from _run(ctx, bcast_call(ctx.comm, buf, root))


@register("reduce", "mpi", native=reduce_call)
def reduce(ctx, buf, red, root):
    yield from _run(ctx, reduce_call(ctx.comm, buf, red, root))
