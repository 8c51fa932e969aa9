"""The cost model's terms equal what the simulated driver counts.

``mpicoll.schedule.simulate`` runs every rank's schedule of an algorithm in
one process, without MPI, matching sends to receives, and counts per rank
the messages and bytes sent and the bytes combined. ``model.terms`` gives
the largest of each over the ranks in closed form (it prices algorithms at
process counts nobody can simulate). The two must agree exactly, for every
point-to-point algorithm, process counts 1..9 and awkward counts; the
simulated results must also equal numpy's (so this doubles as a test of
every schedule without MPI).
"""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll import dtypes, model, ops, schedule
from mpicoll.algorithms import get
from mpicoll.kernels import Reduction

COUNTS = (0, 1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 1000, 4097)
ITEMS = {1: "int8", 2: "int16", 4: "float32", 8: "float64"}


def simulated(algorithm, p, count, dtype_name, **knobs):
    """(per-rank SimStats, per-rank results, inputs)."""
    dt = dtypes.BY_NAME[dtype_name]
    red = Reduction(ops.resolve("sum"), dt)
    rng = np.random.default_rng(p * 1000 + count)
    inputs = [rng.integers(-3, 4, count).astype(dt.storage) for _ in range(p)]
    outs = [x.copy() for x in inputs]
    sched = get("allreduce", algorithm).schedule

    def make(ctx, stats):
        return sched(ctx, outs[ctx.rank], schedule.CountingReduction(red, stats), None, **knobs)

    return schedule.simulate(p, make), outs, inputs


@pytest.mark.parametrize("algorithm", model.P2P)
@pytest.mark.parametrize("p", range(1, 10))
def test_terms_equal_simulated_counts(algorithm, p):
    if p == 1:  # the plan layer runs no schedule on one rank: nothing is sent
        assert tuple(model.terms(algorithm, 1, 4000)) == (0, 0, 0)
        return
    for count in COUNTS:
        for itemsize in ((1, 4, 8) if count in (17, 1000) else (4,)):
            name = ITEMS[itemsize]
            knobs = {"segment_bytes": 64} if algorithm == "ring" and count == 1000 else {}
            stats, outs, inputs = simulated(algorithm, p, count, name, **knobs)
            want = model.Terms(max(s.messages for s in stats), max(s.bytes_sent for s in stats),
                               max(s.bytes_reduced for s in stats))
            got = model.terms(algorithm, p, count * itemsize, itemsize, **knobs)
            assert tuple(got) == tuple(want), f"{algorithm} p={p} count={count} itemsize={itemsize} {knobs}"
            total = np.sum(np.stack(inputs).astype(np.int64), axis=0) if count else np.zeros(0)
            for r, out in enumerate(outs):
                np.testing.assert_array_equal(out.astype(np.int64), total.astype(out.dtype).astype(np.int64),
                                              err_msg=f"{algorithm} p={p} count={count} rank {r}")


def test_simulation_detects_a_deadlock():
    def make(ctx, stats):
        def gen():
            yield [ctx.recv(np.zeros(4, np.uint8), (ctx.rank + 1) % ctx.size)]  # everyone waits, nobody sends
        return gen()

    with pytest.raises(RuntimeError, match="deadlock"):
        schedule.simulate(3, make)
