"""Ring all-reduce: reduce-scatter around a ring, then allgather around it.

Function:     allreduce(ctx, buf, red, src=None, *, segment_bytes=SEGMENT_BYTES)
              reduce_scatter(ctx, buf, red, bounds, *, segment_bytes=...)
              allgather(ctx, buf, bounds)
              reduce(ctx, buf, red, root)   ring reduce-scatter + gather to root
              bcast(ctx, buf, root)         scatter from root + ring allgather
Description:  The vector is cut into p blocks (np.array_split convention),
              one per rank. Each rank sends to its right neighbour and
              receives from its left one.

              Reduce-scatter, p-1 steps: in step s rank r sends block
              (r-s-1) mod p and receives block (r-s-2) mod p, which it
              combines with its own copy; the partial sum of a block travels
              once around the ring and ends, complete, at the rank with the
              block's number.

                  p = 3      step 0             step 1          owns
                  rank 0     send b2, recv b1   send b1, recv b0   b0
                  rank 1     send b0, recv b2   send b2, recv b1   b1
                  rank 2     send b1, recv b0   send b0, recv b2   b2

              Allgather, p-1 steps: rank r passes on the block it last got,
              starting with its own, and receives the next one in place.

              Pipelining: each block is cut into segments of at most
              ``segment_bytes``. Receives go into two alternating scratch
              segments, so the next segment is already arriving while the
              current one is being reduced; each reduced segment is sent on
              for the next step at once rather than after the whole block.
              Sends in flight are bounded: before step s+1 ends, the sends
              of step s-1 have completed (at most two steps' segments
              outstanding, not (p-1) x segments).
Cost:         2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma: bandwidth-
              optimal, but the latency term grows linearly in p. Segmenting
              adds (segments - 1) alpha per step in exchange for overlap.
Limitations:  With fewer elements than ranks some blocks are empty and the
              p-1 latency-bound steps buy nothing: it then runs recursive
              doubling instead (Open MPI does the same). Each block is reduced
              along one chain and then copied, so every rank ends with the
              same bits, but the chain starts at a different rank for each
              block: the order of floating-point additions differs from block
              to block.
"""
from __future__ import annotations

import numpy as np

from . import recursive_doubling
from ..registry import register
from .common import block_bounds, split_range

# Gloo caps ring segments at 1 MiB; measured here, 1 MiB segments cost
# nothing at 64 MiB and let the reduction overlap the transfers.
SEGMENT_BYTES = 1 << 20


@register("allreduce", "ring", knobs=("segment_bytes",), compilable=True)
def allreduce(ctx, buf, red, src=None, *, segment_bytes=SEGMENT_BYTES):
    if buf.size < ctx.size:
        yield from recursive_doubling.allreduce(ctx, buf, red, src)
        return
    bounds = block_bounds(buf.size, ctx.size)
    yield from _reduce_scatter(ctx, buf, red, bounds, segment_bytes, src)
    yield from ring_allgather(ctx, buf, bounds)


@register("reduce_scatter", "ring", knobs=("segment_bytes",))
def reduce_scatter(ctx, buf, red, bounds, *, segment_bytes=SEGMENT_BYTES):
    yield from _reduce_scatter(ctx, buf, red, bounds, segment_bytes, None)


@register("allgather", "ring")
def allgather(ctx, buf, bounds):
    yield from ring_allgather(ctx, buf, bounds)


@register("reduce", "ring", knobs=("segment_bytes",))
def reduce(ctx, buf, red, root, *, segment_bytes=SEGMENT_BYTES):
    """Ring reduce-scatter, then every rank sends its reduced block to root
    (Rabenseifner's reduce): (p-1)/p n bytes through each link instead of the
    binomial tree's n log2(p) at the root."""
    bounds = block_bounds(buf.size, ctx.size)
    yield from _reduce_scatter(ctx, buf, red, bounds, segment_bytes, None)
    ctx.phase = "ring reduce: gather to root"
    if ctx.rank != root:
        a, b = bounds[ctx.rank]
        yield [ctx.send(buf[a:b], root)]
        return
    yield [ctx.recv(buf[a:b], r) for r, (a, b) in enumerate(bounds) if r != root]


