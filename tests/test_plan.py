"""The plan layer: every front door accepts and rejects the same things,
every algorithm runs blocking, nonblocking and persistent, decisions agree
across ranks, and the layering holds (no import circles, importable
subpackages)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import profile

from conftest import IdenticalEverywhere, assert_identical_everywhere, exact_values, reference

ALGS = mpicoll.algorithms("allreduce")[1:]


# ---- serial ---------------------------------------------------------------------

def test_algorithm_modules_import_and_names_still_list():
    import importlib

    mod = importlib.import_module("mpicoll.algorithms.ring")
    assert mod.__name__ == "mpicoll.algorithms.ring"
    assert mpicoll.algorithms("allreduce")[0] == "auto" and "ring" in mpicoll.algorithms()
    assert mpicoll.algorithms is sys.modules["mpicoll.algorithms"]
    with pytest.raises(ValueError, match="unknown collective"):
        mpicoll.algorithms("scan")


@pytest.mark.parametrize("module", ["mpicoll.select", "mpicoll.profile", "mpicoll.model", "mpicoll.node",
                                    "mpicoll.algorithms.shm", "mpicoll.algorithms.hierarchical", "mpicoll.plan",
                                    "mpicoll.shmwindow"])
def test_each_module_imports_first(module):
    """Each module can be the first one imported (a fresh interpreter). The
    import graph itself - circles, layers - is tests/test_import_graph.py."""
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_profile_knob_is_checked_at_load(tmp_path):
    bad = profile.Profile([profile.Rule(2, 2, 0, None, "tree", 4096)])
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(bad.to_json()))
    with pytest.raises(ValueError, match=r"tree.*no knob 'segment_bytes'.*\(its knobs: none\)"):
        profile.load(str(f))
    good = profile.Profile([profile.Rule(2, 2, 0, None, "ring", 4096)])
    f.write_text(json.dumps(good.to_json()))
    assert profile.load(str(f)).rules[0].segment_bytes == 4096


def test_registry_declares_knobs():
    from mpicoll.algorithms import get

    assert get("allreduce", "ring").knobs == ("segment_bytes",)
    assert get("allreduce", "tree").knobs == ()
    with pytest.raises(ValueError, match="no knob"):
        get("allreduce", "tree").check_knobs({"segment_bytes": 1})


# ---- MPI ------------------------------------------------------------------------

def _doors():
    """Every door that takes allreduce's arguments, as f(x, **kw) -> result."""
    return {
        "allreduce": lambda x, **kw: mpicoll.allreduce(x, **kw),
        "iallreduce": lambda x, **kw: mpicoll.iallreduce(x, **kw).wait(),
        "allreduce_init": lambda x, **kw: mpicoll.allreduce_init(x, **kw)(),
    }


BAD = [
    (ValueError, dict(op="mean")),
    (ValueError, dict(algorithm="bogus")),
    (TypeError, dict(algorithm=3)),
    (TypeError, dict(op="band")),
    (ValueError, dict(out=np.empty(5, np.float32))),
    (TypeError, dict(out=np.empty(4, np.float64))),
    (TypeError, dict(comm="world")),
    (TypeError, dict(check="yes")),
    (TypeError, dict(timeout="soon")),
    (ValueError, dict(timeout=-1)),
    (TypeError, dict(reproducible=1)),
    (ValueError, dict(compression="zip")),
    (TypeError, dict(compression="fp16", x=np.ones(4, np.int32))),
    (ValueError, dict(compression="fp16", algorithm="ring")),
]


@pytest.mark.mpi
def test_every_door_rejects_alike_before_any_message():
    """Only rank 0 makes each mistake, through each door: every door must
    raise the same type with the same message, and none may have sent a
    message or taken a sequence number (the valid call after would then
    mismatch or hang under the test's timeout)."""
    comm = MPI.COMM_WORLD
    f = np.ones(4, np.float32)
    if comm.rank == 0:
        for exc, kw in BAD:
            kw = dict(kw)
            x = kw.pop("x", f)
            messages = {}
            for name, door in _doors().items():
                with pytest.raises(exc) as info:
                    door(x, **kw)
                messages[name] = str(info.value)
            assert len(set(messages.values())) == 1, messages
    for name, door in _doors().items():
        got = door(np.full(3, comm.rank + 1.0))
        assert (got == comm.size * (comm.size + 1) / 2).all(), name


