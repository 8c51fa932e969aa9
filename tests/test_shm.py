"""Shared-memory and hierarchical all-reduce: emulated multi-node layouts,
reproducible=True, and the window's life cycle. Run under mpiexec.

Multi-node layouts are emulated on one machine with MPICOLL_FAKE_NODE_SIZE
(nodes of that many consecutive ranks); tests/test_testbed.py runs the same
code across real network namespaces."""
from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import IdenticalEverywhere, assert_identical_everywhere, exact_values, np_dtype, reference
from mpicoll import dtypes, ops
from mpicoll import shmwindow
from mpicoll.algorithms import get, shm
from mpicoll.commstate import state
from mpicoll.kernels import Reduction
from mpicoll.node import ENV_FAKE_NODE_SIZE, node_info

pytestmark = pytest.mark.mpi

ALGORITHMS = mpicoll.algorithms("allreduce")


@pytest.fixture(params=[1, 2, 3], ids=lambda k: f"node{k}")
def fake_comm(request, monkeypatch):
    """A fresh communicator whose "nodes" hold ``k`` consecutive ranks."""
    monkeypatch.setenv(ENV_FAKE_NODE_SIZE, str(request.param))
    comm = MPI.COMM_WORLD.Dup()
    yield comm
    comm.Free()


def test_fake_layout_is_seen(fake_comm):
    info = node_info(state(fake_comm))
    k, p = int(os.environ[ENV_FAKE_NODE_SIZE]), fake_comm.size
    assert info.nodes == -(-p // k)
    assert info.local_size == min(k, p - (fake_comm.rank // k) * k)
    assert info.uniform == (p % k == 0 or p < k)
    assert info.node_ranks[info.node] == list(range(info.node * k, min(p, info.node * k + k)))


@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])
def test_multinode_layouts(fake_comm, algorithm):
    comm = fake_comm
    p, rank = comm.size, comm.rank
    same = IdenticalEverywhere(comm)
    for name, op in (("float32", "sum"), ("float16", "sum"), ("int32", "prod"), ("float64", "max")):
        for n in ((0, 1, p + 1, 1000, 70001) if name == "float32" else (p + 1, 1000)):
            inputs = [exact_values(name, op, n, 500 + r) for r in range(p)]
            want = reference(inputs, op, p)
            for in_place in (False, True):
                x = inputs[rank].copy()
                got = mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm, out=x if in_place else None)
                what = f"{algorithm} {op} {name} n={n} in_place={in_place}"
                np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=what)
                same.add(got, what=what)
    same.check()
    # several chunks per call, through the whole pipeline (small chunks)
    st = state(comm)
    x = exact_values("float32", "sum", 30001, 9 + rank)
    want = reference([exact_values("float32", "sum", 30001, 9 + r) for r in range(p)], "sum", p)
    buf = x.copy()
    red = Reduction(ops.resolve("sum"), dtypes.BY_NAME["float32"])
    get("allreduce", algorithm if algorithm != "auto" else "shm")(st, buf, red, chunk_bytes=4096)
    np.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize("fake", [None, 1, 2, 3])
@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16"])
def test_reproducible_matches_serial_order(monkeypatch, fake, name):
    """Random floats (rounding depends on the order): reproducible=True gives
    the serial rank-ordered bits, whatever algorithm is asked for."""
    if fake is not None:
        monkeypatch.setenv(ENV_FAKE_NODE_SIZE, str(fake))
    comm = MPI.COMM_WORLD.Dup()
    p, rank = comm.size, comm.rank
    dt = np_dtype(name)
    for n in (0, 3, 1001, 65537):
        inputs = [(np.random.default_rng(40 + r).standard_normal(n) * 10.0 ** (r % 5)).astype(dt) for r in range(p)]
        for op in ("sum", "prod", "avg"):
            want = reference(inputs, op, p)
            for algorithm in (ALGORITHMS if name == "float32" and op == "sum" else ["auto"]):
                got = mpicoll.allreduce(inputs[rank], op=op, comm=comm, algorithm=algorithm, reproducible=True)
                assert got.tobytes() == want.tobytes(), f"{algorithm} {op} n={n}"
            out = inputs[rank].copy()
            mpicoll.allreduce(out, op=op, comm=comm, out=out, reproducible=True)
            assert out.tobytes() == want.tobytes()
    comm.Free()


