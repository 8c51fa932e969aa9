"""Ring all-reduce: reduce-scatter around a ring, then allgather around it.

Function:     allreduce(st, buf, red, *, src=None, segment_bytes=SEGMENT_BYTES)
              reduce_scatter(st, buf, red, bounds, *, segment_bytes=...)
              allgather(st, buf, bounds)
              reduce(st, buf, red, root)   ring reduce-scatter + gather to root
              bcast(st, buf, root)         scatter from root + ring allgather
Description:  The vector is cut into p blocks (np.array_split convention),
              one per rank. Each rank sends to its right neighbour and
              receives from its left one.

              Reduce-scatter, p-1 steps: in step s rank r sends block
              (r-s-1) mod p and receives block (r-s-2) mod p, which it
              combines with its own copy; the partial sum of a block travels
              once around the ring and ends, complete, at the rank with the
              block's number.

                  p = 3      step 0             step 1          owns
                  rank 0     send b2, recv b1   send b1, recv b0   b0
                  rank 1     send b0, recv b2   send b2, recv b1   b1
                  rank 2     send b1, recv b0   send b0, recv b2   b2

              Allgather, p-1 steps: rank r passes on the block it last got,
              starting with its own, and receives the next one in place.

              Pipelining: each block is cut into segments of at most
              ``segment_bytes``. Receives go into two alternating scratch
              segments, so the next segment is already arriving while the
              current one is being reduced; each reduced segment is sent on
              for the next step at once rather than after the whole block.
Cost:         2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma: bandwidth-
              optimal, but the latency term grows linearly in p. Segmenting
              adds (segments - 1) alpha per step in exchange for overlap.
Limitations:  With fewer elements than ranks some blocks are empty and the
              p-1 latency-bound steps buy nothing: it then runs recursive
              doubling instead (Open MPI does the same). Each block is reduced
              along one chain and then copied, so every rank ends with the
              same bits, but the chain starts at a different rank for each
              block: the order of floating-point additions differs from block
              to block.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import recursive_doubling, register
from ..check import is_truncation, size_mismatch
from .common import (BYTE, TAG_ALLGATHER, TAG_ALLREDUCE, TAG_BCAST, TAG_REDUCE, TAG_REDUCE_SCATTER, block_bounds,
                     recv, send, sendrecv, split_range)

# Gloo caps ring segments at 1 MiB; measured here, 1 MiB segments cost
# nothing at 64 MiB and let the reduction overlap the transfers.
SEGMENT_BYTES = 1 << 20


@register("allreduce", "ring")
def allreduce(st, buf, red, *, src=None, segment_bytes=SEGMENT_BYTES):
    if buf.size < st.size:
        return recursive_doubling.allreduce(st, buf, red, src=src)
    bounds = block_bounds(buf.size, st.size)
    _reduce_scatter(st, buf, red, bounds, segment_bytes, TAG_ALLREDUCE, src)
    ring_allgather(st, buf, bounds, TAG_ALLREDUCE)


@register("reduce_scatter", "ring")
def reduce_scatter(st, buf, red, bounds, *, segment_bytes=SEGMENT_BYTES):
    _reduce_scatter(st, buf, red, bounds, segment_bytes, TAG_REDUCE_SCATTER, None)


@register("allgather", "ring")
def allgather(st, buf, bounds):
    ring_allgather(st, buf, bounds, TAG_ALLGATHER)


@register("reduce", "ring")
def reduce(st, buf, red, root, *, segment_bytes=SEGMENT_BYTES):
    """Ring reduce-scatter, then every rank sends its reduced block to root
    (Rabenseifner's reduce): (p-1)/p n bytes through each link instead of the
    binomial tree's n log2(p) at the root."""
    bounds = block_bounds(buf.size, st.size)
    _reduce_scatter(st, buf, red, bounds, segment_bytes, TAG_REDUCE, None)
    a, b = bounds[st.rank]
    if st.rank != root:
        send(st.comm, buf[a:b], root, TAG_REDUCE)
        return
    peers = [(r, a, b) for r, (a, b) in enumerate(bounds) if r != root]
    reqs = [st.comm.Irecv([buf[a:b], BYTE], r, TAG_REDUCE) for r, a, b in peers]
    statuses = [MPI.Status() for _ in reqs]
    MPI.Request.Waitall(reqs, statuses)
    for (r, a, b), status in zip(peers, statuses):  # same size check as common.recv
        got = status.Get_count(BYTE)
        if got != (b - a) * buf.itemsize:
            raise size_mismatch(st.comm, (b - a) * buf.itemsize, got, r, "ring reduce")


@register("bcast", "ring")
def bcast(st, buf, root):
    """Scatter from root (rank i gets block i straight from root), then a
    ring allgather: 2 (p-1)/p n bytes per rank in all, against the binomial
    tree's n log2(p); for long messages (van de Geijn's broadcast)."""
    p, r = st.size, st.rank
    bounds = block_bounds(buf.size, p)
    if r == root:
        reqs = [st.comm.Isend([buf[a:b], BYTE], i, TAG_BCAST) for i, (a, b) in enumerate(bounds) if i != root]
        MPI.Request.Waitall(reqs)
    else:
        a, b = bounds[r]
        recv(st.comm, buf[a:b], root, TAG_BCAST)
    ring_allgather(st, buf, bounds, TAG_BCAST)



def _reduce_scatter(st, buf, red, bounds, segment_bytes, tag, src):
    """Ring reduce-scatter into ``buf``. With ``src`` (out of place), this
    rank's own data is read from ``src``: each of its blocks is read exactly
    once (block r-1 is sent, the others are combined), so no copy is needed;
    block r-1 of ``buf`` is left unwritten (the allgather fills it)."""
    own = buf if src is None else src

    def combine(a, b, partial):
        mine = buf[a:b]
        red.combine(mine, partial, own[a:b])  # partial from the left, then ours
        return mine

    pipelined_reduce_scatter(st, bounds, buf.dtype, segment_bytes, tag, lambda a, b: own[a:b], combine)


def pipelined_reduce_scatter(st, bounds, wire_dtype, segment_bytes, tag, first, combine):
    """The ring reduce-scatter's message schedule, with the arithmetic left to
    the caller (the plain ring here, the 16-bit ring in ring_compressed.py).

    ``first(a, b)`` returns what this rank sends for elements [a, b) of its
    step-0 block (r-1); ``combine(a, b, partial)`` folds the partial received
    from the left for [a, b) into this rank's data and returns the array to
    pass on in the next step. Messages carry ``wire_dtype`` elements.
    """
    p, r, comm = st.size, st.rank, st.comm
    right, left = (r + 1) % p, (r - 1) % p
    itemsize = np.dtype(wire_dtype).itemsize
    longest = max(stop - start for start, stop in bounds)
    seg_elems = max(1, segment_bytes // itemsize)
    nseg = max(1, -(-longest // seg_elems))
    seg_cap = -(-longest // nseg)
    tmp = st.scratch(f"ring-{itemsize}", 2 * seg_cap * itemsize).view(wire_dtype)
    slots = (tmp[:seg_cap], tmp[seg_cap:])
    segs = [split_range(start, stop, nseg) for start, stop in bounds]

    # Step 0 sends this rank's own data for block r-1, all segments at once.
    sends = [comm.Isend([first(a, b), BYTE], right, tag) for a, b in segs[(r - 1) % p]]
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
            expected = (b - a) * itemsize
            try:
                recvs[j % 2].Wait(status)
            except MPI.Exception as exc:
                if is_truncation(exc):
                    raise size_mismatch(comm, expected, -1, left, f"ring step {step}") from exc
                raise
            got = status.Get_count(BYTE)
            if got != expected:
                raise size_mismatch(comm, expected, got, left, f"ring step {step}")
            forward = combine(a, b, slots[j % 2][:b - a])
            if j + 2 < nseg:
                post(j + 2)
            if step < p - 2:  # this segment is what we send in the next step
                sends.append(comm.Isend([forward, BYTE], right, tag))
    MPI.Request.Waitall(sends)


def ring_allgather(st, buf, bounds, tag):
    """Ring allgather of ``bounds`` blocks in place: in step s rank r passes on
    block r-s and receives block r-s-1 from its left neighbour."""
    p, r, comm = st.size, st.rank, st.comm
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        sa, sb = bounds[(r - step) % p]
        ra, rb = bounds[(r - step - 1) % p]
        sendrecv(comm, buf[sa:sb], right, buf[ra:rb], left, tag)
