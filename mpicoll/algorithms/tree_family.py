"""Binomial-tree scatter and gather.

Function:     scatter(ctx, buf, bounds, root)
              gather(ctx, buf, bounds, root)
Description:  Ranks are renumbered relative to the root (vrank = (rank -
              root) mod p). Vrank v owns the subtree [v, v + lowbit(v)) (the
              root: all of them), whose blocks are contiguous in vrank order.
              Scatter: each rank receives its subtree's blocks from its
              parent v - lowbit(v), then hands each child v + 2^k (largest
              first) the child's subtree; gather runs the same tree bottom
              up, each rank sending its whole subtree to its parent once all
              its children's have arrived.

                  p = 6, root 0     scatter (blocks sent)
                  round 0           0->4: b4 b5
                  round 1           0->2: b2 b3    4->5: b5
                  round 2           0->1: b1       2->3: b3

              When root != 0 the root copies its buffer into vrank order (and
              back, for gather) so that every subtree is one message.
Cost:         ceil(log2 p) alpha + (p-1)/p n beta at the root (n/2, n/4, ...
              per round), each byte crossing up to log2(p) links; interior
              ranks hold their subtree in scratch.
Limitations:  Interior ranks forward data that is not theirs (a copy through
              scratch, and bytes on more links than the linear algorithm's);
              for long blocks the linear algorithm moves less. Every rank
              needs every rank's count (mpicoll's scatter/gather take counts
              on every rank; MPI_Scatterv only gives them to the root).
"""
from __future__ import annotations

import numpy as np

from ..registry import register


def _tree(p, root, bounds):
    """(vrank block offsets in vrank order, lengths by vrank)."""
    lens = [bounds[(u + root) % p][1] - bounds[(u + root) % p][0] for u in range(p)]
    off = [0] * (p + 1)
    for u in range(p):
        off[u + 1] = off[u] + lens[u]
    return off, lens


def _top(v, p):
    """The subtree span of vrank v: lowbit(v), or the power of two >= p for the root."""
    return v & -v if v else 1 << max(p - 1, 0).bit_length()


def _rotate(buf, bounds, root, p, off, work, into_work):
    for u in range(p):
        a, b = bounds[(u + root) % p]
        if into_work:
            work[off[u]:off[u + 1]] = buf[a:b]
        else:
            buf[a:b] = work[off[u]:off[u + 1]]


def _place(ctx, root, bounds):
    """Where this rank sits in the binomial tree rooted at ``root``: (p, rank,
    vrank, subtree byte offsets, block lengths, span, end of its subtree, the
    offset its working buffer starts at)."""
    p, r = ctx.size, ctx.rank
    v = (r - root) % p
    off, lens = _tree(p, root, bounds)
    span = _top(v, p)
    return p, r, v, off, lens, span, min(v + span, p), off[v]


@register("scatter", "tree")
def scatter(ctx, buf, bounds, root):
    p, r, v, off, lens, span, end, base = _place(ctx, root, bounds)
    ctx.phase = "binomial scatter: from parent"
    if v == 0:
        if root == 0:
            work = buf
        else:
            work = ctx.scratch("binomial", off[p], np.uint8)
            _rotate(buf, bounds, root, p, off, work, True)
    elif end == v + 1:  # a leaf: only its own block
        yield [ctx.recv(buf, ((v - span) + root) % p)]
        return
    else:
        work = ctx.scratch("binomial", off[end] - base, np.uint8)
        yield [ctx.recv(work, ((v - span) + root) % p)]
    ctx.phase = "binomial scatter: to children"
    sends = [ctx.send(work[lo:hi], peer) for peer, lo, hi in _children(v, span, p, root, off, base)]
    if sends:
        yield sends
    if v:
        buf[...] = work[:lens[v]]


def _children(v, span, p, root, off, base):
    """(rank, start, stop) of each child subtree of vrank ``v``, largest first,
    as byte offsets into ``v``'s working buffer (which starts at ``base``)."""
    mask = span >> 1
    while mask:
        c = v + mask
        if c < p:
            yield (c + root) % p, off[c] - base, off[min(c + mask, p)] - base
        mask >>= 1


@register("gather", "tree")
def gather(ctx, buf, bounds, root):
    p, r, v, off, lens, span, end, base = _place(ctx, root, bounds)
    parent = ((v - span) + root) % p
    if v and end == v + 1:
        ctx.phase = "binomial gather: to parent"
        yield [ctx.send(buf, parent)]
        return
    if v == 0 and root == 0:
        work = buf
    else:
        work = ctx.scratch("binomial", off[end] - base, np.uint8)
        work[:lens[v]] = buf[bounds[r][0]:bounds[r][1]] if v == 0 else buf
    ctx.phase = "binomial gather: from children"
    recvs = [ctx.recv(work[lo:hi], peer) for peer, lo, hi in _children(v, span, p, root, off, base)]
    if recvs:
        yield recvs
    if v:
        ctx.phase = "binomial gather: to parent"
        yield [ctx.send(work, parent)]
    elif root != 0:
        _rotate(buf, bounds, root, p, off, work, False)