@pytest.mark.mpi
def test_bad_environment_raises_alike(monkeypatch):
    comm = MPI.COMM_WORLD
    for var, value, match in (("MPICOLL_ALGORITHM", "nope", "MPICOLL_ALGORITHM"),
                              ("MPICOLL_CHECK", "maybe", "MPICOLL_CHECK"),
                              ("MPICOLL_TIMEOUT", "soon", "MPICOLL_TIMEOUT")):
        if comm.rank == 0:
            monkeypatch.setenv(var, value)
            for name, door in _doors().items():
                with pytest.raises(ValueError, match=match):
                    door(np.ones(3))
            with pytest.raises(ValueError, match=match):
                mpicoll.Comm(comm).Allreduce(np.ones(3), np.empty(3), MPI.SUM)
            monkeypatch.delenv(var)
        assert (mpicoll.allreduce(np.ones(3)) == comm.size).all()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGS)
def test_every_algorithm_blocking_nonblocking_persistent(algorithm):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    same = IdenticalEverywhere(comm)
    for name, op in (("float32", "sum"), ("int32", "bxor"), ("float16", "max"), ("float64", "avg")):
        for n in (0, 1, p - 1, p + 1, 1001):
            inputs = [exact_values(name, "sum" if op == "avg" else op, n, 7 * r + n) for r in range(p)]
            want = reference(inputs, op, p).astype(np.float64)
            x = inputs[rank].copy()
            got = [mpicoll.allreduce(x, op=op, algorithm=algorithm),
                   mpicoll.iallreduce(x, op=op, algorithm=algorithm).wait()]
            out = np.empty_like(x)
            req = mpicoll.allreduce_init(x, op=op, out=out, algorithm=algorithm)
            for _ in range(2):  # a persistent request runs again and again
                got.append(req().copy())
            req.start()
            got.append(req.wait().copy())
            req.free()
            for g in got:
                np.testing.assert_array_equal(g.astype(np.float64), want, err_msg=f"{algorithm} {name} {op} n={n}")
            same.add(*got, what=f"{algorithm} {name} {op} n={n}")
    same.check()


@pytest.mark.mpi
def test_persistent_reads_the_new_input_each_start():
    comm = MPI.COMM_WORLD
    x = np.zeros(10, np.float64)
    y = np.empty_like(x)
    for algorithm in ("mpi", "ring", "recursive_doubling"):
        req = mpicoll.allreduce_init(x, out=y, algorithm=algorithm)
        for k in range(3):
            x[...] = k + comm.rank
            req.start()
            assert req.wait() is y
            assert (y == k * comm.size + comm.size * (comm.size - 1) / 2).all()
        req.free()


@pytest.mark.mpi
def test_other_collectives_nonblocking_and_persistent():
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    x = np.arange(2 * p + 3, dtype=np.float64) + rank
    algs = {c: mpicoll.algorithms(c)[1:] for c in ("reduce_scatter", "allgather", "bcast", "reduce")}
    for a in algs["reduce_scatter"]:
        want = mpicoll.reduce_scatter(x, algorithm="mpi")
        np.testing.assert_array_equal(mpicoll.ireduce_scatter(x, algorithm=a).wait(), want)
        np.testing.assert_array_equal(mpicoll.reduce_scatter_init(x, algorithm=a)(), want)
    for a in algs["allgather"]:
        want = mpicoll.allgather(x, algorithm="mpi")
        np.testing.assert_array_equal(mpicoll.iallgather(x, algorithm=a).wait(), want)
        np.testing.assert_array_equal(mpicoll.allgather_init(x, algorithm=a)(), want)
    for a in algs["bcast"]:
        for root in {0, p - 1}:
            b = x.copy()
            mpicoll.ibcast(b, root, algorithm=a).wait()
            np.testing.assert_array_equal(b, np.arange(2 * p + 3, dtype=np.float64) + root)
            b = x.copy()
            mpicoll.bcast_init(b, root, algorithm=a)()
            np.testing.assert_array_equal(b, np.arange(2 * p + 3, dtype=np.float64) + root)
    for a in algs["reduce"]:
        root = p - 1
        got = mpicoll.ireduce(x, "max", root, algorithm=a).wait()
        got2 = mpicoll.reduce_init(x, "max", root, algorithm=a)()
        if rank == root:
            np.testing.assert_array_equal(got, x - rank + p - 1)
            np.testing.assert_array_equal(got2, x - rank + p - 1)
        else:
            assert got is None and got2 is None


