"""k-nomial tree all-reduce, reduce and broadcast (radix k; k = 2 is the binomial tree).

Function:     allreduce(ctx, buf, red, src=None, *, radix=RADIX)
              reduce(ctx, buf, red, root, *, radix=RADIX)
              bcast(ctx, buf, root, *, radix=RADIX)
Description:  Ranks are renumbered relative to the root (vrank = (rank -
              root) mod p) and written in base k. Level i (span s = k^i)
              joins groups of k subtrees: vrank v with digit d = (v / s)
              mod k != 0 at level i is the child of v - d s, and a vrank
              whose lowest i digits are zero is the parent of v + j s for
              j = 1 .. k-1 (those < p).

              Reduce, level by level upwards: a rank receives the partial
              results of all its children of the level at once, combines
              them in child order after its own (its partial covers the
              lowest vranks), and at the first level where its digit is
              not zero sends its partial to its parent and is done.
              Broadcast runs the same tree top-down: receive from the
              parent, then send to every child, largest subtree first.
              All-reduce is reduce to rank 0, then broadcast from it.

                  p = 7, k = 4, root 0:  reduce           bcast
                  level 0 (s = 1)        1,2,3 -> 0       0 -> 4
                                         5,6   -> 4       0 -> 1,2,3   4 -> 5,6
                  level 1 (s = 4)        4     -> 0

              With k = 2 it sends exactly the binomial tree's messages
              (tree.py): in round i, vrank v with bit i set sends to v - 2^i.
Cost:         L = ceil(log_k p) levels. Reduce: L (alpha + (k-1) n beta +
              (k-1) n gamma) on the critical path: the root receives
              (k-1) L messages of n bytes (a rank receives at most k-1 per
              level, concurrently) and combines (k-1) n bytes per level;
              every other rank sends exactly once. Broadcast: the root sends
              (k-1) L messages of n bytes, L rounds deep. All-reduce: both,
              2 L rounds. Against the binomial tree (k = 2, log2 p rounds of
              one message): log2(k) times fewer rounds, (k-1)/log2(k) times
              more bytes through the root. It pays when a message's latency
              outweighs k-1 transfers of it and a rank can take in k-1
              messages at once (short messages, many ranks, a network with
              several rails or rendezvous round trips); for long messages
              the ring or Rabenseifner move far fewer bytes.
Limitations:  Moves the whole vector on every edge (latency-optimal only).
              Scratch of (k-1) n bytes on parents (the children's partials
              arrive together). All-reduce computes the result once, at rank
              0, and broadcasts it, so every rank ends with the same bits.
"""
from __future__ import annotations

from ..registry import register

# Radix 4 halves the binomial tree's rounds for 1.5x its bytes at the root:
# the short-message trade this algorithm is for.
RADIX = 4


def _check_radix(radix) -> int:
    if isinstance(radix, bool) or not isinstance(radix, int) or radix < 2:
        raise ValueError(f"mpicoll: knomial radix must be an integer >= 2, got {radix!r}")
    return radix


@register("allreduce", "knomial", knobs=("radix",), compilable=True)
def allreduce(ctx, buf, red, src=None, *, radix=RADIX):
    _check_radix(radix)
    if src is not None:
        ctx.copy(buf, src)
    yield from knomial_reduce(ctx, buf, red, 0, radix)
    yield from knomial_bcast(ctx, buf, 0, radix)


@register("reduce", "knomial", knobs=("radix",))
def reduce(ctx, buf, red, root, *, radix=RADIX):
    yield from knomial_reduce(ctx, buf, red, root, _check_radix(radix))


@register("bcast", "knomial", knobs=("radix",))
def bcast(ctx, buf, root, *, radix=RADIX):
    yield from knomial_bcast(ctx, buf, root, _check_radix(radix))


def _children(v, s, k, p):
    """The vranks v + j s (j = 1 .. k-1) that exist."""
    return [v + j * s for j in range(1, k) if v + j * s < p]


def knomial_reduce(ctx, buf, red, root, k):
    p = ctx.size
    v = (ctx.rank - root) % p
    s = 1
    level = 0
    while s < p:
        ctx.phase = ("knomial reduce level", level)
        digit = (v // s) % k
        if digit:
            yield [ctx.send(buf, (v - digit * s + root) % p)]
            return
        kids = _children(v, s, k, p)
        if kids:
            # All of a level's children at once: they are independent, and
            # their partials arrive while the others are still in flight.
            tmp = ctx.scratch("knomial", len(kids) * buf.size, buf.dtype)
            parts = [tmp[i * buf.size:(i + 1) * buf.size] for i in range(len(kids))]
            yield [ctx.recv(part, (c + root) % p) for part, c in zip(parts, kids)]
            # Ours first, then the children in vrank order: lower vranks first.
            red.combine_many(buf, [buf] + parts)
        s *= k
        level += 1


def knomial_bcast(ctx, buf, root, k):
    p = ctx.size
    v = (ctx.rank - root) % p
    ctx.phase = "knomial bcast"
    s = 1
    while s < p:  # the parent is at the lowest level where v's digit is not zero
        digit = (v // s) % k
        if digit:
            yield [ctx.recv(buf, (v - digit * s + root) % p)]
            break
        s *= k
    # Children at every level below that one (below all of them for the
    # root), the largest subtrees (highest level) first so that they start
    # forwarding soonest; they only read buf, so all are posted at once.
    sends = []
    s //= k
    while s >= 1:
        sends += [ctx.send(buf, (c + root) % p) for c in _children(v, s, k, p)]
        s //= k
    if sends:
        yield sends
