"""The MPI library's own scatter, gather, allgatherv, alltoall and alltoallv.

Function:     scatter(ctx, buf, bounds, root), gather(ctx, buf, bounds, root),
              allgatherv(ctx, buf, bounds),
              alltoall(ctx, src, dst, sbounds, rbounds),
              alltoallv(ctx, src, dst, sbounds, rbounds)
Description:  MPI_Scatterv, MPI_Gatherv (MPI_IN_PLACE at the root, whose
              block the plan layer places), MPI_Allgatherv (in place),
              MPI_Alltoall and MPI_Alltoallv on bytes, each a ``NativeCall``
              of mpi.py (blocking, I-form, and the MPI-4 persistent form
              where the library has it).

                  who        scatter          gather           alltoall(v)
                  root       sends blocks     receives blocks  -
                  every rank receives its own sends its own    sends/receives all

Cost:         Whatever the MPI library's tuning gives (MPICH: binomial
              scatter/gather, Bruck alltoall for short blocks, pairwise or
              isend/irecv for long).
Limitations:  The library decides; mpicoll only sees one call.
"""
from __future__ import annotations

from mpi4py import MPI

from .. import native as _native
from ..registry import register
from .mpi import NativeCall, _init, _persistent, _run

BYTE = MPI.BYTE


def _cd(bounds):
    return [b - a for a, b in bounds], [a for a, _ in bounds]


def scatter_call(comm, buf, bounds, root) -> NativeCall:
    counts, displs = _cd(bounds)
    if comm.Get_rank() == root:
        sb, rb = [buf, (counts, displs), BYTE], MPI.IN_PLACE
        ns, nr = buf, None
    else:
        sb, rb = None, [buf, BYTE]
        ns, nr = None, buf
    init = _persistent(_init(comm, "Scatterv"), (sb, rb, root), _native.SCATTERV, comm, ns, nr, root=root,
                       counts=counts, displs=displs)
    return NativeCall(lambda: comm.Scatterv(sb, rb, root), lambda: comm.Iscatterv(sb, rb, root), init)


def gather_call(comm, buf, bounds, root) -> NativeCall:
    counts, displs = _cd(bounds)
    if comm.Get_rank() == root:
        sb, rb = MPI.IN_PLACE, [buf, (counts, displs), BYTE]
        ns, nr = None, buf
    else:
        sb, rb = [buf, BYTE], None
        ns, nr = buf, None
    init = _persistent(_init(comm, "Gatherv"), (sb, rb, root), _native.GATHERV, comm, ns, nr, root=root,
                       counts=counts, displs=displs)
    return NativeCall(lambda: comm.Gatherv(sb, rb, root), lambda: comm.Igatherv(sb, rb, root), init)


def alltoall_call(comm, src, dst, sbounds, rbounds) -> NativeCall:
    p = comm.Get_size()
    bs = sbounds[0][1] - sbounds[0][0]
    # p blocks of bs bytes from the start of each buffer (the blocks are all
    # one length, from offset 0: plan.py), whatever lies beyond them
    sb, rb = [src[:p * bs], bs, BYTE], [dst[:p * bs], bs, BYTE]
    init = _persistent(_init(comm, "Alltoall"), (sb, rb), _native.ALLTOALL, comm, src, dst, block=bs)
    return NativeCall(lambda: comm.Alltoall(sb, rb), lambda: comm.Ialltoall(sb, rb), init)


def alltoallv_call(comm, src, dst, sbounds, rbounds) -> NativeCall:
    (sc, sd), (rc, rd) = _cd(sbounds), _cd(rbounds)
    sb, rb = [src, (sc, sd), BYTE], [dst, (rc, rd), BYTE]
    init = _persistent(_init(comm, "Alltoallv"), (sb, rb), _native.ALLTOALLV, comm, src, dst, counts=sc, displs=sd,
                       rcounts=rc, rdispls=rd)
    return NativeCall(lambda: comm.Alltoallv(sb, rb), lambda: comm.Ialltoallv(sb, rb), init)


@register("scatter", "mpi", native=scatter_call)
def scatter(ctx, buf, bounds, root):
    yield from _run(ctx, scatter_call(ctx.comm, buf, bounds, root))


@register("gather", "mpi", native=gather_call)
def gather(ctx, buf, bounds, root):
    yield from _run(ctx, gather_call(ctx.comm, buf, bounds, root))


def allgatherv_call(comm, buf, bounds) -> NativeCall:
    from .mpi import allgather_call

    return allgather_call(comm, buf, bounds)


@register("allgatherv", "mpi", native=allgatherv_call)
def allgatherv(ctx, buf, bounds):
    yield from _run(ctx, allgatherv_call(ctx.comm, buf, bounds))


@register("alltoall", "mpi", native=alltoall_call)
def alltoall(ctx, src, dst, sbounds, rbounds):
    yield from _run(ctx, alltoall_call(ctx.comm, src, dst, sbounds, rbounds))


@register("alltoallv", "mpi", native=alltoallv_call)
def alltoallv(ctx, src, dst, sbounds, rbounds):
    yield from _run(ctx, alltoallv_call(ctx.comm, src, dst, sbounds, rbounds))
