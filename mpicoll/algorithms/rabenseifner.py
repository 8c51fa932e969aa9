"""Rabenseifner's all-reduce: recursive-halving reduce-scatter, then
recursive-doubling allgather.

Function:     allreduce(ctx, buf, red, src=None)
Description:  After the fold to a power of two (common.Fold), the vector is
              cut into pof2 blocks. Reduce-scatter by recursive halving: in
              each round a rank keeps half of the block range it is
              responsible for, sends the other half to its partner (new rank
              differing in the current top bit), and combines the partner's
              copy of the half it kept. After log2(pof2) rounds new rank i
              owns block i fully reduced. The allgather replays the rounds in
              reverse, doubling the owned range each time.

                  pof2 = 4, blocks b0..b3          owns after halving
                  round 0 (bit 2): 0<->2, 1<->3    0,1: b0-b1   2,3: b2-b3
                  round 1 (bit 1): 0<->1, 2<->3    0:b0 1:b1 2:b2 3:b3

Cost:         2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma for a
              power of two; the fold adds 2 alpha + 2 n beta + n gamma
              otherwise (Thakur, Rabenseifner & Gropp 2005).
Limitations:  With fewer elements than pof2 the blocks would be empty; it
              then runs recursive doubling instead (as MPICH does). Each
              block is combined by one rank in a fixed tree order, then
              copied, so every rank ends with the same bits.
"""
from __future__ import annotations

from . import recursive_doubling
from ..registry import register
from .common import Fold, block_bounds


@register("allreduce", "rabenseifner", compilable=True)
def allreduce(ctx, buf, red, src=None):
    n = buf.size
    fold = Fold.of(ctx.rank, ctx.size)
    if n < fold.pof2:
        yield from recursive_doubling.allreduce(ctx, buf, red, src)
        return
    if src is not None:
        ctx.copy(buf, src)
    yield from fold.fold_in(ctx, buf, red)
    if fold.newrank >= 0:
        yield from _halving_doubling(ctx, buf, red, fold)
    yield from fold.fold_out(ctx, buf)


def _halving_doubling(ctx, buf, red, fold):
    me = fold.newrank
    bounds = block_bounds(buf.size, fold.pof2)
    tmp = ctx.scratch("rab", bounds[0][1] * (fold.pof2 // 2) + 1, buf.dtype)

    def span(lo, hi):  # element range of blocks [lo, hi)
        return bounds[lo][0], bounds[hi - 1][1]

    # Reduce-scatter by recursive halving; remember each round for the replay.
    lo, hi = 0, fold.pof2
    rounds = []
    mask = fold.pof2 >> 1
    while mask:
        ctx.phase = ("rabenseifner halving, distance", mask)
        partner = me ^ mask
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if me < partner else ((mid, hi), (lo, mid))
        ks, ke = span(*keep)
        gs, ge = span(*give)
        mine = buf[ks:ke]
        theirs = tmp[:ke - ks]
        peer = fold.real(partner)
        yield [ctx.recv(theirs, peer), ctx.send(buf[gs:ge], peer)]
        if partner < me:
            red.combine(mine, theirs, mine)
        else:
            red.combine(mine, mine, theirs)
        rounds.append((peer, keep, give))
        lo, hi = keep
        mask >>= 1

    # Allgather by recursive doubling: undo the rounds in reverse order.
    for peer, keep, give in reversed(rounds):
        ctx.phase = "rabenseifner doubling"
        ks, ke = span(*keep)
        gs, ge = span(*give)
        yield [ctx.recv(buf[gs:ge], peer), ctx.send(buf[ks:ke], peer)]