def test_reproducible_bad_argument():
    with pytest.raises(TypeError, match="reproducible"):
        mpicoll.allreduce(np.ones(3), reproducible="yes")


def test_window_reuse_growth_and_free():
    if MPI.COMM_WORLD.size == 1:
        pytest.skip("allreduce on one rank runs no algorithm")
    comm = MPI.COMM_WORLD.Dup()
    p = comm.size
    x = np.ones(1000, np.float32)
    assert (mpicoll.allreduce(x, comm=comm, algorithm="shm") == p).all()
    st = state(comm)
    w = st.extra["shm"]
    first = w.slot_bytes
    assert (mpicoll.allreduce(x[:10], comm=comm, algorithm="shm") == p).all()
    assert st.extra["shm"] is w, "a smaller message reuses the window"
    big = np.ones((first // 4) * 3, np.float32)
    assert (mpicoll.allreduce(big, comm=comm, algorithm="shm") == p).all()
    grown = st.extra["shm"]
    assert grown is not w and grown.slot_bytes >= big.nbytes
    assert w.win == MPI.WIN_NULL, "the old window is freed when it grows"
    # Long messages are chunked: the window never exceeds the per-rank bound.
    assert shm.chunk_elems(1 << 40, 4, 1 << 40) * 4 * 2 <= shmwindow.MAX_WINDOW_BYTES - (64 << 10)
    comm.Free()
    assert grown.win == MPI.WIN_NULL, "freeing the communicator frees the window"


def test_one_node_shm_is_in_rank_order():
    """On one node shm itself reduces in rank order: no reproducible flag needed."""
    comm = MPI.COMM_WORLD
    if node_info(state(comm)).nodes != 1:
        pytest.skip("needs one node")
    p, rank = comm.size, comm.rank
    inputs = [np.random.default_rng(7 + r).standard_normal(4099).astype(np.float32) * (r + 1) for r in range(p)]
    got = mpicoll.allreduce(inputs[rank], comm=comm, algorithm="shm")
    assert got.tobytes() == reference(inputs, "sum", p).tobytes()


@pytest.mark.parametrize("sync", ["flags", "barrier"])
def test_both_sync_modes(sync):
    comm = MPI.COMM_WORLD
    st = state(comm)
    p, rank = comm.size, comm.rank
    red = Reduction(ops.resolve("sum"), dtypes.BY_NAME["int32"])
    inputs = [exact_values("int32", "sum", 20001, 60 + r) for r in range(p)]
    for chunk in (4096, 1 << 20):
        buf = np.empty_like(inputs[rank])
        get("allreduce", "shm")(st, buf, red, inputs[rank], chunk_bytes=chunk, sync=sync)
        np.testing.assert_array_equal(buf, reference(inputs, "sum", p))
    w = st.extra["shm" if sync == shm.SYNC else f"shm-{sync}"]
    assert w.sync_mode == sync
    # the header, two slots, never more than the bound
    assert w.header + 2 * w.slot_bytes <= shmwindow.MAX_WINDOW_BYTES


@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])
def test_cross_algorithm_decided_once_per_call(fake_comm, algorithm, monkeypatch):
    """Across nodes the algorithm between nodes is decided in prepare, once
    per call (not once per chunk inside the schedule), and a replay of the
    kept plan reuses it; a ``cross`` knob given by the caller is run as
    given; a node-level one is refused on every rank."""
    from mpicoll import plan
    from mpicoll.algorithms import hierarchical

    def run(x, **kw):  # knobs come from tuning profiles, or through the plan layer as here
        return plan.allreduce(x, **kw).run()

    comm = fake_comm
    p, rank = comm.size, comm.rank
    nodes = node_info(state(comm)).nodes
    asked = []
    real = hierarchical.cross_choice
    monkeypatch.setattr(hierarchical, "cross_choice", lambda *a, **k: asked.append(a) or real(*a, **k))
    inputs = [exact_values("float32", "sum", 30001, 40 + r) for r in range(p)]
    want = reference(inputs, "sum", p)
    knobs = {"chunk_bytes": 4096}  # 30 chunks
    got = run(inputs[rank], comm=comm, algorithm=algorithm, knobs=knobs)
    np.testing.assert_array_equal(got, want)
    once = 1 if nodes > 1 else 0
    assert len(asked) == once, asked
    for _ in range(2):  # the door keeps the plan: the second call replays its decision
        got = mpicoll.allreduce(inputs[rank], comm=comm, algorithm=algorithm)
        np.testing.assert_array_equal(got, want)
    assert len(asked) == 2 * once, f"the kept plan decides again: {asked}"
    for cross in ("ring", "recursive_doubling", "mpi"):
        got = run(inputs[rank], comm=comm, algorithm=algorithm, knobs={**knobs, "cross": cross})
        np.testing.assert_array_equal(got, want, err_msg=cross)
        assert_identical_everywhere(comm, got)
    assert len(asked) == 2 * once, "a given cross is not decided again"
    # Checked at every p, one rank included (which runs no algorithm), as
    # a value the call gives, before any message (registry check_values).
    for bad in ("shm", "hierarchical", "cascade", "no_such"):
        with pytest.raises(ValueError, match="cross"):
            run(inputs[rank], comm=comm, algorithm=algorithm, knobs={"cross": bad})
    np.testing.assert_array_equal(mpicoll.allreduce(inputs[rank], comm=comm, algorithm=algorithm), want)


