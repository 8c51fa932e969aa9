"""The native MPI collectives, as a baseline and as a legitimate choice.

Function:     allreduce(st, buf, red), reduce_scatter(st, buf, red, bounds),
              allgather(st, buf, bounds), bcast(st, buf, root),
              reduce(st, buf, red, root)
Description:  Calls MPI_Allreduce, MPI_Reduce_scatter, MPI_Allgatherv,
              MPI_Bcast and MPI_Reduce on mpicoll's duplicate communicator,
              whatever algorithm the MPI library picks inside.
              Where MPI has the datatype and op (integers, float32, float64
              with the predefined ops) the call is fully native. float16 and
              bfloat16 have no predefined MPI datatype, so they travel as
              MPI_UINT16_T with a user-defined MPI_Op whose callback runs
              mpicoll's C kernel: MPI's algorithm, our arithmetic.
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

from . import register
from ..kernels import Reduction

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
    """(datatype, op) for a native call."""
    if red.dtype.mpi is not None:
        return red.dtype.mpi, red.op.mpi
    return MPI.UINT16_T, _user_op(red)


@register("allreduce", "mpi")
def allreduce(st, buf, red, *, src=None):
    datatype, op = _typed(red)
    st.comm.Allreduce(MPI.IN_PLACE if src is None else [src, datatype], [buf, datatype], op)


@register("reduce_scatter", "mpi")
def reduce_scatter(st, buf, red, bounds):
    datatype, op = _typed(red)
    counts = [b - a for a, b in bounds]
    a, b = bounds[st.rank]
    # MPI_Reduce_scatter writes this rank's block to the front of the
    # receive buffer; reduce out of place into a scratch copy, then place it.
    out = st.scratch("mpi_rs", max(b - a, 1) * buf.itemsize).view(buf.dtype)[:b - a]
    st.comm.Reduce_scatter([buf, datatype], [out, datatype], counts, op)
    buf[a:b] = out


@register("allgather", "mpi")
def allgather(st, buf, bounds):
    counts = [(b - a) * buf.itemsize for a, b in bounds]
    displs = [a * buf.itemsize for a, _ in bounds]
    st.comm.Allgatherv(MPI.IN_PLACE, [buf, (counts, displs), MPI.BYTE])


@register("bcast", "mpi")
def bcast(st, buf, root):
    st.comm.Bcast([buf, MPI.BYTE], root)


@register("reduce", "mpi")
def reduce(st, buf, red, root):
    datatype, op = _typed(red)
    if st.rank == root:
        st.comm.Reduce(MPI.IN_PLACE, [buf, datatype], op, root)
    else:
        st.comm.Reduce([buf, datatype], None, op, root)
