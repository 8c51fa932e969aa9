"""Issue 20's new algorithms (k-nomial tree, cascade, heterogeneity-aware
ring) on simulated ranks (counting.simulate, no MPI): every p = 1..33,
awkward counts (0, fewer elements than ranks, not divisible by p), a sample
of every op and dtype; results equal numpy's and every rank holds the same
bits. The ``-m mpi`` tests at the end run them through the public API
(blocking, nonblocking, persistent) under mpiexec."""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll import counting, dtypes, ops, schedule
from mpicoll.algorithms import get
from mpicoll.kernels import Reduction

# Every op with the numpy function that reduces a stack of inputs along axis 0.
NUMPY_OPS = {
    "sum": lambda x: np.sum(x, axis=0),
    "prod": lambda x: np.prod(x, axis=0),
    "min": lambda x: np.min(x, axis=0),
    "max": lambda x: np.max(x, axis=0),
    "band": lambda x: np.bitwise_and.reduce(x, axis=0),
    "bor": lambda x: np.bitwise_or.reduce(x, axis=0),
    "bxor": lambda x: np.bitwise_xor.reduce(x, axis=0),
    "land": lambda x: np.logical_and.reduce(x != 0, axis=0),
    "lor": lambda x: np.logical_or.reduce(x != 0, axis=0),
    "lxor": lambda x: np.logical_xor.reduce(x != 0, axis=0),
}


def to_storage(values, dt) -> np.ndarray:
    """float64 values (exactly representable) as ``dt``'s storage array."""
    if dt.name == "float16":
        return np.asarray(values, np.float16).view(np.uint16)
    if dt.name == "bfloat16":
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(dt.storage)


