"""Pairwise-exchange all-to-all: one partner at a time.

Function:     alltoall(ctx, src, dst, sbounds, rbounds)
              alltoallv(ctx, src, dst, sbounds, rbounds)
Description:  p-1 steps after the local copy of the rank's own block. In
              step k (1..p-1) rank r sends block ``src[sbounds[to]]`` to
              ``to`` and receives ``dst[rbounds[frm]]`` from ``frm``, and the
              step completes before the next starts. On a power-of-two p the
              partners are ``to = frm = r XOR k`` (a true pairwise swap, as in
              MPICH); otherwise ``to = r + k``, ``frm = r - k`` (mod p).

                  p = 4   step 1      step 2      step 3
                  rank 0  <-> 1       <-> 2       <-> 3
                  rank 1  <-> 0       <-> 3       <-> 2
                  rank 2  <-> 3       <-> 0       <-> 1

Cost:         (p-1) (alpha + n/p beta) per rank, n = this rank's bytes:
              every byte crosses one link once (bandwidth-optimal).
Limitations:  p-1 serialised latencies: for short blocks Bruck's log2(p)
              rounds win. One message in each direction at a time keeps
              memory and network contention bounded, which is what long
              messages want.
"""
from __future__ import annotations

from ..registry import register


def exchange(ctx, src, dst, sbounds, rbounds, peers, window, label):
    """The shared all-to-all schedule: own block copied, then one send and
    one receive per (to, frm) in ``peers``, at most ``window`` steps in flight."""
    r = ctx.rank
    a, b = sbounds[r]
    c, d = rbounds[r]
    dst[c:d] = src[a:b]
    pending = []
    for k, (to, frm) in enumerate(peers):
        ctx.phase = f"{label} step {k + 1}"
        ra, rb = rbounds[frm]
        sa, sb = sbounds[to]
        pending.append(list(ctx.start(ctx.recv(dst[ra:rb], frm), ctx.send(src[sa:sb], to))))
        if len(pending) >= window:
            yield pending.pop(0)
    while pending:
        yield pending.pop(0)


def pairwise_peers(r, p):
    if p & (p - 1) == 0:
        return [(r ^ k, r ^ k) for k in range(1, p)]
    return [((r + k) % p, (r - k) % p) for k in range(1, p)]


@register("alltoall", "pairwise")
def alltoall(ctx, src, dst, sbounds, rbounds):
    yield from exchange(ctx, src, dst, sbounds, rbounds, pairwise_peers(ctx.rank, ctx.size), 1, "pairwise")


@register("alltoallv", "pairwise")
def alltoallv(ctx, src, dst, sbounds, rbounds):
    yield from exchange(ctx, src, dst, sbounds, rbounds, pairwise_peers(ctx.rank, ctx.size), 1, "pairwise")
