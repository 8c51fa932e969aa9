"""Reproducible all-reduce: the bits of the serial rank-ordered reduction.

Function:     allreduce(ctx, buf, red, src=None)   (a schedule; prepare(st, buf) at call time)
              (reached through ``mpicoll.allreduce(..., reproducible=True)``,
              not registered as an algorithm: it replaces whichever one was
              asked for)
Description:  Every element of the result is computed as
              ((x0 op x1) op x2) ... op x(p-1), in exactly that order, by one
              rank, and copied to the others, so floating-point results do
              not depend on the process count's factorisation, the node
              layout or the algorithm:

              * all ranks on one node: the ``shm`` pipeline, which already
                reduces each slice over the node's ranks in rank order with
                the k-input kernel (no extra cost over ``shm``);
              * otherwise: rank r gathers block r of every rank's vector
                (MPI_Alltoallv, data movement only), reduces the p pieces in
                rank order in one pass (``combine_many``), and the blocks are
                allgathered (MPI_Allgatherv in place).
Cost:         Multi-node path: (p-1)/p n bytes sent and received by each rank
              in the all-to-all and again in the allgather (the same volume as
              a ring or Rabenseifner all-reduce), p messages per rank in each
              (so alpha grows like p, not log p), n bytes of scratch per rank,
              and no overlap of communication and reduction. Across nodes it
              sends the full (p-1)/p n over the network instead of the
              hierarchical algorithm's (N-1)/N n/k: the price of a fixed
              order, since node-partial sums would change the order.
Limitations:  Integers are exact under any order anyway; this matters for
              floats (sum/prod/avg; min/max are order-independent except for
              the sign of zero and NaN payloads, which the rank order also
              fixes).
"""
from __future__ import annotations

from mpi4py import MPI

from ..node import node_info
from . import shm
from .common import block_bounds

BYTE = MPI.BYTE


def prepare(st, buf) -> None:
    if node_info(st).nodes == 1:
        shm.prepare(st, buf)


def allreduce(ctx, buf, red, src=None):
    st = ctx.st
    info = node_info(st)
    if info.nodes == 1:
        # The node communicator is ordered by rank in st.comm: shm's slice
        # reduction W[0] op W[1] ... is the serial order.
        yield from shm.pipeline(ctx, info, buf, red, src, shm.CHUNK_BYTES)
        return
    p, r, isz = ctx.size, ctx.rank, buf.itemsize
    comm = ctx.comm
    own = buf if src is None else src
    bounds = block_bounds(buf.size, p)
    a, b = bounds[r]
    mine = b - a
    recv = ctx.scratch("reproducible", p * mine, buf.dtype)
    send_counts = [(hi - lo) * isz for lo, hi in bounds]
    send_displs = [lo * isz for lo, _ in bounds]
    sb = [own, (send_counts, send_displs), BYTE]
    rb = [recv, ([mine * isz] * p, [q * mine * isz for q in range(p)]), BYTE]
    ctx.phase = "reproducible: all-to-all of the blocks"
    yield [ctx.native(lambda: comm.Alltoallv(sb, rb), lambda: comm.Ialltoallv(sb, rb))]
    if mine:
        red.combine_many(buf[a:b], [recv[q * mine:(q + 1) * mine] for q in range(p)])
    gb = [buf, (send_counts, send_displs), BYTE]
    ctx.phase = "reproducible: allgather of the reduced blocks"
    yield [ctx.native(lambda: comm.Allgatherv(MPI.IN_PLACE, gb), lambda: comm.Iallgatherv(MPI.IN_PLACE, gb))]
