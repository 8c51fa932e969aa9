"""Every point-to-point schedule of scatter, gather, allgatherv, alltoall and
alltoallv, on p = 1..9 simulated ranks (counting.simulate, no MPI)."""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll import algorithms as alg
from mpicoll import counting
from mpicoll.algorithms.common import counts_to_bounds

P2P = {c: [n for n in alg.names(c) if n not in ("auto", "mpi")]
       for c in ("scatter", "gather", "allgatherv", "alltoall", "alltoallv")}


def _counts(p, seed, equal=None):
    if equal is not None:
        return [equal] * p
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 7, p)
    if p > 2:
        c[1] = 0  # an empty block
    return [int(x) for x in c]


def _data(rank, n):
    return (np.arange(n, dtype=np.int64) * 7 + rank * 31 + 1).astype(np.uint8)


@pytest.mark.parametrize("p", range(1, 10))
@pytest.mark.parametrize("root_of", [lambda p: 0, lambda p: p - 1, lambda p: p // 2])
@pytest.mark.parametrize("name", P2P["scatter"])
@pytest.mark.parametrize("equal", [None, 0, 3])
def test_scatter(p, root_of, name, equal):
    root = root_of(p)
    bounds = counts_to_bounds(_counts(p, p, equal))
    full = _data(99, bounds[-1][1])
    bufs = [full.copy() if r == root else np.zeros(b - a, np.uint8) for r, (a, b) in enumerate(bounds)]
    counting.simulate(p, lambda ctx, s: alg.get("scatter", name).schedule(ctx, bufs[ctx.rank], bounds, root))
    for r, (a, b) in enumerate(bounds):
        got = bufs[r][a:b] if r == root else bufs[r]
        np.testing.assert_array_equal(got, full[a:b])
    np.testing.assert_array_equal(bufs[root], full)


@pytest.mark.parametrize("p", range(1, 10))
@pytest.mark.parametrize("root_of", [lambda p: 0, lambda p: p - 1, lambda p: p // 2])
@pytest.mark.parametrize("name", P2P["gather"])
@pytest.mark.parametrize("equal", [None, 0, 3])
def test_gather(p, root_of, name, equal):
    root = root_of(p)
    bounds = counts_to_bounds(_counts(p, p + 1, equal))
    want = np.concatenate([_data(r, b - a) for r, (a, b) in enumerate(bounds)])
    bufs = [_data(r, b - a) for r, (a, b) in enumerate(bounds)]
    a, b = bounds[root]
    bufs[root] = np.zeros(bounds[-1][1], np.uint8)
    bufs[root][a:b] = _data(root, b - a)
    counting.simulate(p, lambda ctx, s: alg.get("gather", name).schedule(ctx, bufs[ctx.rank], bounds, root))
    np.testing.assert_array_equal(bufs[root], want)


@pytest.mark.parametrize("p", range(1, 10))
@pytest.mark.parametrize("name", P2P["allgatherv"])
def test_allgatherv(p, name):
    bounds = counts_to_bounds(_counts(p, p + 2))
    want = np.concatenate([_data(r, b - a) for r, (a, b) in enumerate(bounds)])
    bufs = []
    for r, (a, b) in enumerate(bounds):
        x = np.zeros(bounds[-1][1], np.uint8)
        x[a:b] = want[a:b]
        bufs.append(x)
    counting.simulate(p, lambda ctx, s: alg.get("allgatherv", name).schedule(ctx, bufs[ctx.rank], bounds))
    for x in bufs:
        np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("p", range(1, 10))
@pytest.mark.parametrize("coll,name", [(c, n) for c in ("alltoall", "alltoallv") for n in P2P[c]])
@pytest.mark.parametrize("block", [0, 1, 5])
def test_alltoall(p, coll, name, block):
    # counts[i][j]: bytes rank i sends to rank j
    if coll == "alltoall":
        counts = [[block] * p for _ in range(p)]
    else:
        rng = np.random.default_rng(p * 10 + block)
        counts = [[int(c) for c in rng.integers(0, block + 3, p)] for _ in range(p)]
    src = [_data(i, sum(counts[i])) for i in range(p)]
    dst = [np.zeros(sum(counts[i][j] for i in range(p)), np.uint8) for j in range(p)]
    sb = [counts_to_bounds(counts[i]) for i in range(p)]
    rb = [counts_to_bounds([counts[i][j] for i in range(p)]) for j in range(p)]
    stats = counting.simulate(p, lambda ctx, s: alg.get(coll, name).schedule(
        ctx, src[ctx.rank], dst[ctx.rank], sb[ctx.rank], rb[ctx.rank]))
    for j in range(p):
        for i in range(p):
            a, b = rb[j][i]
            c, d = sb[i][j]
            np.testing.assert_array_equal(dst[j][a:b], src[i][c:d])
    if coll == "alltoall" and name == "bruck" and block and p > 1:
        assert stats[0].messages == (p - 1).bit_length()


@pytest.mark.parametrize("coll", sorted(P2P))
def test_auto_rule_names_registered_algorithms(coll):
    from mpicoll import select

    for p in (2, 3, 4, 8, 64):
        for nbytes in (-1, 0, 8, 4096, 1 << 20, 16 << 20, 1 << 30):
            c = select.family(coll, p, nbytes)
            assert alg.has(coll, c.name) and c.reason
            if nbytes < 0:  # a rule for unknown sizes is the same for every size
                assert c.name == select.family(coll, p, -1).name


def test_renamed_algorithms_still_accepted_with_a_warning():
    """scatter/gather's "binomial" is "tree" (as for allreduce, bcast, reduce),
    the all-to-all "ring" is "shift": the old names still work, warn, and
    resolve to the new ones; names() lists only today's."""
    import warnings

    from mpicoll import algorithms as alg
    from mpicoll import plan

    for coll, old, new in (("scatter", "binomial", "tree"), ("gather", "binomial", "tree"),
                           ("alltoall", "ring", "shift"), ("alltoallv", "ring", "shift")):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert alg.get(coll, old) is alg.get(coll, new)
            assert plan.requested(coll, old, None) == new
            assert plan.requested(coll, "auto", old) == new  # MPICOLL_ALGORITHM=old
        assert any(issubclass(x.category, DeprecationWarning) and repr(new) in str(x.message) for x in w)
        assert old not in alg.names(coll) and new in alg.names(coll) and alg.has(coll, old)
    assert not alg.has("allreduce", "binomial") and alg.get("allgatherv", "ring").name == "ring"
