"""Ring all-reduce of float32 data with 16-bit (float16/bfloat16) partial sums on the wire.

Function:     allreduce(st, src, wire, fmt, divisor, *, segment_bytes=SEGMENT_BYTES)
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

from mpi4py import MPI

from .common import BYTE, block_bounds, sendrecv

# As ring.py: 1 MiB segments (of 16-bit data here).
SEGMENT_BYTES = 1 << 20

# Not one of common.py's tags: compressed messages must never match an
# uncompressed collective's on the same duplicate communicator.
TAG_COMPRESSED = 61


def allreduce(st, src, wire, fmt, divisor, *, segment_bytes=SEGMENT_BYTES):
    n, p = src.size, st.size
    if wire.size != n:
        raise ValueError(f"mpicoll: compressed ring: wire has {wire.size} elements, src {n}")
    if p == 1:
        fmt.accumulate_round(wire, src, divisor, None)
        return
    bounds = block_bounds(n, p)
    _reduce_scatter(st, src, wire, fmt, divisor, bounds, segment_bytes)
    _allgather(st, wire, bounds, TAG_COMPRESSED)


def _reduce_scatter(st, src, wire, fmt, divisor, bounds, segment_bytes):
    """As ring._reduce_scatter, with the combine replaced by the compressed
    accumulate-and-round (own float32 values + received 16-bit partial)."""
    p, r, comm = st.size, st.rank, st.comm
    right, left = (r + 1) % p, (r - 1) % p
    tag = TAG_COMPRESSED
    longest = max(stop - start for start, stop in bounds)
    seg_elems = max(1, segment_bytes // wire.itemsize)
    nseg = max(1, -(-longest // seg_elems))
    seg_cap = -(-longest // nseg)
    tmp = st.scratch("ring_compressed", 2 * seg_cap * wire.itemsize).view(wire.dtype)
    slots = (tmp[:seg_cap], tmp[seg_cap:])
    # Same cut on sender and receiver, since nseg is global.
    segs = [block_bounds(stop - start, nseg) for start, stop in bounds]
    segs = [[(start + a, start + b) for a, b in cut] for cut, (start, _) in zip(segs, bounds)]

    sends = []
    for a, b in segs[(r - 1) % p]:  # step 0: this rank's own block r-1, rounded once
        fmt.accumulate_round(wire[a:b], src[a:b], divisor, None)
        sends.append(comm.Isend([wire[a:b], BYTE], right, tag))
    for step in range(p - 1):
        block = segs[(r - step - 2) % p]
        recvs = [None, None]

        def post(j):
            a, b = block[j]
            recvs[j % 2] = comm.Irecv([slots[j % 2][:b - a], BYTE], left, tag)

        post(0)
        if nseg > 1:
            post(1)
        for j, (a, b) in enumerate(block):
            status = MPI.Status()
            recvs[j % 2].Wait(status)
            got = status.Get_count(BYTE)
            if got != (b - a) * wire.itemsize:
                raise RuntimeError(f"mpicoll: compressed ring step {step}: expected {(b - a) * wire.itemsize} "
                                   f"bytes from rank {left}, got {got}: the ranks disagree on the message size")
            fmt.accumulate_round(wire[a:b], src[a:b], divisor, slots[j % 2][:b - a])
            if j + 2 < nseg:
                post(j + 2)
            if step < p - 2:  # this segment is what we send in the next step
                sends.append(comm.Isend([wire[a:b], BYTE], right, tag))
    MPI.Request.Waitall(sends)


def _allgather(st, wire, bounds, tag):
    """Ring allgather of the complete 16-bit blocks: in step s rank r passes
    on block r-s and receives block r-s-1 from its left neighbour."""
    p, r, comm = st.size, st.rank, st.comm
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        sa, sb = bounds[(r - step) % p]
        ra, rb = bounds[(r - step - 1) % p]
        sendrecv(comm, wire[sa:sb], right, wire[ra:rb], left, tag)
