"""Binomial-tree all-reduce: reduce to one rank, then broadcast from it.

Function:     allreduce(ctx, buf, red, src=None)
              reduce(ctx, buf, red, root)
              bcast(ctx, buf, root)
Description:  Ranks are renumbered relative to the root (vrank = (rank -
              root) mod p). Reduce: in round k, every vrank with bit k set
              sends its partial result to vrank - 2^k and drops out; the
              receiver combines it after its own (its partial covers the
              lower vranks). Broadcast runs the same tree top-down.

                  p = 6, root 0:   reduce        bcast
                  round 0          1->0 3->2 5->4   0->4
                  round 1          2->0             0->2 4->5
                  round 2          4->0             0->1 2->3

Cost:         allreduce: 2 ceil(log2 p) (alpha + n beta) + ceil(log2 p) n gamma;
              reduce and bcast each half of that.
Limitations:  Moves the whole vector at every level, so it only suits short
              messages (latency-optimal, bandwidth-poor). The root's result is
              copied to everyone, so every rank ends with the same bits.
"""
from __future__ import annotations

from ..registry import register


@register("allreduce", "tree", compilable=True)
def allreduce(ctx, buf, red, src=None):
    if src is not None:
        ctx.copy(buf, src)
    yield from binomial_reduce(ctx, buf, red, 0)
    yield from binomial_bcast(ctx, buf, 0)


@register("reduce", "tree")
def reduce(ctx, buf, red, root):
    yield from binomial_reduce(ctx, buf, red, root)


@register("bcast", "tree")
def bcast(ctx, buf, root):
    yield from binomial_bcast(ctx, buf, root)


def binomial_reduce(ctx, buf, red, root):
    p = ctx.size
    vrank = (ctx.rank - root) % p
    tmp = None
    mask = 1
    while mask < p:
        ctx.phase = ("tree reduce round", mask.bit_length() - 1)
        if vrank & mask:
            yield [ctx.send(buf, (vrank - mask + root) % p)]
            return
        if vrank + mask < p:
            if tmp is None:
                tmp = ctx.scratch("tree", buf.size, buf.dtype)
            yield [ctx.recv(tmp, (vrank + mask + root) % p)]
            red.combine(buf, buf, tmp)
        mask <<= 1


def binomial_bcast(ctx, buf, root):
    p = ctx.size
    vrank = (ctx.rank - root) % p
    mask = 1
    ctx.phase = "tree bcast"
    while mask < p:
        if vrank & mask:
            yield [ctx.recv(buf, (vrank - mask + root) % p)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask:
        if vrank + mask < p:
            sends.append(ctx.send(buf, (vrank + mask + root) % p))
        mask >>= 1
    if sends:  # all children at once: they only read buf
        yield sends