@pytest.mark.mpi
def test_many_outstanding_different_collectives():
    comm = MPI.COMM_WORLD
    p = comm.size
    reqs = []
    for k in range(4):
        x = np.full(5000 + k, float(comm.rank + k))
        reqs.append(("ar", k, mpicoll.iallreduce(x, algorithm=ALGS[k % len(ALGS)])))
        reqs.append(("ag", k, mpicoll.iallgather(np.array([comm.rank, k]))))
    order = np.random.default_rng(comm.rank).permutation(len(reqs))
    for i in order:
        kind, k, req = reqs[i]
        got = req.wait()
        if kind == "ar":
            assert (got == p * (p - 1) / 2 + p * k).all()
        else:
            assert (got == np.array([[r, k] for r in range(p)])).all()


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["thread", "no-thread"])
def test_done_callbacks(mode):
    """Callbacks added to a pending request run once each, in the order they
    were added, on completion and before wait() returns, and see the
    request done; one added after completion runs at once.

    Registered on a request that is pending for certain: one rank (``late``)
    starts its all-reduce only after a barrier that the others enter once
    their callbacks are in, so on those ranks nothing - progress thread
    included - can complete the call before then. (The earlier form added
    one callback to a request that the progress thread could already have
    completed, at p = 1 always: which path it tested was a race, and a
    single pending callback cannot show an order.) Each rank late once
    (two rounds at most); verdicts compared after an allgather, so that a
    failing rank does not leave the others in a collective."""
    from mpicoll import engine

    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    was = engine._engine.enabled
    engine.set_progress_thread(mode == "thread")
    verdicts = []
    try:
        # The communicator's first call sets up its state collectively (a
        # duplicate): done here, so that the rounds' calls start alone.
        mpicoll.iallreduce(np.ones(100_000, np.float32), algorithm="ring").wait()
        for late in range(min(p, 2)):
            seen = []
            x = np.ones(100_000, np.float32)
            if rank == late:
                comm.Barrier()
            req = mpicoll.iallreduce(x, algorithm="ring")
            for name in ("first", "second", "third"):
                req.add_done_callback(lambda r, name=name: seen.append((name, r.done)))
            pending = not req.done
            if rank != late:
                comm.Barrier()
            got = req.wait()
            ran_before_return = list(seen)
            req.add_done_callback(lambda r: seen.append(("late", r.done)))  # already complete: at once
            verdicts.append((rank, late, pending, ran_before_return, seen, bool((got == p).all())))
    finally:
        engine.set_progress_thread(was)
    everyone = [v for vs in comm.allgather(verdicts) for v in vs]
    in_order = [("first", True), ("second", True), ("third", True)]
    for r, late, pending, before, seen, right in everyone:
        assert right, f"rank {r}: wrong sum"
        assert before == in_order, f"rank {r} (late: {late}), {mode}: callbacks before wait() returned: {before}"
        assert seen == in_order + [("late", True)], f"rank {r}, {mode}: {seen}"
        if r != late and p > 1:
            assert pending, f"rank {r}: the call completed before the late rank {late} started it"


