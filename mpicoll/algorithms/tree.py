"""Binomial-tree all-reduce: reduce to one rank, then broadcast from it.

Function:     allreduce(st, buf, red)
              reduce(st, buf, red, root)
              bcast(st, buf, root)
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

from . import register
from .common import TAG_ALLREDUCE, TAG_BCAST, TAG_REDUCE, recv, scratch_like, send


@register("allreduce", "tree")
def allreduce(st, buf, red, *, src=None):
    if src is not None:
        buf[...] = src
    binomial_reduce(st, buf, red, 0, TAG_ALLREDUCE)
    binomial_bcast(st, buf, 0, TAG_ALLREDUCE)


@register("reduce", "tree")
def reduce(st, buf, red, root):
    binomial_reduce(st, buf, red, root, TAG_REDUCE)


@register("bcast", "tree")
def bcast(st, buf, root):
    binomial_bcast(st, buf, root, TAG_BCAST)


def binomial_reduce(st, buf, red, root, tag):
    p, comm = st.size, st.comm
    vrank = (st.rank - root) % p
    tmp = None
    mask = 1
    while mask < p:
        if vrank & mask:
            send(comm, buf, (vrank - mask + root) % p, tag)
            return
        if vrank + mask < p:
            if tmp is None:
                tmp = scratch_like(st, "tree", buf.size, buf.dtype)
            recv(comm, tmp, (vrank + mask + root) % p, tag)
            red.combine(buf, buf, tmp)
        mask <<= 1


def binomial_bcast(st, buf, root, tag):
    p, comm = st.size, st.comm
    vrank = (st.rank - root) % p
    mask = 1
    while mask < p:
        if vrank & mask:
            recv(comm, buf, (vrank - mask + root) % p, tag)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if vrank + mask < p:
            send(comm, buf, (vrank + mask + root) % p, tag)
        mask >>= 1