@register("bcast", "ring")
def bcast(ctx, buf, root):
    """Scatter from root (rank i gets block i straight from root), then a
    ring allgather: 2 (p-1)/p n bytes per rank in all, against the binomial
    tree's n log2(p); for long messages (van de Geijn's broadcast)."""
    p, r = ctx.size, ctx.rank
    bounds = block_bounds(buf.size, p)
    ctx.phase = "ring bcast: scatter"
    if r == root:
        yield [ctx.send(buf[a:b], i) for i, (a, b) in enumerate(bounds) if i != root]
    else:
        a, b = bounds[r]
        yield [ctx.recv(buf[a:b], root)]
    yield from ring_allgather(ctx, buf, bounds)


def _reduce_scatter(ctx, buf, red, bounds, segment_bytes, src):
    """Ring reduce-scatter into ``buf``. With ``src`` (out of place), this
    rank's own data is read from ``src``: each of its blocks is read exactly
    once (block r-1 is sent, the others are combined), so no copy is needed;
    block r-1 of ``buf`` is left unwritten (the allgather fills it)."""
    own = buf if src is None else src
    if ctx.size == 1:  # one rank: its data is the result (a send to itself would go unreceived)
        if src is not None:
            ctx.copy(buf, src)
        return

    def combine(a, b, partial):
        mine = buf[a:b]
        red.combine(mine, partial, own[a:b])  # partial from the left, then ours
        return mine

    yield from pipelined_reduce_scatter(ctx, bounds, buf.dtype, segment_bytes, lambda a, b: own[a:b], combine)


def pipelined_reduce_scatter(ctx, bounds, wire_dtype, segment_bytes, first, combine):
    """The ring reduce-scatter's message schedule, with the arithmetic left to
    the caller (the plain ring here, the 16-bit ring in ring_compressed.py).

    ``first(a, b)`` returns what this rank sends for elements [a, b) of its
    step-0 block (r-1); ``combine(a, b, partial)`` folds the partial received
    from the left for [a, b) into this rank's data and returns the array to
    pass on in the next step. Messages carry ``wire_dtype`` elements.
    """
    p, r = ctx.size, ctx.rank
    right, left = (r + 1) % p, (r - 1) % p
    itemsize = np.dtype(wire_dtype).itemsize
    longest = max(stop - start for start, stop in bounds)
    seg_elems = max(1, segment_bytes // itemsize)
    nseg = max(1, -(-longest // seg_elems))
    seg_cap = -(-longest // nseg)
    tmp = ctx.scratch(f"ring-{itemsize}", 2 * seg_cap, wire_dtype)
    slots = (tmp[:seg_cap], tmp[seg_cap:])
    segs = [split_range(start, stop, nseg) for start, stop in bounds]

    # Step 0 sends this rank's own data for block r-1, all segments at once.
    older = []
    newer = list(ctx.start(*[ctx.send(first(a, b), right) for a, b in segs[(r - 1) % p]]))
    for step in range(p - 1):
        ctx.phase = ("ring reduce-scatter step", step)
        block = segs[(r - step - 2) % p]
        recvs = [None, None]

        def post(j):
            a, b = block[j]
            recvs[j % 2], = ctx.start(ctx.recv(slots[j % 2][:b - a], left))

        post(0)
        if nseg > 1:
            post(1)
        sends = []
        for j, (a, b) in enumerate(block):
            yield [recvs[j % 2]]
            forward = combine(a, b, slots[j % 2][:b - a])
            if j + 2 < nseg:
                post(j + 2)
            if step < p - 2:  # this segment is what we send in the next step
                sends += ctx.start(ctx.send(forward, right))
        # Bound the sends in flight to two steps' worth: those of the step
        # before last have long been received (their receiver combined them
        # before sending what we just received).
        if older:
            yield older
        older, newer = newer, sends
    # The allgather overwrites blocks that these sends may still be reading.
    if older or newer:
        yield older + newer


def ring_allgather(ctx, buf, bounds):
    """Ring allgather of ``bounds`` blocks in place: in step s rank r passes on
    block r-s and receives block r-s-1 from its left neighbour."""
    p, r = ctx.size, ctx.rank
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        ctx.phase = ("ring allgather step", step)
        sa, sb = bounds[(r - step) % p]
        ra, rb = bounds[(r - step - 1) % p]
        yield [ctx.recv(buf[ra:rb], left), ctx.send(buf[sa:sb], right)]
