"""The SimGrid driver (mpicoll.simulate): same messages as the counting driver, sensible times.

Skips when SimGrid's Python module is missing (apt-get install python3-simgrid).
Small sizes and p <= 64 keep it under a minute.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from mpicoll import counting, dtypes, ops
from mpicoll.algorithms import get

simulate = pytest.importorskip("mpicoll.simulate")
try:
    simulate.import_simgrid()
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(str(exc), allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "platforms", "cluster-128x8-fattree.xml")
HERE = os.path.join(ROOT, "platforms", "this-machine.xml")


def counted(collective, algorithm, p, nbytes, knobs=None):
    """Per-rank (messages, bytes sent, bytes reduced) from the counting
    driver, with real data (the schedules' arguments as the SimGrid driver
    builds them)."""
    from mpicoll.algorithms.common import block_bounds
    from mpicoll.kernels import Reduction

    dt = dtypes.BY_NAME["float32"]
    red = Reduction(ops.resolve("sum"), dt)
    reducing = collective in ("allreduce", "reduce_scatter", "reduce")
    n = nbytes // 4 if reducing else nbytes
    bufs = [np.ones(n, np.float32 if reducing else np.uint8) for _ in range(p)]
    sched = get(collective, algorithm).schedule

    def make(ctx, stats):
        buf, cr = bufs[ctx.rank], counting.CountingReduction(red, stats)
        extra = {"allreduce": (cr, None), "reduce_scatter": (cr, block_bounds(n, p)), "reduce": (cr, 0),
                 "bcast": (0,), "allgather": (block_bounds(n, p),)}[collective]
        return sched(ctx, buf, *extra, **(knobs or {}))

    return [(s.messages, s.bytes_sent, s.bytes_reduced) for s in counting.simulate(p, make)]


CASES = [("allreduce", "ring", 8), ("allreduce", "tree", 13), ("allreduce", "recursive_doubling", 12),
         ("allreduce", "rabenseifner", 16), ("allreduce", "ring", 64), ("bcast", "tree", 9),
         ("reduce", "ring", 10), ("reduce_scatter", "ring", 8), ("allgather", "ring", 11)]


@pytest.mark.parametrize("collective,algorithm,p", CASES)
@pytest.mark.parametrize("nbytes", [0, 12, 4096 + 4])
def test_counts_equal_counting_driver(collective, algorithm, p, nbytes):
    r = simulate.run(CLUSTER, collective, algorithm, p, nbytes, ppn=8)
    got = [(s.messages, s.bytes_sent, s.bytes_reduced) for s in r.stats]
    assert got == counted(collective, algorithm, p, nbytes)
    assert all(s.finish_s is not None for s in r.stats)
    assert r.time_s > 0


@pytest.mark.parametrize("spec,p", [("cascade", 24), ("cascade:ppn=5", 23), ("knomial:radix=8", 20),
                                    ("hetero_ring:weights=x", 8)])
@pytest.mark.parametrize("nbytes", [0, 4096 + 4])
def test_knobs_counts_equal_counting_driver(spec, p, nbytes):
    # The issue-20 algorithms with their knobs, as the study runs them:
    # the cascade on the simulated layout (8 per node unless the spec says).
    name, knobs = simulate.algorithm_spec(spec, 8)
    if name == "hetero_ring":
        knobs = {"weights": [1, 2, 3, 2, 1, 1, 1, 1]}
    r = simulate.run(CLUSTER, "allreduce", name, p, nbytes, ppn=8, knobs=knobs)
    assert [(s.messages, s.bytes_sent, s.bytes_reduced) for s in r.stats] == \
        counted("allreduce", name, p, nbytes, knobs)


def test_algorithm_spec():
    assert simulate.algorithm_spec("ring", 8) == ("ring", {})
    assert simulate.algorithm_spec("knomial:radix=8", 8) == ("knomial", {"radix": 8})
    assert simulate.algorithm_spec("cascade", 8) == ("cascade", {"ppn": 8})
    assert simulate.algorithm_spec("cascade:ppn=4;cross=ring", 8) == ("cascade", {"ppn": 4, "cross": "ring"})
    with pytest.raises(ValueError, match="knob=value"):
        simulate.algorithm_spec("knomial:radix", 8)


def test_hetero_platform_loads():
    # hosts listed one by one (not a <cluster>), one slow link
    plat = simulate.load_platform(os.path.join(ROOT, "platforms", "hetero-8x1.xml"))
    assert plat.hosts == 8 and plat.reduce_Bps > 0
    # nodes 0-1 talk at 10 Gbit/s; adding node 2 (1 Gbit/s) makes the ring's
    # slowest step 10x longer, far more than one more step would
    fast = simulate.run(plat, "allreduce", "ring", 2, 4 << 20, ppn=1).time_s
    slow = simulate.run(plat, "allreduce", "ring", 3, 4 << 20, ppn=1).time_s
    assert slow > 5 * fast > 0


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling", "rabenseifner"])
def test_bigger_message_never_faster(algorithm):
    times = [simulate.run(CLUSTER, "allreduce", algorithm, 16, n, ppn=8).time_s for n in (8, 4096, 1 << 20)]
    assert times == sorted(times) and times[0] < times[-1], times


def test_more_ranks_slower_and_network_slower_than_node():
    # The ring's 2(p-1) steps: more ranks cost more; the same 8 ranks on
    # one node (5 GB/s shared memory) beat 8 ranks on 8 nodes on this
    # machine's platform (1 Gbit/s links).
    t8 = simulate.run(CLUSTER, "allreduce", "ring", 8, 1 << 16, ppn=1).time_s
    t32 = simulate.run(CLUSTER, "allreduce", "ring", 32, 1 << 16, ppn=1).time_s
    assert t8 < t32
    one_node = simulate.run(HERE, "allreduce", "ring", 8, 1 << 22, ppn=8).time_s
    eight_nodes = simulate.run(HERE, "allreduce", "ring", 8, 1 << 22, ppn=1).time_s
    assert one_node < eight_nodes


def test_this_machine_platform_loads():
    plat = simulate.load_platform(HERE)
    assert plat.reduce_Bps > 0 and plat.op_overhead_s >= 0
    assert simulate.run(plat, "allreduce", "ring", 4, 1 << 20, ppn=4).time_s > 0


def test_unsimulable_and_bad_input():
    with pytest.raises(simulate.Unsimulable):
        simulate.run(CLUSTER, "allreduce", "mpi", 8, 64, ppn=8)
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):
        simulate.run(CLUSTER, "allreduce", "nope", 8, 64)
    with pytest.raises(ValueError, match="nodes"):
        simulate.run(CLUSTER, "allreduce", "ring", 4096, 64, ppn=1)
    for bad in ({"nbytes": -1}, {"collective": "alltoall"}, {"dtype": "float128"}, {"op": "nope"}):
        args = {"collective": "allreduce", "nbytes": 64, **bad}
        kw = {k: v for k, v in args.items() if k in ("dtype", "op")}
        with pytest.raises(ValueError):
            simulate.run(CLUSTER, args["collective"], "ring", 8, args["nbytes"], **kw)


def test_shm_on_one_node_costs_its_copies_syncs_and_reduction():
    # shm's pipeline, unchanged, on 4 ranks of one node (8 cores: no
    # sharing): one chunk, so per rank exactly the call cost, 2 syncs, the
    # copy-in of the 3 slices others reduce, the 4-input reduction of its
    # own slice (3 slices combined) and the copy-out of the whole vector.
    # No network message. A driver that dropped a copy, a sync or the
    # reduction's price would miss by at least 40 us here.
    plat = simulate.load_platform(HERE)
    n = 1 << 20
    r = simulate.run(plat, "allreduce", "shm", 4, n, ppn=4)
    want = (plat.call_overhead_s + 2 * plat.sync_s + (3 * n // 4 + n) / plat.copy_Bps
            + (3 * n // 4) / plat.reduce_Bps)
    assert r.time_s == pytest.approx(want, rel=1e-6), (r.time_s, want)
    assert all(s.messages == 0 and s.bytes_reduced == 3 * n // 4 for s in r.stats)


def test_hierarchical_sends_only_its_cross_messages():
    # 2 nodes x 8 ranks, 16 MiB: two chunks of 8 MiB, each rank's slice 1 MiB
    # all-reduced with its partner on the other node (cross=ring at p=2:
    # one message each way per half).
    n = 16 << 20
    ring = simulate.run(CLUSTER, "allreduce", "hierarchical", 16, n, ppn=8, knobs={"cross": "ring"})
    assert [s.messages for s in ring.stats] == [4] * 16
    assert [s.bytes_sent for s in ring.stats] == [2 << 20] * 16
    # Default cross on 4 nodes: auto's for one rank on each of 4 nodes and
    # 1 MiB slices (Rabenseifner, select._across_nodes), not the one-node
    # rules (which said MPI_Allreduce: unsimulable).
    auto = simulate.run(CLUSTER, "allreduce", "hierarchical", 32, n, ppn=8)
    forced = simulate.run(CLUSTER, "allreduce", "hierarchical", 32, n, ppn=8, knobs={"cross": "rabenseifner"})
    assert auto.time_s == forced.time_s and [s.messages for s in auto.stats] == [s.messages for s in forced.stats]
    # shm on several nodes runs as hierarchical, as under MPI
    assert simulate.run(CLUSTER, "allreduce", "shm", 16, n, ppn=8, knobs={"cross": "ring"}).time_s == ring.time_s
    # uneven nodes (8 + 4): the leaders carry whole chunks across
    uneven = simulate.run(CLUSTER, "allreduce", "hierarchical", 12, 1 << 20, ppn=8, knobs={"cross": "ring"})
    assert [s.messages > 0 for s in uneven.stats] == [r % 8 == 0 for r in range(12)]
    # what stays unsimulated says so
    with pytest.raises(simulate.Unsimulable, match="MPI_Allreduce"):
        simulate.run(CLUSTER, "allreduce", "hierarchical", 16, 1 << 16, ppn=8)
    with pytest.raises(simulate.Unsimulable, match="sync"):
        simulate.run(CLUSTER, "allreduce", "shm", 4, 1 << 16, ppn=4, knobs={"sync": "barrier"})


def test_a_size_mismatch_is_reported():
    # Rank 1 expects 8 bytes, rank 0 sends 4: MismatchError as in the other drivers.
    from mpicoll.errors import MismatchError

    with pytest.raises((MismatchError, RuntimeError), match="expected 8 bytes|MismatchError"):
        simulate._in_child(_mismatch)


def _mismatch():
    sg = simulate.import_simgrid()
    plat = simulate.load_platform(CLUSTER)
    engine = sg.Engine(["t", "--log=root.thresh:critical"])
    engine.load_platform(CLUSTER)
    run = simulate._Run(sg, plat, 2, 1)
    hosts = sorted(engine.all_hosts, key=lambda h: simulate._host_order(h.name))

    def gen(ctx):
        if ctx.rank == 0:
            yield [ctx.send(np.zeros(4, np.uint8), 1)]
        else:
            yield [ctx.recv(np.zeros(8, np.uint8), 0)]

    for r in range(2):
        ctx = simulate._Context(counting._SimComm(r, 2), 0, {}, ("test", "mismatch", 8, 0))
        ctx.run, ctx.stats = run, run.stats[r]
        sg.Actor.create(f"r{r}", hosts[r], run.actor, r, gen(ctx))
    engine.run()
    if run.error is not None:
        raise run.error


def test_summary_regret_and_profile(tmp_path):
    # No simulation: rows as the study writes them. At p=64, 1 MiB the ring
    # is best; auto (no profile, 8 per node on 8 nodes) picks the cascade,
    # not in these rows: regret unknown. At p=256, 1 MiB (4 KiB blocks) it
    # picks hierarchical, priced from its plain row (its cross decided as
    # auto decides it). At 8 B auto picks the native call, priced from the
    # SMPI figure plus reductions and call cost.
    from mpicoll import profile

    plat = simulate.load_platform(CLUSTER)
    rows = [{"algorithm": a, "p": 64, "bytes": n, "time_s": t}
            for a, n, t in (("ring", 1 << 20, 1e-3), ("tree", 1 << 20, 3e-3), ("ring", 8, 2e-4), ("tree", 8, 1e-4),
                            ("knomial:radix=8", 1 << 20, 5e-4))]  # a knob variant: best, but no profile rule
    rows += [{"algorithm": a, "p": 256, "bytes": 1 << 20, "time_s": t}
             for a, t in (("hierarchical", 2e-3), ("ring", 1e-3))]
    native = {("mpich", "allreduce", 64, 8): 5e-6}
    summary = simulate.summarize(rows, plat, 8, native)
    s = {x["bytes"]: x for x in summary if x["p"] == 64}
    assert s[1 << 20]["best"] == "knomial:radix=8" and s[1 << 20]["auto"] == "cascade" \
        and s[1 << 20]["regret"] is None
    h = [x for x in summary if x["p"] == 256][0]
    assert h["auto"] == "hierarchical" and h["regret"] == pytest.approx(1.0), h
    mpi = simulate.native_priced(plat, 5e-6, 64, 8)
    assert mpi > 5e-6 and s[8]["best"] == "mpi" and s[8]["auto"] == "mpi" and s[8]["regret"] == 0
    prof = simulate.profile_from(list(s.values()), plat, 8)
    profile.save(prof, str(tmp_path / "t.json"))
    loaded = profile.load(str(tmp_path / "t.json"))
    c = simulate.auto_choice(64, 1 << 20, 8, profile=loaded)
    assert c.name == "ring" and "(simulated on a SimGrid platform)" in c.reason, c.reason
    assert simulate.auto_choice(512, 4, 8, profile=loaded).name == "mpi"


def test_plot_reads_the_note_and_writes_svg(tmp_path):
    # sim/plot.py: the note's native-vs-mpicoll tables -> one polyline per
    # (platform, p, series) with points; a table it cannot find is an error
    import importlib.util
    import xml.etree.ElementTree as ET

    spec = importlib.util.spec_from_file_location("sim_plot", os.path.join(ROOT, "sim", "plot.py"))
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    with open(os.path.join(ROOT, "docs", "scale.md")) as f:
        tables = plot.read_tables(f.read())
    fat = tables["The fat tree"]
    assert sorted(fat) == [64, 256, 1024]
    assert dict(fat[64]["mpich"])[16 << 20] == 24103 and dict(fat[64]["mpicoll"])[8] == 59.5
    out = tmp_path / "p.svg"
    assert plot.main(["--out", str(out)]) == 0
    root = ET.parse(out).getroot()
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == sum(len(s) for t in tables.values() for s in t.values())
    with pytest.raises(ValueError, match="no section"):
        plot.read_tables("nothing here")


def test_a_cell_past_the_studys_timeout_is_skipped_and_the_rest_run():
    plat = simulate.load_platform(CLUSTER)
    rows = simulate.study(plat, "allreduce", ["ring"], [16], 8, [64], timeout_s=0.001)
    assert rows[0]["time_s"] is None and "did not finish in 0.001 s" in rows[0]["skipped"]
    rows = simulate.study(plat, "allreduce", ["ring"], [16], 8, [64], timeout_s=120)
    assert rows[0]["time_s"] > 0 and rows[0]["skipped"] is None
