"""Timing shared by the benchmarks and the tuner: message sizes, iteration
counts, the slowest-rank timer, and the node's STREAM bandwidth with the
memory-bound lower bound it gives.

(``bench.allreduce`` sweeps the all-reduce algorithms with these,
``mpicoll.tune`` times its candidates with them, ``bench.overhead`` and
``bench.shm`` interleave their own candidates the same way.)
"""
from __future__ import annotations

import math
import time
from typing import Callable, List, Optional

import numpy as np
from mpi4py import MPI

MAX_DEFAULT = 256 << 20


# ---- sizes and iteration counts ----------------------------------------------

def default_sizes(lo: int = 8, hi: int = MAX_DEFAULT, factor: int = 4) -> List[int]:
    """lo, lo*factor, ... up to hi, and hi itself (8 B .. 256 MiB by 4x:
    the powers of 4 times 8 stop at 128 MiB, so 256 MiB is added)."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def parse_bytes(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suffix):
            s, mult = s[:-1], m
            break
    try:
        v = int(s) * mult
    except ValueError:
        raise ValueError(f"not a size in bytes: {s!r} (examples: 8, 4K, 16M)") from None
    if v <= 0:
        raise ValueError(f"sizes must be positive, got {v}")
    return v


def parse_sizes(spec: str) -> List[int]:
    """"8,4K,1M" (a list) or "8:64M" (8 B to 64 MiB by 4x) or "8:64M:2" (by 2x)."""
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"bad size range {spec!r}: use MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = parse_bytes(parts[0]), parse_bytes(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 4
        if factor < 2 or hi < lo:
            raise ValueError(f"bad size range {spec!r}")
        return default_sizes(lo, hi, factor)
    return sorted({parse_bytes(s) for s in spec.split(",") if s.strip()})


def iterations(nbytes: int, scale: float = 1.0) -> tuple:
    """(warm-up, timed iterations): about 64 MiB of traffic per measurement,
    at least 5 and at most 1000 iterations; small messages need many
    iterations to rise above timer and scheduling noise, large ones few.
    ``measure()`` cuts the count further to a time budget."""
    iters = int(scale * (64 << 20) / max(nbytes, 32 << 10))
    iters = max(5, min(1000, iters))
    return max(2, min(20, iters // 10)), iters


# ---- the physical reference --------------------------------------------------

def stream(comm, nbytes: int = 64 << 20, repeat: int = 5) -> dict:
    """STREAM-style node memory bandwidth, every rank at once.

    Each rank runs STREAM's Copy (c = a) and Add (c = a + b, float64) on
    arrays of ``nbytes`` (larger than the caches), all ranks started
    together by a barrier; the node's bandwidth is the bytes all ranks moved
    (STREAM's counting: 2 arrays for Copy, 3 for Add, no write-allocate)
    over the time until the last rank finished, best of ``repeat``. Ranks share the
    node's memory controllers and cores exactly as they do in an all-reduce.
    """
    n = max(1, nbytes // 8)
    a = np.full(n, 1.0)
    b = np.full(n, 2.0)
    c = np.zeros(n)
    p = comm.Get_size()
    out = {}
    for name, fn, arrays in (("copy", lambda: np.copyto(c, a), 2), ("add", lambda: np.add(a, b, out=c), 3)):
        best = math.inf
        fn()
        for _ in range(repeat):
            # From one barrier to the next: the time the node needed for
            # all ranks' work. (Each rank timing only its own kernel would
            # overstate the bandwidth when ranks outnumber cores and run
            # one after another.)
            comm.Barrier()
            t = time.perf_counter()
            fn()
            comm.Barrier()
            best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
        out[f"{name}_gbs"] = p * arrays * n * 8 / best / 1e9
    out["array_bytes"] = n * 8
    out["node_gbs"] = max(out["copy_gbs"], out["add_gbs"])
    return out


def lower_bound(p: int, nbytes: int, node_gbs: float) -> float:
    """Seconds no all-reduce of ``nbytes`` on ``p`` ranks of this node can beat.

    Every rank must read its own input once and write the result once: at
    least 2 p n bytes cross the node's memory system, whatever the
    algorithm (a shared-memory all-reduce that reads each input in place
    and writes each output directly reaches it; message passing copies
    more). At the node's measured STREAM bandwidth B:

        T_bound = 2 p n / B

    Only a bandwidth bound, and only for messages larger than the caches:
    for short messages, where latency dominates, it is far below anything
    achievable ("% of bound" is small); for messages that stay in the
    last-level cache (up to a few MiB) the all-reduce does not touch DRAM
    at all and "% of bound" can exceed 100%.
    """
    return 2.0 * p * nbytes / (node_gbs * 1e9)


# ---- one measurement ---------------------------------------------------------

def measure(comm, fn: Callable[[], object], iters: int, warmup: int,
            budget_s: Optional[float] = None) -> np.ndarray:
    """The slowest rank's time of each of ``iters`` calls of ``fn``, in
    seconds; with ``budget_s``, fewer calls (at least 5) when the warm-up
    says ``iters`` would take longer (oversubscribed ranks can take
    milliseconds per short message)."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(warmup):
        fn()
    if budget_s is not None:
        per_call = comm.allreduce((time.perf_counter() - t) / max(warmup, 1), op=MPI.MAX)  # same on every rank
        iters = max(5, min(iters, int(budget_s / max(per_call, 1e-9))))
    comm.Barrier()
    ts = np.empty(iters)
    clock = time.perf_counter
    t0 = clock()
    for i in range(iters):
        fn()
        t1 = clock()
        ts[i] = t1 - t0
        t0 = t1
    slowest = np.empty_like(ts)
    comm.Allreduce(ts, slowest, MPI.MAX)
    return slowest




def interleaved(comm, fns, rounds: int, iters: int, rng) -> dict:
    """{label: median seconds per call (slowest rank)} of ``fns`` (label,
    callable) timed ``iters`` calls at a time, ``rounds`` times, in an order
    ``rng`` shuffles each round (seed it alike on every rank: the same order
    everywhere, and a burst of load hits every candidate alike)."""
    times = {label: [] for label, _ in fns}
    for _ in range(rounds):
        for i in rng.permutation(len(fns)):
            label, fn = fns[i]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            t = (time.perf_counter() - t0) / iters
            times[label].append(comm.allreduce(t, op=MPI.MAX))
    return {label: float(np.median(ts)) for label, ts in times.items()}
