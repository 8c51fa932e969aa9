"""Ring all-reduce of float32 data with 16-bit (float16/bfloat16) partial sums on the wire.

Function:     allreduce(ctx, src, wire, fmt, divisor, *, segment_bytes=SEGMENT_BYTES)   (a schedule)
              src: this rank's contribution, float32, 1-D, read only;
              wire: uint16, same length; on return it holds the 16-bit sum
              (``fmt`` bits), identical on every rank.
Description:  The ring of ring.py (reduce-scatter, then allgather, p-1 steps
              each, blocks cut into segments with two receive slots in
              flight), with the partial sums carried as 16 bits:

                  step 0      send round16(src[b] / divisor) for block b = r-1
                  step s      receive the 16-bit partial of block b = r-s-2,
                              wire[b] = round16(src[b] / divisor + widen(partial))
                              (float32 add, one rounding) and send it on
                  last step   block r is complete in wire[r], rounded once
                  allgather   the complete 16-bit blocks travel round the ring

              Each addition is done in float32 by the C kernel
              ``mpicoll_accumulate_round_{f16,bf16}`` (compress.c), which
              reads the received 16-bit partial, adds this rank's float32
              values and rounds the sum once for sending. A block's final
              16-bit bits are made by one rank and copied to the others, so
              every rank ends with identical bits.
Cost:         2 (p-1) alpha + 2 (p-1)/p n (2 bytes) beta: half the bytes of
              the float32 ring, plus one widen/add/round pass per step.
Error:        a block's partial sum is rounded to 16 bits once per hop, so
              the result carries up to p-1 roundings of the running sum
              (relative error about (p-1) 2^-11 for float16, (p-1) 2^-8 for
              bfloat16, of the largest partial sum's magnitude); float16
              overflows above 65504: pass divisor = p (pre-division) when
              the sum may exceed it.
Registry:     none: its arguments are not the shared all-reduce signature
              (typed input, separate wire buffer); mpicoll/compression.py calls it.
Limitations:  sum (and avg through the caller) of float32 only; the caller
              converts float64. With fewer elements than ranks some blocks
              are empty and the empty messages cost latency for nothing
              (correct, just not worth compressing).
"""
from __future__ import annotations

from .common import block_bounds
from .ring import pipelined_reduce_scatter, ring_allgather

# As ring.py: 1 MiB segments (of 16-bit data here).
SEGMENT_BYTES = 1 << 20


def allreduce(ctx, src, wire, fmt, divisor, *, segment_bytes=SEGMENT_BYTES):
    n, p = src.size, ctx.size
    if wire.size != n:
        raise ValueError(f"mpicoll: compressed ring: wire has {wire.size} elements, src {n}")
    if p == 1:
        fmt.accumulate_round(wire, src, divisor, None)
        return
    bounds = block_bounds(n, p)
    yield from _reduce_scatter(ctx, src, wire, fmt, divisor, bounds, segment_bytes)
    yield from ring_allgather(ctx, wire, bounds)


def _reduce_scatter(ctx, src, wire, fmt, divisor, bounds, segment_bytes):
    """ring.py's schedule with the compressed arithmetic: this rank's float32
    values plus the received 16-bit partial, added in float32 and rounded
    once into ``wire`` for sending."""

    def first(a, b):  # step 0: this rank's own block r-1, rounded once
        fmt.accumulate_round(wire[a:b], src[a:b], divisor, None)
        return wire[a:b]

    def combine(a, b, partial):
        fmt.accumulate_round(wire[a:b], src[a:b], divisor, partial)
        return wire[a:b]

    yield from pipelined_reduce_scatter(ctx, bounds, wire.dtype, segment_bytes, first, combine)