def from_storage(buf, dt) -> np.ndarray:
    if dt.name == "float16":
        return buf.view(np.float16).astype(np.float64)
    if dt.name == "bfloat16":
        return (buf.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return buf


def inputs_for(p, count, dt, op, seed):
    """Per-rank inputs whose reduction is exact in ``dt`` in any order:
    small integers (±1 for prod, so that no product overflows)."""
    rng = np.random.default_rng(seed)
    lo = 0 if dt.kind == "uint" else -3
    if op == "prod":
        vals = [rng.choice([1, -1] if lo else [1], count) for _ in range(p)]
    else:
        vals = [rng.integers(lo, 4, count) for _ in range(p)]
    return [to_storage(v.astype(np.float64) if dt.kind == "float" else v, dt) for v in vals]


def expected(inputs, dt, op):
    if dt.kind == "float":
        x = np.stack([from_storage(v, dt) for v in inputs]) if inputs[0].size else np.zeros((len(inputs), 0))
        return to_storage(NUMPY_OPS[op](x), dt)
    return NUMPY_OPS[op](np.stack(inputs)).astype(dt.storage)


def run_allreduce(name, inputs, dt, op="sum", out_of_place=False, **knobs):
    """Simulate all-reduce ``name``; (per-rank outputs, per-rank SimStats)."""
    p = len(inputs)
    red = Reduction(ops.resolve(op), dt)
    outs = [np.full_like(x, 7) if out_of_place else x.copy() for x in inputs]
    sched = get("allreduce", name).schedule

    def make(ctx, stats):
        src = inputs[ctx.rank] if out_of_place else None
        return sched(ctx, outs[ctx.rank], counting.CountingReduction(red, stats), src, **knobs)

    return outs, counting.simulate(p, make)


def assert_allreduced(outs, want, what):
    for r, out in enumerate(outs):
        assert out.tobytes() == want.tobytes(), f"{what}: rank {r} got {out[:8]}..., want {want[:8]}..."


def awkward_counts(p):
    return sorted({0, 1, max(p - 1, 0), p + 1, 2 * p + 3, 37})


def valid_pairs():
    for op in NUMPY_OPS:
        for dt in dtypes.ALL:
            if dt.kind in ops.BY_NAME[op].kinds:
                yield op, dt.name


# ---- k-nomial tree ----------------------------------------------------------------

@pytest.mark.parametrize("p", range(1, 34))
@pytest.mark.parametrize("radix", [2, 3, 4, 8])
def test_knomial_allreduce_every_p(p, radix):
    dt = dtypes.BY_NAME["float32"]
    for count in awkward_counts(p):
        inputs = inputs_for(p, count, dt, "sum", p * 100 + count)
        outs, _ = run_allreduce("knomial", inputs, dt, radix=radix, out_of_place=count % 2 == 1)
        assert_allreduced(outs, expected(inputs, dt, "sum"), f"knomial k={radix} p={p} count={count}")


@pytest.mark.parametrize("op,dtype", list(valid_pairs()))
def test_knomial_every_op_dtype(op, dtype):
    dt = dtypes.BY_NAME[dtype]
    for p in (5, 11):
        inputs = inputs_for(p, 13, dt, op, p)
        outs, _ = run_allreduce("knomial", inputs, dt, op, radix=3)
        assert_allreduced(outs, expected(inputs, dt, op), f"knomial {op} {dtype} p={p}")


@pytest.mark.parametrize("p", [2, 5, 9, 17, 33])
def test_knomial_same_bits_on_every_rank(p):
    # Non-integer floats: the sum depends on the order; every rank must still
    # hold the root's bits.
    dt = dtypes.BY_NAME["float64"]
    rng = np.random.default_rng(p)
    inputs = [rng.standard_normal(23) for _ in range(p)]
    outs, _ = run_allreduce("knomial", inputs, dt, radix=4)
    assert_allreduced(outs, outs[0], f"knomial p={p}")
    np.testing.assert_allclose(outs[0], np.sum(inputs, axis=0), rtol=1e-12)


class _Recorder(counting._Network):
    """The simulated network, also logging every message (source, dest, bytes) in posting order."""

    log: list = []

    def post(self, op):
        if op.kind == schedule.SEND:
            type(self).log.append((op.ctx.rank, op.peer, op.buf.nbytes))
        super().post(op)


def _messages(monkeypatch, coll, name, p, root, **knobs):
    monkeypatch.setattr(counting, "_Network", _Recorder)
    _Recorder.log = []
    dt = dtypes.BY_NAME["int32"]
    bufs = [np.arange(5, dtype=np.int32) + r for r in range(p)]
    red = Reduction(ops.resolve("sum"), dt)
    sched = get(coll, name).schedule
    if coll == "bcast":
        counting.simulate(p, lambda ctx, s: sched(ctx, bufs[ctx.rank], root, **knobs))
    elif coll == "reduce":
        counting.simulate(p, lambda ctx, s: sched(ctx, bufs[ctx.rank], red, root, **knobs))
    else:
        counting.simulate(p, lambda ctx, s: sched(ctx, bufs[ctx.rank], red, None, **knobs))
    return sorted(_Recorder.log), bufs


@pytest.mark.parametrize("p", range(1, 20))
@pytest.mark.parametrize("coll", ["allreduce", "reduce", "bcast"])
def test_knomial_radix_2_is_the_binomial_tree(monkeypatch, p, coll):
    root = 0 if coll == "allreduce" else p // 2
    tree, _ = _messages(monkeypatch, coll, "tree", p, root)
    kn, _ = _messages(monkeypatch, coll, "knomial", p, root, radix=2)
    assert kn == tree


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 16, 17, 33])
@pytest.mark.parametrize("radix", [2, 4, 5])
def test_knomial_reduce_and_bcast_any_root(p, radix):
    dt = dtypes.BY_NAME["int64"]
    red = Reduction(ops.resolve("sum"), dt)
    for root in sorted({0, p - 1, p // 2}):
        bufs = [np.arange(9, dtype=np.int64) * (r + 1) for r in range(p)]
        want = np.sum(bufs, axis=0)
        counting.simulate(p, lambda ctx, s: get("reduce", "knomial").schedule(ctx, bufs[ctx.rank], red, root,
                                                                               radix=radix))
        np.testing.assert_array_equal(bufs[root], want)
        bufs = [np.zeros(9, np.int64) if r != root else np.arange(9, dtype=np.int64) + 5 for r in range(p)]
        counting.simulate(p, lambda ctx, s: get("bcast", "knomial").schedule(ctx, bufs[ctx.rank], root, radix=radix))
        for b in bufs:
            np.testing.assert_array_equal(b, np.arange(9) + 5)


@pytest.mark.parametrize("p,radix", [(16, 4), (27, 3), (30, 4), (64, 8)])
def test_knomial_root_messages(p, radix):
    # The root receives k-1 messages per level in the reduce and sends as many
    # in the bcast: (k-1) ceil(log_k p) each when p is a power of k, fewer at
    # the top level otherwise.
    dt = dtypes.BY_NAME["int32"]
    inputs = [np.ones(4, np.int32) for _ in range(p)]
    outs, stats = run_allreduce("knomial", inputs, dt, radix=radix)
    levels = 1
    while radix ** levels < p:
        levels += 1
    top = -(-p // radix ** (levels - 1)) - 1  # children of the root at the top level
    assert stats[0].messages == (radix - 1) * (levels - 1) + top
    assert stats[0].bytes_reduced == stats[0].messages * 16
    assert max(s.messages for s in stats[1:]) <= 1 + (radix - 1) * (levels - 1)
    assert_allreduced(outs, np.full(4, p, np.int32), "knomial")


@pytest.mark.parametrize("radix", [1, 0, 2.0, True, "4"])
def test_knomial_bad_radix(radix):
    dt = dtypes.BY_NAME["int32"]
    with pytest.raises(ValueError, match="radix"):
        run_allreduce("knomial", [np.ones(3, np.int32)] * 2, dt, radix=radix)


# ---- cascade -------------------------------------------------------------------------

def test_cascade_layout():
    from mpicoll.algorithms.cascade import layout

    assert layout(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert layout(4, 8) == [[0, 1, 2, 3]]
    assert layout(3, 1) == [[0], [1], [2]]
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="ppn"):
            layout(4, bad)


@pytest.mark.parametrize("p", range(1, 34))
@pytest.mark.parametrize("ppn", [1, 2, 3, 4, 8])
def test_cascade_allreduce_every_p(p, ppn):
    dt = dtypes.BY_NAME["float32"]
    for count in awkward_counts(p) + [5 * ppn + 1]:
        inputs = inputs_for(p, count, dt, "sum", p * 100 + count)
        outs, _ = run_allreduce("cascade", inputs, dt, ppn=ppn, out_of_place=count % 2 == 1)
        assert_allreduced(outs, expected(inputs, dt, "sum"), f"cascade ppn={ppn} p={p} count={count}")


@pytest.mark.parametrize("cross", ["ring", "recursive_doubling", "rabenseifner", "tree", "knomial"])
@pytest.mark.parametrize("p,ppn", [(6, 2), (7, 3), (12, 4), (13, 4), (5, 1)])
def test_cascade_every_cross_algorithm(cross, p, ppn):
    dt = dtypes.BY_NAME["int32"]
    for count in (0, 2, 3 * p + 2, 100):
        inputs = inputs_for(p, count, dt, "sum", count)
        outs, _ = run_allreduce("cascade", inputs, dt, ppn=ppn, cross=cross, out_of_place=count == 100)
        assert_allreduced(outs, expected(inputs, dt, "sum"), f"cascade cross={cross} p={p} count={count}")


@pytest.mark.parametrize("op,dtype", list(valid_pairs()))
def test_cascade_every_op_dtype(op, dtype):
    dt = dtypes.BY_NAME[dtype]
    for p, ppn in ((5, 2), (9, 4)):
        inputs = inputs_for(p, 13, dt, op, p)
        outs, _ = run_allreduce("cascade", inputs, dt, op, ppn=ppn)
        assert_allreduced(outs, expected(inputs, dt, op), f"cascade {op} {dtype} p={p}")


@pytest.mark.parametrize("p,ppn", [(2, 1), (6, 3), (11, 4), (33, 8)])
def test_cascade_same_bits_on_every_rank(p, ppn):
    dt = dtypes.BY_NAME["float64"]
    rng = np.random.default_rng(p)
    for count in (5, 40000):  # recursive doubling across nodes, then the ring (>= 64 KiB shards)
        inputs = [rng.standard_normal(count) for _ in range(p)]
        outs, _ = run_allreduce("cascade", inputs, dt, ppn=ppn)
        assert_allreduced(outs, outs[0], f"cascade p={p} count={count}")
        np.testing.assert_allclose(outs[0], np.sum(inputs, axis=0), rtol=1e-10)


def inter_node_traffic(monkeypatch, name, p, node_size, count, **knobs):
    """Per rank (messages, bytes) sent to other nodes, simulated."""
    monkeypatch.setattr(counting, "_Network", _Recorder)
    _Recorder.log = []
    dt = dtypes.BY_NAME["float32"]
    outs, _ = run_allreduce(name, [np.ones(count, np.float32)] * p, dt, **knobs)
    assert_allreduced(outs, np.full(count, p, np.float32), name)
    msgs, nbytes = [0] * p, [0] * p
    for src, dst, n in _Recorder.log:
        if src // node_size != dst // node_size:
            msgs[src] += 1
            nbytes[src] += n
    return msgs, nbytes


@pytest.mark.parametrize("nodes,ppn", [(2, 2), (4, 4), (3, 8)])
def test_cascade_spreads_inter_node_bytes(monkeypatch, nodes, ppn):
    # Every rank sends 2 (N-1)/N n/L bytes to other nodes (the cross ring of
    # its shard): 2 (N-1)/N n per node, spread over its L ranks, where a flat
    # ring sends 2 (p-1)/p n through the one rank at the node's boundary.
    p, count = nodes * ppn, nodes * ppn * 2048  # divisible: equal shards and ring blocks
    msgs, nbytes = inter_node_traffic(monkeypatch, "cascade", p, ppn, count, ppn=ppn, cross="ring")
    per_rank = 2 * (nodes - 1) * (count * 4 // ppn) // nodes
    assert nbytes == [per_rank] * p
    assert msgs == [2 * (nodes - 1)] * p
    ring_msgs, ring_bytes = inter_node_traffic(monkeypatch, "ring", p, ppn, count)
    for m in range(nodes):
        node = slice(m * ppn, (m + 1) * ppn)
        assert sum(nbytes[node]) == 2 * (nodes - 1) * count * 4 // nodes
        assert sum(ring_bytes[node]) == max(ring_bytes[node]) == 2 * (p - 1) * count * 4 // p
    assert max(msgs) < max(ring_msgs) or nodes * ppn <= 4


# ---- heterogeneity-aware ring ------------------------------------------------------------

def _weights(p, seed):
    rng = np.random.default_rng(seed)
    return [float(w) for w in rng.choice([1.0, 2.5, 11.0], p)]


@pytest.mark.parametrize("p", range(1, 34))
def test_hetero_ring_every_p(p):
    dt = dtypes.BY_NAME["float32"]
    for weights in (None, [1] * p, _weights(p, p), [10] + [1] * (p - 1)):
        for count in awkward_counts(p):
            inputs = inputs_for(p, count, dt, "sum", p * 100 + count)
            outs, _ = run_allreduce("hetero_ring", inputs, dt, weights=weights, out_of_place=count % 2 == 1)
            assert_allreduced(outs, expected(inputs, dt, "sum"), f"hetero_ring {weights} p={p} count={count}")


@pytest.mark.parametrize("p", [2, 3, 7])
@pytest.mark.parametrize("segment_bytes", [4, 24, None])
def test_hetero_ring_segments(p, segment_bytes):
    dt = dtypes.BY_NAME["int32"]
    knobs = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
    for count in (p, 3 * p + 1, 200):
        inputs = inputs_for(p, count, dt, "sum", count)
        outs, _ = run_allreduce("hetero_ring", inputs, dt, weights=_weights(p, count), **knobs)
        assert_allreduced(outs, expected(inputs, dt, "sum"), f"hetero_ring p={p} count={count}")


@pytest.mark.parametrize("op,dtype", list(valid_pairs()))
def test_hetero_ring_every_op_dtype(op, dtype):
    dt = dtypes.BY_NAME[dtype]
    for p in (4, 7):
        inputs = inputs_for(p, 29, dt, op, p)
        outs, _ = run_allreduce("hetero_ring", inputs, dt, op, weights=[3] + [1] * (p - 1))
        assert_allreduced(outs, expected(inputs, dt, op), f"hetero_ring {op} {dtype} p={p}")


@pytest.mark.parametrize("p", [2, 5, 16])
def test_hetero_ring_same_bits_on_every_rank(p):
    dt = dtypes.BY_NAME["float64"]
    rng = np.random.default_rng(p)
    inputs = [rng.standard_normal(1000) for _ in range(p)]
    outs, _ = run_allreduce("hetero_ring", inputs, dt, weights=_weights(p, 1))
    assert_allreduced(outs, outs[0], f"hetero_ring p={p}")
    np.testing.assert_allclose(outs[0], np.sum(inputs, axis=0), rtol=1e-10)


@pytest.mark.parametrize("p", [2, 3, 6, 9])
def test_hetero_ring_equal_weights_is_the_ring(monkeypatch, p):
    runs = []
    for name, knobs in (("ring", {}), ("hetero_ring", {}), ("hetero_ring", {"weights": [2.0] * p})):
        monkeypatch.setattr(counting, "_Network", _Recorder)
        _Recorder.log = []
        inputs = [np.arange(50, dtype=np.int32) + r for r in range(p)]
        run_allreduce(name, inputs, dtypes.BY_NAME["int32"], **knobs)
        runs.append(list(_Recorder.log))
    assert runs[0] == runs[1] == runs[2]


def test_weighted_bounds():
    from mpicoll.algorithms.common import block_bounds
    from mpicoll.algorithms.hetero_ring import weighted_bounds

    assert weighted_bounds(10, [1, 1, 1]) == block_bounds(10, 3)
    assert weighted_bounds(10, [3, 1, 1]) == [(0, 6), (6, 8), (8, 10)]
    assert weighted_bounds(0, [3, 1]) == [(0, 0), (0, 0)]
    b = weighted_bounds(1000, [1, 11, 11, 1])
    assert [y - x for x, y in b] == [41, 459, 458, 42]  # cuts at floor(1000 * 1/24, 12/24, 23/24)


def test_weights_for_links():
    from mpicoll.algorithms.hetero_ring import weights_for_links

    # Noise within half of the median link: equal weights, the plain ring.
    assert weights_for_links([1.0, 1.3, 0.9, 1.1]) == [2.0] * 4
    assert weights_for_links([0.01, 1.0, 1.0, 1.1, 0.9]) == [2.0] * 5  # one link timed too fast
    # Link 1 (rank 1 -> 2) ten times slower: blocks 1 and 2 are the long ones.
    assert weights_for_links([1.0, 10.0, 1.0, 1.0]) == [2.0, 11.0, 11.0, 2.0]
    with pytest.raises(ValueError, match="positive"):
        weights_for_links([0.0, 1.0])


def test_hetero_ring_relieves_the_slow_link(monkeypatch):
    # The bytes through the slow link (rank 1 -> 2) drop from 2 (p-1)/p n
    # to 2 n - b_1 - b_2; the others carry more, as the weights intend.
    # (inter_node_traffic with one rank per node counts every message.)
    from mpicoll.algorithms.hetero_ring import weighted_bounds, weights_for_links

    p, count = 4, 1 << 14
    w = weights_for_links([1.0, 10.0, 1.0, 1.0])
    plain = inter_node_traffic(monkeypatch, "ring", p, 1, count)[1]
    aware = inter_node_traffic(monkeypatch, "hetero_ring", p, 1, count, weights=w)[1]
    assert plain == [2 * (p - 1) * count * 4 // p] * p
    b = [y - x for x, y in weighted_bounds(count, w)]
    assert aware == [(2 * count - b[r] - b[(r + 1) % p]) * 4 for r in range(p)]
    assert aware[1] < 0.8 * plain[1]  # 2 n - 22/26 n against 2 n - 2/4 n


@pytest.mark.parametrize("weights", [[1, 2], [1, 1, 0], [1, -1, 1], [1, float("nan"), 1], "fast", 3, [True] * 3])
def test_hetero_ring_bad_weights(weights):
    dt = dtypes.BY_NAME["int32"]
    with pytest.raises(ValueError, match="weights"):
        run_allreduce("hetero_ring", [np.ones(5, np.int32)] * 3, dt, weights=weights)


def test_hetero_ring_measure_needs_prepare():
    dt = dtypes.BY_NAME["int32"]
    with pytest.raises(RuntimeError, match="prepare"):
        run_allreduce("hetero_ring", [np.ones(5, np.int32)] * 3, dt, weights="measure")


# ---- the cost model's terms equal the simulated counts --------------------------------

SEED_KNOBS = {
    "knomial": [{}, {"radix": 2}, {"radix": 3}, {"radix": 8}],
    "cascade": [{"ppn": 1}, {"ppn": 2}, {"ppn": 3}, {"ppn": 4, "cross": "ring"},
                {"ppn": 4, "cross": "recursive_doubling"}],
    "hetero_ring": [{}, {"weights": "ramp"}, {"weights": "one slow"}],
}
ITEMS = {1: "int8", 2: "int16", 4: "float32", 8: "float64"}


def _concrete(knobs, p):
    w = knobs.get("weights")
    if w == "ramp":
        return dict(knobs, weights=[1 + r for r in range(p)])
    if w == "one slow":
        return dict(knobs, weights=[11.0 if r in (0, 1) else 2.0 for r in range(p)])
    return knobs


@pytest.mark.parametrize("name", sorted(SEED_KNOBS))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17])
def test_model_terms_equal_simulated_counts(name, p):
    from mpicoll import model

    for knobs in SEED_KNOBS[name]:
        knobs = _concrete(knobs, p)
        for count in sorted({0, 1, p - 1, p, p + 1, 2 * p + 1, 31, 4097, 40000}):
            for itemsize in ((1, 4, 8) if count < 5000 else (4,)):
                dt = dtypes.BY_NAME[ITEMS[itemsize]]
                inputs = inputs_for(p, count, dt, "sum", count)
                outs, stats = run_allreduce(name, inputs, dt, **knobs)
                assert_allreduced(outs, expected(inputs, dt, "sum"), f"{name} {knobs} p={p} count={count}")
                want = (max(s.messages for s in stats), max(s.bytes_sent for s in stats),
                        max(s.bytes_reduced for s in stats))
                got = tuple(model.terms(name, p, count * itemsize, itemsize, **knobs))
                assert got == want, f"{name} {knobs} p={p} count={count} itemsize={itemsize}: model {got}, sim {want}"


def test_model_lists_the_new_algorithms(capsys, tmp_path):
    from mpicoll import model, model_cli, profile

    prof = str(tmp_path / "profile.json")
    params = model.Params(1e-5, 2e-6, 1e-10, 1e-10)
    profile.save(profile.Profile([], model=model.Model({"p2p": params, "mpi": params}, {})), prof)
    assert model_cli.main(["--profile", prof, "--p", "64", "--sizes", "8,16777216"]) == 0
    out = capsys.readouterr().out
    for name in ("knomial", "cascade", "hetero_ring"):
        assert name in out, out
    with pytest.raises(ValueError, match="ppn"):
        model.terms("cascade", 8, 64)


# ---- under MPI: blocking, nonblocking, persistent ------------------------------------

# (algorithm, knobs) pairs run through the public API under mpiexec.
MPI_CASES = [("knomial", {}), ("knomial", {"radix": 2}), ("knomial", {"radix": 3}),
             ("cascade", {}), ("cascade", {"ppn": 2}), ("cascade", {"ppn": 2, "cross": "ring"}),
             ("hetero_ring", {}), ("hetero_ring", {"weights": "measure"}), ("hetero_ring", {"weights": "ramp"})]


def _mpi_inputs(p, n, dtype, op):
    dt = dtypes.BY_NAME[dtype]
    return inputs_for(p, n, dt, op, 1000 + n), dt


def _run_mpi(comm, name, knobs, x, dt, op, mode):
    from mpicoll import plan as _plan
    from mpicoll.persistent import Persistent

    if knobs.get("weights") == "ramp":  # uneven blocks, the same list on every rank
        knobs = dict(knobs, weights=[1 + 2 * r for r in range(comm.size)])

    kw = dict(op=op, comm=comm, algorithm=name, dtype=dt.name if dt.name in ("float16", "bfloat16") else None)
    if mode == "blocking":
        return _plan.allreduce(x, knobs=knobs, **kw).run()
    if mode == "nonblocking":
        return _plan.allreduce(x, knobs=knobs, nonblocking=True, **kw).start().wait()
    req = Persistent(_plan.allreduce(x, knobs=knobs, nonblocking=True, **kw))
    try:
        out = None
        for _ in range(2):  # twice: a persistent request runs again with the bound buffers
            req.start()
            out = req.wait()
        return out
    finally:
        req.free()


@pytest.mark.mpi
@pytest.mark.parametrize("name,knobs", MPI_CASES)
@pytest.mark.parametrize("mode", ["blocking", "nonblocking", "persistent"])
def test_mpi_allreduce(name, knobs, mode):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    p = comm.size
    for dtype, op in (("float32", "sum"), ("int64", "max"), ("bfloat16", "sum"), ("uint8", "bxor")):
        for n in sorted({0, 1, max(p - 1, 1), 2 * p + 1, 1000}):
            inputs, dt = _mpi_inputs(p, n, dtype, op)
            want = expected(inputs, dt, op)
            got = _run_mpi(comm, name, knobs, inputs[comm.rank].copy(), dt, op, mode)
            got = np.asarray(got).view(want.dtype).reshape(-1)
            assert got.tobytes() == want.tobytes(), f"{name} {knobs} {mode} {dtype} {op} n={n}"
            every = comm.allgather(got.tobytes())
            assert all(b == every[0] for b in every)


@pytest.mark.mpi
def test_mpi_public_api_and_rooted():
    """The public doors with the default knobs, and k-nomial reduce/bcast at every root."""
    from mpi4py import MPI

    import mpicoll

    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    x = np.arange(11, dtype=np.float64) + rank
    want = np.arange(11) * p + p * (p - 1) / 2
    for name in sorted({c[0] for c in MPI_CASES}):
        np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm, algorithm=name), want)
        np.testing.assert_array_equal(mpicoll.iallreduce(x, comm=comm, algorithm=name).wait(), want)
        req = mpicoll.allreduce_init(x, comm=comm, algorithm=name)
        np.testing.assert_array_equal(req(), want)
        req.free()
    for root in range(p):
        got = mpicoll.reduce(x, root=root, comm=comm, algorithm="knomial")
        if rank == root:
            np.testing.assert_array_equal(got, want)
        else:
            assert got is None
        y = np.arange(7, dtype=np.int32) * (rank + 1)
        mpicoll.bcast(y, root=root, comm=comm, algorithm="knomial")
        np.testing.assert_array_equal(y, np.arange(7) * (root + 1))
        y = np.zeros(7, np.int32) if rank != root else np.arange(7, dtype=np.int32)
        mpicoll.ibcast(y, root=root, comm=comm, algorithm="knomial").wait()
        np.testing.assert_array_equal(y, np.arange(7))
