"""Heterogeneity-aware ring all-reduce: ring blocks sized to the links.

Function:     allreduce(ctx, buf, red, src=None, *, weights=None, segment_bytes=ring.SEGMENT_BYTES)
Description:  The ring all-reduce of ring.py (reduce-scatter, then
              allgather, pipelined in segments) with block r, the block that
              ends reduced at rank r, of length proportional to
              ``weights[r]`` instead of n/p.

              Why block sizes matter on uneven links: in the reduce-scatter
              rank r sends every block but its own (n - b_r bytes through
              its link to rank r+1), in the allgather every block but
              b_(r+1), so link r carries 2 n - b_r - b_(r+1) bytes; the
              blocks next to a slow link should be the long ones. Each block
              also travels once along all the other links, so making them
              too long moves the bottleneck to the fast links' chain; the
              weights trade one against the other.

              ``weights`` is a list of p positive numbers, the same on every
              rank (the schedule cannot check that; ``check=True`` catches a
              disagreement as a size mismatch at worst), or the string
              ``"measure"``: the ``prepare`` hook then times, once per
              communicator, a short message from every rank to its right
              neighbour (all links at once, as the ring uses them), shares
              the times with an allgather, and derives the weights with
              ``weights_for_links`` (identical on every rank). ``None`` or
              equal weights: exactly the plain ring.
Cost:         Link r carries 2 n - b_r - b_(r+1) bytes in 2 (p-1) steps
              (of ``segments`` messages each in the reduce-scatter); with
              per-link seconds per byte s_r the phase time is bounded below
              by max_r s_r (2 n - b_r - b_(r+1)) and by the slowest block's
              chain, (p-1) max_r b_r / max bandwidth. Equal weights: the
              ring's 2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
              Measuring costs 3 round trips of 256 KiB per rank, once.
Limitations:  ``weights_for_links`` is a heuristic (block r in proportion
              to the slowness of the two links it relieves, s_(r-1) + s_r),
              not the optimum of the min-max problem; with one link c times
              slower than the others it brings that link's load from
              2 n - 2 n/p to 2 n - n (c+1)/(c+p-1). Measured times
              are rounded to whole multiples of the fastest link's, so noise
              on a uniform network gives equal weights (the plain ring), a
              link must be 1.5 times slower to count, and times are taken once: a link that changes speed later is not seen.
              Fewer elements than ranks: recursive doubling, as the ring.
              Every rank ends with the same bits (each block is reduced
              along one chain and copied); the order of the floating-point
              additions differs from block to block.
"""
from __future__ import annotations

import math

import numpy as np

from . import recursive_doubling, register, ring
from .common import block_bounds

# The ping of ``"measure"``: long enough that bandwidth, not latency,
# dominates on a 10 Gbit/s link (~0.2 ms), short enough to cost nothing
# next to the all-reduces it tunes; the fastest of 3 tries.
PING_BYTES = 256 << 10
PING_TRIES = 3
# A tag no collective uses on mpicoll's private communicator (their tags
# are 1 + seq % tag_span, CommState.next_seq).
PING_TAG = 0


def weighted_bounds(n: int, weights) -> list:
    """[(start, stop)] of len(weights) blocks of ``n`` elements, block r of
    about n weights[r] / sum(weights) (cumulative floors: the same on every
    rank for the same weights); equal weights give block_bounds exactly."""
    p = len(weights)
    if all(w == weights[0] for w in weights):
        return block_bounds(n, p)
    total = math.fsum(weights)
    cuts, acc = [0], 0.0
    for w in weights[:-1]:
        acc += w
        cuts.append(min(n, int(n * acc / total)))
    cuts.append(n)
    return list(zip(cuts[:-1], cuts[1:]))


def weights_for_links(seconds) -> list:
    """Ring block weights for per-link times (``seconds[r]``: rank r's link
    to rank r+1, for the same message): block r relieves links r-1 (in the
    allgather) and r (in the reduce-scatter), so it gets weight
    s_(r-1) + s_r, with each s the time in whole multiples of the fastest
    link's (noise of up to half of it on equal links gives equal weights)."""
    fastest = min(seconds)
    if not fastest > 0:
        raise ValueError(f"mpicoll: hetero_ring link times must be positive, got {list(seconds)}")
    s = [float(max(1, round(t / fastest))) for t in seconds]
    p = len(s)
    return [s[(r - 1) % p] + s[r] for r in range(p)]


def _check_weights(weights, p):
    if weights is None or isinstance(weights, str):
        return
    try:
        ok = len(weights) == p and all(
            not isinstance(w, bool) and isinstance(w, (int, float, np.integer, np.floating)) and math.isfinite(w)
            and w > 0 for w in weights)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"mpicoll: hetero_ring weights must be None, 'measure' or {p} positive finite numbers "
                         f"(one per rank), got {weights!r}")


def measure_links(st) -> list:
    """Collective: every rank's time to send PING_BYTES to its right
    neighbour (acknowledged by a 1-byte reply), fastest of PING_TRIES, the
    same list on every rank."""
    from mpi4py import MPI

    comm, p, r = st.comm, st.size, st.rank
    right, left = (r + 1) % p, (r - 1) % p
    out = np.zeros(PING_BYTES, np.uint8)
    inn = np.empty(PING_BYTES, np.uint8)
    ack_out, ack_in = np.zeros(1, np.uint8), np.empty(1, np.uint8)
    best = math.inf
    for _ in range(PING_TRIES):
        comm.Barrier()  # every link starts at once, as in the ring
        t0 = MPI.Wtime()
        reqs = [comm.Irecv([inn, MPI.BYTE], left, PING_TAG), comm.Irecv([ack_in, MPI.BYTE], right, PING_TAG),
                comm.Isend([out, MPI.BYTE], right, PING_TAG)]
        reqs[0].Wait()
        comm.Send([ack_out, MPI.BYTE], left, PING_TAG)
        MPI.Request.Waitall(reqs[1:])
        best = min(best, MPI.Wtime() - t0)
    every = np.empty(p, np.float64)
    comm.Allgather(np.array([best]), every)
    return every.tolist()


def prepare(st, buf, **knobs) -> None:
    """Call-time set-up (collective): the link times, once per communicator,
    when ``weights="measure"``."""
    if knobs.get("weights") == "measure" and "hetero_ring" not in st.extra:
        st.extra["hetero_ring"] = tuple(weights_for_links(measure_links(st)))


@register("allreduce", "hetero_ring", knobs=("weights", "segment_bytes"), prepare=prepare)
def allreduce(ctx, buf, red, src=None, *, weights=None, segment_bytes=ring.SEGMENT_BYTES):
    p = ctx.size
    _check_weights(weights, p)
    if isinstance(weights, str):
        if weights != "measure":
            raise ValueError(f"mpicoll: hetero_ring weights must be None, 'measure' or a list, got {weights!r}")
        weights = ctx.st.extra.get("hetero_ring") if p > 1 else [1] * p
        if weights is None:
            raise RuntimeError("mpicoll: hetero_ring weights='measure' needs its prepare step (call it through "
                               "mpicoll's API, not the bare schedule)")
    if buf.size < p:
        yield from recursive_doubling.allreduce(ctx, buf, red, src)
        return
    bounds = block_bounds(buf.size, p) if weights is None else weighted_bounds(buf.size, list(weights))
    yield from ring._reduce_scatter(ctx, buf, red, bounds, segment_bytes, src)
    yield from ring.ring_allgather(ctx, buf, bounds)
