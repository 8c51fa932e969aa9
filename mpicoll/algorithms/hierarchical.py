"""Two-level all-reduce: shared memory inside each node, the network between nodes.

Function:     allreduce(ctx, buf, red, src=None, *, chunk_bytes=shm.CHUNK_BYTES, sync=None)
Description:  Runs the ``shm`` pipeline (see shm.py) chunk by chunk; between
              its intra-node reduce-scatter and its intra-node allgather,
              the node-partial results are all-reduced across nodes:

              Equal rank counts on every node (k ranks each): local rank j
              of each node owns slice j of the chunk and all-reduces it with
              local rank j of every other node, on the "cross" communicator
              of local index j (node_info). All k ranks of a node use the
              network at once, each for 1/k of the data.

                  2 nodes x 2 ranks, one chunk = slices s0 s1
                  node A: a0 reduces s0 of {a0,a1}   a1 reduces s1 of {a0,a1}
                  node B: b0 reduces s0 of {b0,b1}   b1 reduces s1 of {b0,b1}
                  cross:  a0 <-> b0 all-reduce s0    a1 <-> b1 all-reduce s1
                  then every rank copies s0 s1 from its node's window

              Different rank counts per node (the slower path): after the
              node's reduce-scatter a sync, then local rank 0 of each node
              gathers the node's reduced slices into one scratch piece,
              all-reduces the whole chunk with the other nodes' local rank 0
              while the node's other ranks wait, and puts the slices back.

              The inter-node all-reduce is auto's choice for the cross
              communicator (``select.allreduce`` with one rank per node and
              that communicator's tuning profile; never a node-level
              algorithm: native MPI_Allreduce for MPI dtypes by default,
              ring/Rabenseifner/recursive doubling for float16/bfloat16),
              run in place on the window.
Cost:         Intra-node as in shm.py (no network). Across nodes, per rank
              and N nodes, the cross all-reduce of n/k bytes: with a ring,
              2 (N-1)/N * n/k bytes sent by each rank, versus 2 (p-1)/p * n
              for a flat ring's ranks on a host boundary. Uneven nodes: only
              the leaders send, 2 (N-1)/N * n each.
Limitations:  The order of the floating-point operations is node-partial
              sums first (rank order inside a node), then whatever the
              cross algorithm does: bit-identical on every rank (each
              element is computed once per node from the same operands by
              an algorithm that gives identical bits on every rank), but not
              equal to the serial rank-ordered sum; use
              ``allreduce(..., reproducible=True)`` for that. On one node it
              is exactly ``shm``.
"""
from __future__ import annotations

from . import shm
from ..registry import get as _get, has, register
from .. import select
from ..mpitypes import reduces_natively
from ..node import node_info


# Algorithms the cross communicator (one rank per node) may run: not the
# node-level ones, which would recurse into this one.
_NODE_LEVEL = ("shm", "hierarchical", "cascade")


def _cross_choice(cst, view, red):
    # auto's choice for the cross communicator as for any other: its tuning
    # profile's rules, its model, the defaults (select.py).
    return select.allreduce(cst.size, view.nbytes, red.op.name, red.dtype.name,
                            native_dtype=reduces_natively(red.dtype, red.op), profile=cst.profile,
                            available=lambda a: a not in _NODE_LEVEL and has("allreduce", a)).name


def _cross_allreduce(ctx, info, view, red):
    """All-reduce ``view`` in place among the ranks of this rank's cross communicator."""
    cst = info.cross_state()
    if cst.size == 1 or view.size == 0:
        return
    sub = ctx.sub(cst)
    yield from _get("allreduce", _cross_choice(cst, view, red)).schedule(sub, view, red, None)


def prepare(st, buf, **knobs) -> None:
    """Call-time set-up (collective): node and (across nodes) cross
    communicators, the window."""
    info = node_info(st)
    if info.nodes > 1:  # on one node hierarchical is shm: no cross communicator
        info.cross_state()
    shm.prepare(st, buf, **knobs)


@register("allreduce", "hierarchical", knobs=("chunk_bytes", "sync"), prepare=prepare)
def allreduce(ctx, buf, red, src=None, *, chunk_bytes=shm.CHUNK_BYTES, sync=None):
    info = node_info(ctx.st)
    if info.nodes == 1:
        yield from shm.pipeline(ctx, info, buf, red, src, chunk_bytes, sync=sync)
        return

    me = info.local_rank
    if info.uniform:
        def between(w, peers, bounds):
            a, b = bounds[me]
            yield from _cross_allreduce(ctx, info, peers[me][a:b], red)
    else:
        def between(w, peers, bounds):
            yield [w.sync_op(ctx)]  # the whole chunk is reduced on this node
            if me == 0:
                # Other nodes cut the chunk into other slices: gather this
                # node's slices into one piece, all-reduce it, put it back.
                m = bounds[-1][1]
                tmp = ctx.scratch("hierarchical", m, buf.dtype)
                for q, (qa, qb) in enumerate(bounds):
                    tmp[qa:qb] = peers[q][qa:qb]
                yield from _cross_allreduce(ctx, info, tmp, red)
                for q, (qa, qb) in enumerate(bounds):
                    peers[q][qa:qb] = tmp[qa:qb]

    yield from shm.pipeline(ctx, info, buf, red, src, chunk_bytes, between, sync=sync)