@pytest.mark.mpi
def test_dropin_persistent_and_nonblocking_forms():
    comm = MPI.COMM_WORLD
    mc = mpicoll.Comm(comm)
    x = np.arange(37, dtype=np.float32) + comm.rank
    y = np.empty_like(x)
    want = np.empty_like(x)
    comm.Allreduce(x, want, MPI.SUM)
    req = mc.Allreduce_init(x, y, MPI.SUM)
    for _ in range(2):
        req.Start()
        req.Wait()
        np.testing.assert_array_equal(y, want)
    req.Free()
    b = np.arange(11, dtype=np.int64) if comm.rank == 0 else np.zeros(11, np.int64)
    mc.Ibcast(b, 0).Wait()
    np.testing.assert_array_equal(b, np.arange(11))
    g = np.empty((comm.size, 3), np.int32)
    mc.Iallgather(np.full(3, comm.rank, np.int32), g).Wait()
    np.testing.assert_array_equal(g, np.repeat(np.arange(comm.size), 3).reshape(-1, 3))


MPMD = textwrap.dedent("""
    import numpy as np
    from mpi4py import MPI
    import mpicoll

    comm = MPI.COMM_WORLD
    c = mpicoll.explain(1 << 20, comm=comm)
    names = comm.allgather(c.name)
    assert len(set(names)) == 1, names
    x = np.ones(1 << 18, np.float32)
    for _ in range(3):
        y = mpicoll.allreduce(x, comm=comm)
    assert (y == comm.size).all()
    if comm.rank == 0:
        print("agreed:", names[0], "|", c.reason)
""")


