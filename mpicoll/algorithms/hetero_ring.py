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
              communicator, a 1 MiB message from every rank to its right
              neighbour (a third of the links at a time, timed by the
              receiver), shares the times with an allgather, and derives
              the weights with
              ``weights_for_links`` (identical on every rank). ``None`` or
              equal weights: exactly the plain ring.
Cost:         Link r carries 2 n - b_r - b_(r+1) bytes in 2 (p-1) steps
              (of ``segments`` messages each in the reduce-scatter); with
              per-link seconds per byte s_r the phase time is bounded below
              by max_r s_r (2 n - b_r - b_(r+1)) and by the slowest block's
              chain, (p-1) max_r b_r / max bandwidth. Equal weights: the
              ring's 2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
              Measuring costs 12 barriers and 3 messages of 1 MiB per rank, once.
Limitations:  ``weights_for_links`` is a heuristic (block r in proportion
              to the slowness of the two links it relieves, s_(r-1) + s_r),
              not the optimum of the min-max problem; with one link c times
              slower than the others it brings that link's load from
              2 n - 2 n/p to 2 n - n (c+1)/(c+p-1). Measured times
              are rounded to whole multiples of the median link's, so noise
              on a uniform network gives equal weights (the plain ring), a
              link must be 1.5 times slower than the median to count (when
              most links are slow, none is), and times are taken once: a link that changes speed later is not seen.
              Fewer elements than ranks: recursive doubling, as the ring.
              Every rank ends with the same bits (each block is reduced
              along one chain and copied); the order of the floating-point
              additions differs from block to block.
"""
from __future__ import annotations

import math

import numpy as np

from . import recursive_doubling, ring
from ..registry import register
from ..model import weighted_cuts
from .common import block_bounds

# The ping of ``"measure"``: long enough that bandwidth, not latency,
# dominates on a 10 Gbit/s link (~1 ms), and longer than the burst a token
# bucket lets through at full speed (the test bed's tc shaping allows
# 256 KiB: a 256 KiB ping saw a 1 Gbit/s link as fast); the fastest of 3.
PING_BYTES = 1 << 20
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
    cuts = weighted_cuts(n, weights)
    return list(zip(cuts[:-1], cuts[1:]))


def weights_for_links(seconds) -> list:
    """Ring block weights for per-link times (``seconds[r]``: rank r's link
    to rank r+1, for the same message): block r relieves links r-1 (in the
    allgather) and r (in the reduce-scatter), so it gets weight
    s_(r-1) + s_r, with each s the time in whole multiples of the median
    link's, at least 1. The median, not the fastest: one link timed too
    fast (a late barrier exit on a loaded machine) would make every other
    link look slow; noise of up to half the median gives equal weights."""
    if not all(t > 0 for t in seconds):
        raise ValueError(f"mpicoll: hetero_ring link times must be positive, got {list(seconds)}")
    unit = float(np.median(seconds))
    s = [float(max(1, round(t / unit))) for t in seconds]
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


def _phase(link: int, p: int) -> int:
    """When link ``link`` (rank link -> link+1) is timed: links r mod 3 at
    once, so that no rank sends and receives in the same phase (its send
    would share its CPU and the MPI library's progress with its receive,
    and be counted as the other link's time); the wrap-around link alone
    when p is not a multiple of 3."""
    return 3 if link == p - 1 and p % 3 else link % 3


def measure_links(st) -> list:
    """Collective: the time of PING_BYTES over every rank's link to its right
    neighbour, fastest of PING_TRIES, the same list on every rank. Each time
    is taken by the receiver, from a barrier to the message's arrival (no
    acknowledgement, which would queue behind the sender's other traffic)."""
    from mpi4py import MPI

    comm, p, r = st.comm, st.size, st.rank
    right, left = (r + 1) % p, (r - 1) % p
    buf = np.zeros(PING_BYTES, np.uint8)
    best = math.inf
    for _ in range(PING_TRIES):
        for phase in range(4):
            comm.Barrier()
            t0 = MPI.Wtime()
            if _phase(r, p) == phase:
                comm.Send([buf, MPI.BYTE], right, PING_TAG)
            if _phase(left, p) == phase:
                comm.Recv([buf, MPI.BYTE], left, PING_TAG)
                best = min(best, MPI.Wtime() - t0)
    every = np.empty(p, np.float64)
    comm.Allgather(np.array([best]), every)
    # every[q] is link q-1's time (rank q received it): link r is every[r+1].
    return [float(every[(q + 1) % p]) for q in range(p)]


def prepare(st, buf, red=None, **knobs) -> None:
    """Call-time set-up (collective): the link times, once per communicator,
    when ``weights="measure"``."""
    if knobs.get("weights") == "measure" and "hetero_ring" not in st.extra:
        st.extra["hetero_ring"] = tuple(weights_for_links(measure_links(st)))


@register("allreduce", "hetero_ring", knobs=("weights", "segment_bytes"), prepare=prepare,
          compilable=True)
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
