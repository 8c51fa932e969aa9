"""Ring schedules of the v- and all-to-all collectives.

Function:     allgatherv(ctx, buf, bounds)
              alltoall(ctx, src, dst, sbounds, rbounds, *, window=WINDOW)
              alltoallv(ctx, src, dst, sbounds, rbounds, *, window=WINDOW)
Description:  allgatherv is the allgather ring of ring.py (the same schedule,
              which never assumed equal blocks): in step s rank r passes
              block r-s to its right neighbour and receives block r-s-1 from
              its left one, p-1 steps.

              All-to-all by shifts: in step k (1..p-1) rank r sends its block
              for r + k and receives the block of r - k, so each step is a
              ring of distance k; unlike pairwise exchange up to ``window``
              steps are in flight at once, overlapping their start-ups.

                  p = 4   step 1     step 2     step 3
                  rank r  ->r+1      ->r+2      ->r+3
                          <-r-1      <-r-2      <-r-3

Cost:         allgatherv: (p-1) alpha + (n - n_r) beta (n: all blocks).
              all-to-all: (p-1) alpha / min(window, p-1) overlapped + n beta
              per rank; each byte crosses one link once.
Limitations:  allgatherv's steps are as slow as the longest block they
              carry; very uneven counts leave links idle. The all-to-all
              window trades contention for latency: on many ranks with long
              blocks, pairwise's one-at-a-time is gentler on the network.
"""
from __future__ import annotations

from ..registry import register
from .pairwise import exchange
from .ring import ring_allgather

# Enough steps in flight to hide start-ups on a handful of ranks, few enough
# that a large communicator does not have every rank sending to every other.
WINDOW = 8


@register("allgatherv", "ring")
def allgatherv(ctx, buf, bounds):
    yield from ring_allgather(ctx, buf, bounds)


def _shifts(r, p):
    return [((r + k) % p, (r - k) % p) for k in range(1, p)]


@register("alltoall", "shift", knobs=("window",))
def alltoall(ctx, src, dst, sbounds, rbounds, *, window=WINDOW):
    yield from exchange(ctx, src, dst, sbounds, rbounds, _shifts(ctx.rank, ctx.size), max(1, int(window)), "shift")


@register("alltoallv", "shift", knobs=("window",))
def alltoallv(ctx, src, dst, sbounds, rbounds, *, window=WINDOW):
    yield from exchange(ctx, src, dst, sbounds, rbounds, _shifts(ctx.rank, ctx.size), max(1, int(window)), "shift")
