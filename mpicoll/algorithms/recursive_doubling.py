"""Recursive-doubling all-reduce.

Function:     allreduce(ctx, buf, red, src=None)
Description:  After the fold to a power of two (common.Fold), log2(pof2)
              rounds: in round k each rank swaps its whole vector with the
              rank whose new rank differs in bit k and combines the two.
              After the last round every survivor holds the full reduction;
              the folded-out ranks get it back from their partner.

                  round 0: 0<->1  2<->3     (pairs)
                  round 1: 0<->2  1<->3     (pairs of pairs)

Cost:         ceil(log2 p) alpha + ceil(log2 p) n beta + ceil(log2 p) n gamma,
              plus the fold's 2 alpha + 2 n beta + n gamma when p is not a
              power of two (Thakur, Rabenseifner & Gropp 2005).
Limitations:  Moves the whole vector every round, so it is for short
              messages, where the log2(p) latency term dominates.
              Both partners of a round compute op(lower group, higher group)
              on the same two operands, so every rank ends with the same bits.
"""
from __future__ import annotations

from ..registry import register
from .common import Fold


@register("allreduce", "recursive_doubling", compilable=True)
def allreduce(ctx, buf, red, src=None):
    if src is not None:
        ctx.copy(buf, src)
    fold = Fold.of(ctx.rank, ctx.size)
    yield from fold.fold_in(ctx, buf, red)
    if fold.newrank >= 0:
        tmp = ctx.scratch("rd", buf.size, buf.dtype)
        mask = 1
        while mask < fold.pof2:
            ctx.phase = ("recursive doubling round", mask.bit_length() - 1)
            partner = fold.newrank ^ mask
            peer = fold.real(partner)
            yield [ctx.recv(tmp, peer), ctx.send(buf, peer)]
            if partner < fold.newrank:
                red.combine(buf, tmp, buf)
            else:
                red.combine(buf, buf, tmp)
            mask <<= 1
    yield from fold.fold_out(ctx, buf)