@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])
def test_multinode_nonblocking_outstanding(fake_comm, algorithm):
    """Several nonblocking shm/hierarchical all-reduces outstanding on one
    communicator take turns on its window in start order (the same on every
    rank), completed in a rank-dependent order; a blocking call after them
    waits its turn too; reproducible=True runs nonblocking as well."""
    comm = fake_comm
    p, rank = comm.size, comm.rank
    inputs = {n: [exact_values("float32", "sum", n, 70 + n + r) for r in range(p)] for n in (1000, 70001, 5)}
    reqs = [(n, mpicoll.iallreduce(inputs[n][rank].copy(), comm=comm, algorithm=algorithm)) for n in inputs]
    reqs.append((1000, mpicoll.iallreduce(inputs[1000][rank].copy(), comm=comm, reproducible=True)))
    blocking = mpicoll.allreduce(inputs[5][rank], comm=comm, algorithm=algorithm)
    np.testing.assert_array_equal(blocking, reference(inputs[5], "sum", p))
    for i in np.random.default_rng(rank).permutation(len(reqs)):
        n, req = reqs[i]
        np.testing.assert_array_equal(req.wait(), reference(inputs[n], "sum", p), err_msg=f"{algorithm} n={n}")
    for n, req in reqs:  # in the same order everywhere: assert_identical_everywhere is collective
        assert_identical_everywhere(comm, req.wait())


