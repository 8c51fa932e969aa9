"""Linear scatter and gather: the root talks to every other rank directly.

Function:     scatter(ctx, buf, bounds, root)
              gather(ctx, buf, bounds, root)
Description:  Scatter: the root posts one send per non-root rank at once,
              block i (``buf[bounds[i]]``) to rank i; every other rank posts
              one receive of its own block. Gather is the same with the
              direction reversed. The root's own block is not moved (the
              plan layer places it).

                  p = 4, root 0   scatter            gather
                  rank 0          send b1, b2, b3    recv b1, b2, b3
                  rank 1..3       recv b(rank)       send b(rank)

Cost:         (p-1) alpha + (p-1)/p n beta at the root, alpha + n/p beta
              elsewhere: every byte crosses one link once, but the root's
              p-1 start-ups are serialised on it.
Limitations:  The root's link carries everything and its start-up cost grows
              linearly with p: on large communicators and short blocks the
              binomial tree's log2(p) rounds win. With all p-1 messages
              posted at once a gather root can be flooded (incast); MPI
              libraries throttle this, mpicoll does not.
"""
from __future__ import annotations

from ..registry import register


@register("scatter", "linear")
def scatter(ctx, buf, bounds, root):
    ctx.phase = "linear scatter"
    if ctx.rank == root:
        sends = [ctx.send(buf[a:b], i) for i, (a, b) in enumerate(bounds) if i != root]
        if sends:
            yield sends
    else:
        yield [ctx.recv(buf, root)]


@register("gather", "linear")
def gather(ctx, buf, bounds, root):
    ctx.phase = "linear gather"
    if ctx.rank == root:
        recvs = [ctx.recv(buf[a:b], i) for i, (a, b) in enumerate(bounds) if i != root]
        if recvs:
            yield recvs
    else:
        yield [ctx.send(buf, root)]
