"""Two-level all-reduce: shared memory inside each node, the network between nodes.

Function:     allreduce(ctx, buf, red, src=None, *, chunk_bytes=shm.CHUNK_BYTES, sync=None, cross=None)
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

              The inter-node all-reduce is ``cross`` (an all-reduce
              algorithm's name), run in place on the window. Left None,
              ``prepare`` decides it at call time, once per call: auto's
              choice for the cross communicator and one chunk's slice
              (``select.allreduce`` with one rank on each of the cross
              communicator's nodes and its tuning profile; never a node-level
              algorithm: for MPI dtypes on equal nodes Rabenseifner or the
              ring from 128 KiB slices (all local ranks cross at once),
              MPI_Allreduce below (select._across_nodes);
              ring/Rabenseifner/recursive doubling for float16/bfloat16).
              ``explain()`` shows it.
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
from ..registry import get as _get, register
from .. import select
from ..mpitypes import reduces_natively
from ..node import node_info
from .common import block_bounds


_check_cross = shm.check_cross


def slice_bytes(info, n: int, itemsize: int, chunk_bytes: int) -> int:
    """The bytes one rank all-reduces across nodes per chunk: its slice of
    a full chunk (equal nodes), or the whole chunk (uneven nodes: the
    leaders carry it). The last chunk may be shorter."""
    if n == 0:
        return 0
    m = min(shm._cap(n, itemsize, chunk_bytes), n)
    if not info.uniform:
        return m * itemsize
    a, b = block_bounds(m, info.local_size)[0]  # shm's split: the first slice is the largest
    return (b - a) * itemsize


def cross_choice(st, n: int, itemsize: int, dtype, op, chunk_bytes: int = shm.CHUNK_BYTES):
    """auto's choice (a select.Choice) for the cross communicator of an
    all-reduce of ``n`` elements (mpicoll DType and Op), as for any other communicator: its tuning
    profile's rules, its model, the defaults (select.py). The same on every
    rank of a cross communicator (same slice, profile and size).
    Collective on the first call (the node and cross communicators)."""
    info = node_info(st)
    cst = info.cross_state()
    # The cross communicator holds one rank of each node (by its split), so
    # it is asked as one rank on each of cst.size nodes: select's rules for
    # one node (the ring from 512 KiB blocks, shm's measured thresholds)
    # describe shared memory, not these links. On equal nodes every local
    # rank's cross all-reduce runs at once through the node's link.
    return select.allreduce(cst.size, slice_bytes(info, n, itemsize, chunk_bytes), op.name, dtype.name,
                            native_dtype=reduces_natively(dtype, op), profile=cst.profile,
                            available=shm.cross_available, ranks_per_node=1, nodes=cst.size,
                            concurrent=info.local_size if info.uniform else 1)


def _cross_allreduce(ctx, info, view, red, cross):
    """All-reduce ``view`` in place among the ranks of this rank's cross communicator."""
    cst = info.cross_state()
    if cst.size == 1 or view.size == 0:
        return
    sub = ctx.sub(cst)
    yield from _get("allreduce", cross).schedule(sub, view, red, None)


def prepare(st, buf, red=None, *, chunk_bytes=shm.CHUNK_BYTES, sync=None, cross=None, **_):
    """Call-time set-up (collective): node and (across nodes) cross
    communicators, the window; and the cross algorithm when the call did
    not give one (returned as the knob ``cross``)."""
    _check_cross(cross)
    info = node_info(st)
    decided = None
    if info.nodes > 1:  # on one node hierarchical is shm: no cross communicator
        info.cross_state()
        if cross is None and red is not None and buf is not None:
            decided = {"cross": cross_choice(st, buf.size, buf.itemsize, red.dtype, red.op, chunk_bytes).name}
    shm.prepare(st, buf, chunk_bytes=chunk_bytes, sync=sync)
    return decided


# program: on one node this schedule is shm's pipeline, on the same window,
# so shm's program for one chunk serves it too (shm.program is None on
# several nodes, where the schedule runs).
@register("allreduce", "hierarchical", knobs=("chunk_bytes", "sync", "cross"), prepare=prepare,
          check_values=shm.check_knob_values, program=shm.program)
def allreduce(ctx, buf, red, src=None, *, chunk_bytes=shm.CHUNK_BYTES, sync=None, cross=None):
    info = node_info(ctx.st)
    if info.nodes == 1:
        yield from shm.pipeline(ctx, info, buf, red, src, chunk_bytes, sync=sync)
        return
    _check_cross(cross)
    if cross is None:
        # The decision belongs to prepare (the plan layer's, or a driver's
        # own: simulate decides it as prepare does); a schedule never
        # selects (docs/architecture.md, layers).
        raise ValueError("mpicoll: hierarchical across nodes runs with its cross algorithm decided by its "
                         "prepare (knob cross); it was not given")

    me = info.local_rank
    if info.uniform:
        def between(w, peers, bounds):
            a, b = bounds[me]
            yield from _cross_allreduce(ctx, info, peers[me][a:b], red, cross)
    else:
        def between(w, peers, bounds):
            yield [w.sync_op(ctx)]  # the whole chunk is reduced on this node
            if me == 0:
                # Other nodes cut the chunk into other slices: gather this
                # node's slices into one piece, all-reduce it, put it back.
                m = bounds[-1][1]
                tmp = ctx.scratch("hierarchical", m, buf.dtype)
                for q, (qa, qb) in enumerate(bounds):
                    ctx.copy(tmp[qa:qb], peers[q][qa:qb])
                yield from _cross_allreduce(ctx, info, tmp, red, cross)
                for q, (qa, qb) in enumerate(bounds):
                    ctx.copy(peers[q][qa:qb], tmp[qa:qb])

    yield from shm.pipeline(ctx, info, buf, red, src, chunk_bytes, between, sync=sync)