def test_small_auto_calls_make_no_node_communicators():
    """The node layout for "auto" comes from the state's one allgather; the
    node and cross communicators are made only when shm/hierarchical runs."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        for _ in range(3):
            mpicoll.allreduce(np.ones(2, np.float32), comm=comm)
            mpicoll.iallreduce(np.ones(2, np.float32), comm=comm).wait()
        st = state(comm)
        assert "node" not in st.extra and "nonblocking" not in st.extra
        mpicoll.allreduce(np.ones(1000, np.float32), comm=comm, algorithm="shm")
        assert ("node" in st.extra) == (comm.size > 1)  # one rank runs no algorithm at all
    finally:
        comm.Free()


def test_flag_test_sees_a_peer_only_after_it_publishes():
    """The nonblocking test of a flag sync: False until the last rank of the
    node has set its counter, True after, with the data it wrote before
    visible (acquire loads of counters set by other processes).

    The ranks that posted first test before the last rank has: a test()
    that looked at the rank's own counter (the flag it just set) instead of
    every counter of the node would say True there. The verdicts are
    compared together after the last collective: a rank failing alone
    would leave the others waiting in a barrier (a hang, not a failure)."""
    import time

    comm = MPI.COMM_WORLD.Dup()
    try:
        st = state(comm)
        info = node_info(st)
        if info.local_size < 2:
            pytest.skip("needs two ranks on a node")
        w = shmwindow.window(st, info, "flags")
        me, last = info.local_rank, info.local_size - 1
        sync = shmwindow._FlagSync(w)
        if me != last:
            sync.post()
        comm.Barrier()
        before = sync.test() if me != last else None  # (the last rank has not posted: nothing to test)
        comm.Barrier()  # every rank has tested before the last one publishes
        if me == last:
            w.slot(me, 0).view(np.int64)[:1024] = np.arange(1024) + 7
            sync.post()
        waited = sync.wait(time.monotonic() + 60)
        after = sync.test()
        seen = bool((w.slot(last, 0).view(np.int64)[:1024] == np.arange(1024) + 7).all())
        # (A collective after the reads: no rank frees the window while another reads it.)
        verdicts = comm.allgather((me, before, waited, after, seen))
    finally:
        comm.Free()
    assert [v[1] for v in verdicts if v[0] != last] == [False] * last, \
        f"a test() saw a counter the last rank had not set (local rank, before, wait, after, data): {verdicts}"
    assert all(v[2] and v[3] and v[4] for v in verdicts), f"wait/test/data after the last post: {verdicts}"


@pytest.mark.parametrize("nonblocking", [False, True], ids=["blocking", "nonblocking"])
def test_mismatched_counts_raise_on_every_rank(nonblocking):
    """The last rank passes one element more, or a dtype of the same byte
    size: every rank raises MismatchError (nothing partly reduced), and the
    communicator's window works for the next call. tests/test_shm_safety.py
    runs the cases that would grow the window, in jobs of their own."""
    comm = MPI.COMM_WORLD.Dup()
    p, rank = comm.size, comm.rank
    if node_info(state(comm)).nodes != 1 or p == 1:
        comm.Free()
        pytest.skip("needs one node and two ranks")
    odd = rank == p - 1
    try:
        for x, field in ((np.ones(1001 if odd else 1000, np.float32), "count"),
                         (np.ones(500, np.float64) if odd else np.ones(1000, np.float32), "dtype")):
            with pytest.raises(mpicoll.MismatchError) as info:
                if nonblocking:
                    mpicoll.iallreduce(x, comm=comm, algorithm="shm", timeout=60).wait()
                else:
                    mpicoll.allreduce(x, comm=comm, algorithm="shm", timeout=60)
            assert info.value.field == field
            if field == "count":
                assert info.value.values == {4000: list(range(p - 1)), 4004: [p - 1]}
            got = mpicoll.allreduce(np.full(1000, rank + 1.0, np.float32), comm=comm, algorithm="shm")
            np.testing.assert_array_equal(got, np.full(1000, p * (p + 1) / 2, np.float32))
    finally:
        comm.Free()


def _kept_shm(comm, algorithm="shm"):
    return [k for k in state(comm).plans._d.values() if getattr(k, "name", None) == algorithm]


@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])  # (on one node hierarchical is shm)
def test_direct_calls_meet_schedule_calls(algorithm):
    """A kept shm call of one chunk runs in C (shm.program, the executor's
    shared-memory step), blocking, nonblocking or persistent, the others'
    through the schedule: ranks of both kinds meet, with the bits of the
    serial rank-ordered reduction on every rank, then with a MismatchError
    on every rank when the counts differ (the odd rank's call misses its
    kept entry and runs the schedule), and the window works afterwards."""
    comm = MPI.COMM_WORLD.Dup()
    p, rank = comm.size, comm.rank
    if node_info(state(comm)).nodes != 1 or p == 1:
        comm.Free()
        pytest.skip("needs one node and two ranks")
    try:
        same, wrong, runners = IdenticalEverywhere(comm), [], []
        for n, dtype, op in ((1, "float32", "sum"), (p + 1, "float64", "max"), (4099, "float32", "sum"),
                             (3000, "float16", "sum"), (20001, "int32", "bxor")):
            inputs = [exact_values(dtype, op, n, 11 + r) for r in range(p)]
            if dtype == "float32":  # values whose sum depends on the order
                inputs = [np.random.default_rng(7 + r).standard_normal(n).astype(np.float32) * (r + 1)
                          for r in range(p)]
            want = reference(inputs, op, p).tobytes()
            for turn in range(p + 1):
                # Rank `turn` forgets its kept entries: its calls run the schedule
                # (the last turn: every rank's hit).
                if turn == rank:
                    state(comm).plans._d.clear()
                x = inputs[rank].copy()
                got = [mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm)]
                y = x.copy()
                got.append(mpicoll.allreduce(y, op=op, out=y, comm=comm, algorithm=algorithm))
                # nonblocking: one alone (its wait finishes it in C), then three
                # outstanding (the first in C, the others queued behind it)
                got.append(mpicoll.iallreduce(x, op=op, comm=comm, algorithm=algorithm).wait())
                reqs = [mpicoll.iallreduce(x, op=op, comm=comm, algorithm=algorithm) for _ in range(3)]
                got += [q.wait() for q in reqs[::-1]]
                # persistent: every start through the same C path
                pr = mpicoll.allreduce_init(x.copy(), op=op, comm=comm, algorithm=algorithm)
                got += [pr().copy(), pr().copy()]
                runners.append(pr._exe)
                pr.free()
                # (collected, not asserted here: a rank that stopped would leave the others waiting)
                wrong += [(n, dtype, op, turn) for g in got if g.tobytes() != want]
                same.add(*got, what=f"{n} {dtype} {op} turn {turn}")
            runners += [k.exe for k in _kept_shm(comm, algorithm) if k.exe is not None]
        same.check()
        assert comm.allgather(wrong) == [[]] * p
        # Every kept call that was hit again has its program, and some were.
        assert comm.allreduce(int(bool(runners) and all(r and r.probe for r in runners)), op=MPI.MIN) == 1
        x = np.ones(1000, np.float32)
        for _ in range(2):
            mpicoll.allreduce(x, comm=comm, algorithm=algorithm)
        odd = rank == p - 1
        for _ in range(2):
            mpicoll.iallreduce(x, comm=comm, algorithm=algorithm).wait()
        for door in (mpicoll.allreduce, lambda *a, **k: mpicoll.iallreduce(*a, **k).wait()):
            with pytest.raises(mpicoll.MismatchError) as info:
                door(np.ones(1001 if odd else 1000, np.float32), comm=comm, algorithm=algorithm)
            assert info.value.field == "count"
            assert info.value.values == {4000: list(range(p - 1)), 4004: [p - 1]}
        for _ in range(2):
            got = mpicoll.allreduce(np.full(1000, rank + 1.0, np.float32), comm=comm, algorithm=algorithm)
            np.testing.assert_array_equal(got, np.full(1000, p * (p + 1) / 2, np.float32))
    finally:
        comm.Free()


def test_explain_tells_blocking_from_nonblocking():
    """explain() answers for either form, and the calls follow it (their
    kept entries name it); on one node of 2 ranks an 8 KiB blocking call
    takes shm's C path while a nonblocking one keeps the library's
    algorithm (select.SHM_DIRECT_RANGE and its nonblocking twin)."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        st = state(comm)
        k = comm.size
        if node_info(st).nodes != 1 or k not in (2, 3, 4):
            pytest.skip("one node of 2-4 ranks")
        nbytes = 8 << 10
        blocking = mpicoll.explain(nbytes, comm=comm)
        nonblocking = mpicoll.explain(nbytes, comm=comm, nonblocking=True)
        if k == 2:
            assert (blocking.name, nonblocking.name) == ("shm", "mpi"), (blocking, nonblocking)
        x = np.full(nbytes // 4, comm.rank + 1.0, np.float32)
        want = np.full(nbytes // 4, k * (k + 1) / 2, np.float32)
        np.testing.assert_array_equal(mpicoll.allreduce(x, comm=comm), want)
        np.testing.assert_array_equal(mpicoll.iallreduce(x, comm=comm).wait(), want)
        names = sorted((key[0], kept.name) for key, kept in st.plans._d.items())
        assert names == [("allreduce", blocking.name), ("iallreduce", nonblocking.name)], names
    finally:
        comm.Free()