def test_ranks_with_different_tuning_files_agree(tmp_path):
    """MPMD launch: rank 0 reads a profile that sends 1 MiB to the ring with
    4 KiB segments, rank 1 reads none. Both must pick rank 0's choice (a
    rank-local decision would run two algorithms against each other and
    hang, under the subprocess timeout)."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec next to sys.executable")
    prof = profile.Profile([profile.Rule(1, None, 0, None, "ring", 4096, True, "measured", "test")])
    f = tmp_path / "tuning.json"
    profile.save(prof, str(f))
    script = tmp_path / "mpmd.py"
    script.write_text(MPMD)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("MPICOLL_TUNING_FILE", None)
    cmd = [mpiexec, "-n", "1", "env", f"MPICOLL_TUNING_FILE={f}", sys.executable, "-m", "mpi4py", str(script),
           ":", "-n", "1", "env", "MPICOLL_TUNING_FILE=none", sys.executable, "-m", "mpi4py", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agreed: ring" in proc.stdout and "using rank 0's" in proc.stdout, proc.stdout


@pytest.mark.mpi
def test_identical_bits_helper_can_fail():
    """The shared check must catch ranks that differ (else every test that
    uses it could not fail)."""
    comm = MPI.COMM_WORLD
    assert_identical_everywhere(comm, np.arange(5.0), np.zeros(2))
    if comm.size > 1:
        with pytest.raises(AssertionError, match=r"ranks \[1"):
            assert_identical_everywhere(comm, np.arange(5.0) + (comm.rank == 1))
        with pytest.raises(AssertionError):  # a differing sign bit of zero counts
            assert_identical_everywhere(comm, np.array([0.0 if comm.rank != 1 else -0.0]))
    # The batched form (one allgather for a loop of cases) fails as well, on
    # every rank, and names the case whose bits differ.
    same = IdenticalEverywhere(comm)
    same.add(np.arange(5.0), np.zeros(2), what="a")
    same.add(np.ones(3), what="b")
    same.check()
    if comm.size > 1:
        for bits in (np.arange(3.0) + (comm.rank == 1), np.array([0.0 if comm.rank != 1 else -0.0])):
            same.add(np.ones(3), what="first")
            same.add(bits, what="second")
            same.add(np.zeros(1), what="third")
            with pytest.raises(AssertionError, match=r"ranks \[1.*: second"):
                same.check()


def test_ranks_with_different_settings_raise_together(tmp_path):
    """MPICOLL_ALGORITHM set on one rank only: every rank raises the same
    MismatchError when the communicator is first used (instead of two
    algorithms running against each other)."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec next to sys.executable")
    script = tmp_path / "env.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        try:
            mpicoll.allreduce(np.ones(4))
        except mpicoll.MismatchError as e:
            print(f"rank {MPI.COMM_WORLD.rank}: {e}")
    """))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("MPICOLL_ALGORITHM", None)
    cmd = [mpiexec, "-n", "1", "env", "MPICOLL_ALGORITHM=ring", sys.executable, "-m", "mpi4py", str(script),
           ":", "-n", "1", sys.executable, "-m", "mpi4py", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in (0, 1):
        assert f"rank {r}: mpicoll: MPICOLL_ALGORITHM must be the same on every rank" in proc.stdout, proc.stdout


@pytest.mark.mpi
def test_explain_says_where_shm_and_hierarchical_hand_off(comm, monkeypatch):
    """This machine is one node: a forced hierarchical runs as shm, and
    explain() says so; shm stays shm. (Across nodes shm runs as
    hierarchical: _hand_off with nodes > 1.)"""
    monkeypatch.setenv("MPICOLL_ALGORITHM", "hierarchical")
    c = mpicoll.explain(1 << 20, comm=comm)
    assert c.name == "hierarchical" and "runs as shm" in c.reason, c
    monkeypatch.setenv("MPICOLL_ALGORITHM", "shm")
    c = mpicoll.explain(1 << 20, comm=comm)
    assert c.name == "shm" and "runs as" not in c.reason, c
    from mpicoll import dtypes, ops, select
    from mpicoll.algorithms import hierarchical
    from mpicoll.commstate import state
    from mpicoll.node import ENV_FAKE_NODE_SIZE

    if comm.size > 1:  # nodes of one rank each: shm runs as hierarchical, and explain() says what crosses
        monkeypatch.setenv(ENV_FAKE_NODE_SIZE, "1")
        split = MPI.COMM_WORLD.Dup()
        try:
            cross = hierarchical.cross_choice(state(split), (1 << 20) // 4, 4, dtypes.BY_NAME["float32"],
                                              ops.resolve("sum"))
            for forced in ("shm", "hierarchical"):
                monkeypatch.setenv("MPICOLL_ALGORITHM", forced)
                c = mpicoll.explain(1 << 20, comm=split)
                assert c.name == forced and f"across nodes: {cross.name} ({cross.reason})" in c.reason, c
                assert (f"on {comm.size} nodes shm runs as hierarchical" in c.reason) == (forced == "shm"), c
        finally:
            split.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("door", ["blocking", "nonblocking", "persistent"])
def test_knobs_decided_by_prepare_reach_every_collectives_schedule(comm, door):
    """An algorithm's ``prepare`` may decide knobs for the call (as
    hierarchical decides its cross algorithm): the schedule runs with them
    for every collective, not only all-reduce. Checked with a bcast
    algorithm registered for the test: its prepare decides ``stride`` and
    the schedule records what it was given."""
    from mpicoll import registry
    from mpicoll.algorithms.tree import binomial_bcast

    seen = []

    def prepare(st, buf, red, stride=1):
        return {"stride": stride + st.size}

    @registry.register("bcast", "test_prepared", knobs=("stride",), prepare=prepare)
    def _bcast(ctx, buf, root, stride=1):
        seen.append(stride)
        yield from binomial_bcast(ctx, buf, root)

    try:
        x = np.arange(7, dtype=np.float64) if comm.rank == 0 else np.zeros(7)
        if door == "blocking":
            mpicoll.bcast(x, root=0, comm=comm, algorithm="test_prepared")
        elif door == "nonblocking":
            mpicoll.ibcast(x, root=0, comm=comm, algorithm="test_prepared").wait()
        else:
            req = mpicoll.bcast_init(x, root=0, comm=comm, algorithm="test_prepared")
            req.start()
            req.wait()
        np.testing.assert_array_equal(x, np.arange(7, dtype=np.float64))
        assert seen == ([1 + comm.size] if comm.size > 1 else []), seen
    finally:
        del registry._REGISTRY["bcast"]["test_prepared"]
