"""The cost model's terms equal what the simulated driver counts.

``mpicoll.counting.simulate`` runs every rank's schedule of an algorithm in
one process, without MPI, matching sends to receives, and counts per rank
the messages and bytes sent and the bytes combined. ``model.terms`` gives
the largest of each over the ranks in closed form (it prices algorithms at
process counts nobody can simulate). The two must agree exactly, for every
point-to-point algorithm, process counts 1..9, counts around p and the
power of two below it (where the ring and Rabenseifner change schedule and
blocks turn uneven), every item size and ring segments down to one element
(zero-byte segments still cost a message); the simulated results must also
equal numpy's, so this doubles as a test of every schedule without MPI.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll import counting, dtypes, model, ops
from mpicoll.algorithms import get
from mpicoll.kernels import Reduction

ITEMS = {1: "int8", 2: "int16", 4: "float32", 8: "float64"}
# Ring segment sizes in bytes: below one element, not a multiple of any item
# size, a few elements, and the default (one segment per block).
SEGMENTS = (1, 3, 24, 1000, None)


def counts(p):
    pof2 = 1 << (p.bit_length() - 1)
    near = {0, 1, p - 1, p, p + 1, 2 * p + 1, pof2 - 1, pof2, pof2 + 1}
    return sorted(c for c in near | {13, 31, 1000, 4097} if c >= 0)


def simulated(algorithm, p, count, dtype_name, **knobs):
    """(per-rank SimStats, per-rank results, inputs)."""
    dt = dtypes.BY_NAME[dtype_name]
    red = Reduction(ops.resolve("sum"), dt)
    rng = np.random.default_rng(p * 1000 + count)
    inputs = [rng.integers(-3, 4, count).astype(dt.storage) for _ in range(p)]
    outs = [x.copy() for x in inputs]
    sched = get("allreduce", algorithm).schedule

    def make(ctx, stats):
        return sched(ctx, outs[ctx.rank], counting.CountingReduction(red, stats), None, **knobs)

    return counting.simulate(p, make), outs, inputs


def check(algorithm, p, count, itemsize, **knobs):
    stats, outs, inputs = simulated(algorithm, p, count, ITEMS[itemsize], **knobs)
    want = (max(s.messages for s in stats), max(s.bytes_sent for s in stats),
            max(s.bytes_reduced for s in stats))
    got = tuple(model.terms(algorithm, p, count * itemsize, itemsize, **knobs))
    assert got == want, f"{algorithm} p={p} count={count} itemsize={itemsize} {knobs}: model {got}, simulated {want}"
    total = np.sum(np.stack(inputs).astype(np.int64), axis=0)
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out.astype(np.int64), total.astype(out.dtype).astype(np.int64),
                                      err_msg=f"{algorithm} p={p} count={count} rank {r}")


def cases(algorithm, p):
    for count in counts(p):
        for itemsize in ITEMS:
            if algorithm != "ring":
                yield count, itemsize, {}
                continue
            for seg in SEGMENTS:
                # Segments cost simulation time (hundreds of messages per rank
                # on long vectors): item sizes 1 and 4 show how segment bytes
                # round to elements, and long vectors need only one of them.
                if seg is not None and (itemsize not in (1, 4) or count > 4 * p + 8 and (seg < 24 or itemsize != 4)):
                    continue
                yield count, itemsize, ({} if seg is None else {"segment_bytes": seg})


@pytest.mark.parametrize("algorithm", model.P2P)
@pytest.mark.parametrize("p", range(2, 10))
def test_terms_equal_simulated_counts(algorithm, p):
    for count, itemsize, knobs in cases(algorithm, p):
        check(algorithm, p, count, itemsize, **knobs)


@pytest.mark.parametrize("algorithm", [a for a in model.P2P if a != "ring"])
def test_one_rank(algorithm):
    # The plan layer runs no schedule on one rank (it copies), so the model
    # prices p = 1 at nothing; these schedules send nothing there either.
    for count in (0, 1, 1000):
        check(algorithm, 1, count, 4)


def test_one_rank_ring():
    """On one rank the ring copies and sends nothing (it used to send its
    block to itself, unreceived)."""
    check("ring", 1, 1000, 4, segment_bytes=64)


def test_ring_zero_byte_segments_count():
    # 2p+1 elements in 1-element segments: blocks of 2 and 3 elements are cut
    # into 3 segments each, so the 2-element blocks send an empty segment.
    p = 4
    stats, _, _ = simulated("ring", p, 2 * p + 1, "float32", segment_bytes=4)
    assert max(s.messages for s in stats) == (p - 1) * (3 + 1) == model.terms("ring", p, 4 * (2 * p + 1), 4,
                                                                              segment_bytes=4).messages


def test_simulation_detects_a_deadlock():
    def make(ctx, stats):
        def gen():
            yield [ctx.recv(np.zeros(4, np.uint8), (ctx.rank + 1) % ctx.size)]  # everyone waits, nobody sends
        return gen()

    with pytest.raises(RuntimeError, match="deadlock"):
        counting.simulate(3, make)
