"""Bruck's all-to-all for short, equal blocks.

Function:     alltoall(ctx, src, dst, sbounds, rbounds)
Description:  Three phases (Bruck et al. 1997, MPICH's short-message
              MPI_Alltoall). 1: rotate, so that slot i holds the block for
              rank r + i. 2: for each bit k of the slot number (k = 1, 2, 4,
              ... < p), pack every slot with bit k set, send the pack to rank
              r + k and receive the matching pack from r - k into the same
              slots. After the last round slot i holds the block rank r - i
              sent to r. 3: unrotate into ``dst``.

                  p = 4, round k   slots sent      to / from
                  k = 1            1, 3            r+1 / r-1
                  k = 2            2, 3            r+2 / r-2

Cost:         ceil(log2 p) alpha + ceil(log2 p) n/2 beta + copies of n
              bytes per round (pack/unpack) and two for the rotations, n =
              this rank's bytes: log-many start-ups for log(p)/2 times the
              pairwise volume.
Limitations:  Equal blocks only (MPI_Alltoall; alltoallv has no Bruck
              here). Each byte is sent up to log2(p) times and copied around
              each round, so it loses to pairwise exchange for long blocks.
"""
from __future__ import annotations

import numpy as np

from ..registry import register


@register("alltoall", "bruck")
def alltoall(ctx, src, dst, sbounds, rbounds):
    p, r = ctx.size, ctx.rank
    bs = sbounds[0][1] - sbounds[0][0]
    if bs == 0 or p == 1:
        dst[...] = src
        return
    tmp = ctx.scratch("bruck", p * bs, np.uint8).reshape(p, bs)
    slots = np.arange(p)
    tmp[...] = src.reshape(p, bs)[(slots + r) % p]
    k = 1
    while k < p:
        ctx.phase = f"bruck round {k.bit_length() - 1}"
        idx = slots[(slots & k) != 0]
        out = ctx.scratch("bruck-s", idx.size * bs, np.uint8).reshape(idx.size, bs)
        inc = ctx.scratch("bruck-r", idx.size * bs, np.uint8).reshape(idx.size, bs)
        np.take(tmp, idx, axis=0, out=out)
        yield [ctx.recv(inc.reshape(-1), (r - k) % p), ctx.send(out.reshape(-1), (r + k) % p)]
        tmp[idx] = inc
        k <<= 1
    dst.reshape(p, bs)[(r - slots) % p] = tmp
