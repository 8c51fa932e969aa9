"""select.allreduce at scale (issue 20): the decisions the SimGrid study
changed, as a pure function (no MPI), and that they leave one node alone."""
import pytest

from mpicoll import select

MiB = 1 << 20


def _one_node_decision(p, nbytes, native):
    """The fixed decision on one node (one rank per node, or the layout
    unknown), written out: measured on this machine, not moved by the
    simulation."""
    if native:
        return "ring" if nbytes >= max(MiB, (512 << 10) * p) else "mpi"
    if nbytes <= 64 << 10:
        return "recursive_doubling"
    return "rabenseifner" if p & (p - 1) == 0 else "ring"


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_one_node_unchanged(p):
    for nbytes in [0, 8, 64 << 10, 512 << 10, MiB, 2 * MiB, 3 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]:
        for native in (True, False):
            got = select.allreduce(p, nbytes, "sum", "float32", native_dtype=native, nodes=1)
            assert got.name == _one_node_decision(p, nbytes, native), (p, nbytes, native, got)


@pytest.mark.parametrize("p,nbytes,want", [
    # simulated one rank per node (docs/scale.md "auto at scale"): from 1 MiB
    # Rabenseifner on powers of two, 1.0-3.5x MPICH's call ...
    (4, MiB, "rabenseifner"), (8, 2 * MiB, "rabenseifner"), (64, MiB, "rabenseifner"),
    (64, 16 * MiB, "rabenseifner"), (128, 16 * MiB, "rabenseifner"), (1024, MiB, "rabenseifner"),
    # ... the ring otherwise while blocks are >= 64 KiB (no fold), Rabenseifner below
    (5, MiB, "ring"), (12, MiB, "ring"), (48, 16 * MiB, "ring"), (96, 16 * MiB, "ring"),
    (96, MiB, "rabenseifner"), (48, 48 * (64 << 10) - 4, "rabenseifner"), (48, 48 * (64 << 10), "ring"),
    # ... before the ring rule measured on one node (blocks of >= 512 KiB:
    # up to 16 % slower than Rabenseifner on the fat tree at p = 32..128) ...
    (4, 2 * MiB, "rabenseifner"), (2, MiB, "rabenseifner"), (32, 16 * MiB, "rabenseifner"),
    (128, 64 * MiB, "rabenseifner"),
    # ... the ring there from 4 MiB blocks (its pipelined reductions win)
    (4, 16 * MiB, "ring"), (8, 32 * MiB, "ring"), (8, 32 * MiB - 4, "rabenseifner"), (2, 8 * MiB, "ring"),
    # below 1 MiB the native call stays (MPICH won there by 2-6x)
    (64, MiB - 4, "mpi"), (256, 64 << 10, "mpi"), (3, 8, "mpi"),
])
def test_across_nodes_one_rank_per_node(p, nbytes, want):
    got = select.allreduce(p, nbytes, "sum", "float32", ranks_per_node=1, nodes=p)
    assert got.name == want, got
    if want != "mpi" and nbytes < (512 << 10) * p:
        assert "simulated" in got.reason, got


@pytest.mark.parametrize("p", [16, 64, 256, 1024])
def test_across_nodes_several_per_node(p):
    if p == 1024:
        no = dict(ranks_per_node=8, nodes=128, available=lambda a: a not in ("shm", "hierarchical"))
        assert select.allreduce(p, MiB, "sum", "float32", **no).name == "mpi"
    # where shared memory is available: the cascade once blocks n/p reach
    # 16 KiB (simulated with shm priced: 1.3-1.8x faster on the fat tree,
    # within 3 % on 1 Gbit/s), hierarchical from 1 MiB below that ...
    layout = dict(ranks_per_node=8, nodes=p // 8)
    edge = max(MiB, select.CASCADE_OVER_HIERARCHICAL_MIN_BLOCK_BYTES * p)
    c = select.allreduce(p, edge, "sum", "float32", **layout)
    assert c.name == "cascade" and "simulated" in c.reason, c
    assert select.allreduce(p, 16 * MiB, "sum", "float32", **layout).name == "cascade"
    below = select.allreduce(p, edge - 4, "sum", "float32", **layout).name
    assert below == ("hierarchical" if edge > MiB else "mpi"), below
    # not for dtypes MPI cannot reduce (measured on the test bed only for hierarchical)
    assert select.allreduce(p, 16 * MiB, "sum", "bfloat16", native_dtype=False, **layout).name == "hierarchical"
    # and hierarchical, not MPI_Allreduce, where the cascade is not there
    assert select.allreduce(p, 16 * MiB, "sum", "float32", available=lambda a: a != "cascade",
                            **layout).name == "hierarchical"

    # ... and without it, the cascade from 1 MiB (simulated 1.35-2.5x MPICH,
    # 1.2-1.8x the flat ring at 16 MiB): before, MPI_Allreduce
    def no_shm(name):
        return name not in ("shm", "hierarchical")

    # while blocks of n/p are >= 4 KiB (p = 1024, 1 MiB: 1 KiB blocks, the
    # cascade's cross ring of 254 steps lost 1.7x to MPICH's call)
    least = max(MiB, select.CASCADE_MIN_BLOCK_BYTES * p)
    c = select.allreduce(p, least, "sum", "float32", available=no_shm, **layout)
    assert c.name == "cascade" and "cascade" in c.reason and "simulated" in c.reason
    assert select.allreduce(p, least - 4, "sum", "float32", available=no_shm, **layout).name == "mpi"
    # no cascade either: the flat rules
    assert select.allreduce(p, least, "sum", "float32", available=lambda a: no_shm(a) and a != "cascade",
                            **layout).name in ("mpi", "ring")


def test_the_layouts_differ():
    # The comparisons above can tell the rules apart: the same calls on one
    # node (or layout unknown) keep MPI_Allreduce.
    for p, n in ((64, 16 * MiB), (8, MiB), (5, MiB)):
        assert select.allreduce(p, n, "sum", "float32").name == "mpi"
        assert select.allreduce(p, n, "sum", "float32", ranks_per_node=1, nodes=p).name != "mpi"


def test_not_native_across_nodes_unchanged():
    # float16 has no MPI reduction: the threshold is for the native call only
    for p in (4, 64, 256):
        for nbytes in (8, 64 << 10, MiB, 16 * MiB):
            got = select.allreduce(p, nbytes, "sum", "float16", native_dtype=False, ranks_per_node=1, nodes=p)
            assert got.name == _one_node_decision(p, nbytes, False), (p, nbytes, got)


# ---- issue 20's algorithms -----------------------------------------------------------

@pytest.mark.parametrize("p,nbytes,want", [
    # simulated at p = 64 and 256: k-nomial 1.1-1.9x the binomial tree up to 4 KiB
    (64, 8, "knomial"), (256, 4096, "knomial"), (16, 1024, "knomial"),
    # from 16 KiB the root's 3 vectors per level cost more than the saved levels
    (64, 4096 + 4, "tree"), (256, 64 << 10, "tree"),
    # few ranks: not simulated, the tree stays
    (8, 8, "tree"), (15, 8, "tree"),
])
def test_knomial_for_short_reduces_of_non_native_dtypes(p, nbytes, want):
    c = select.native_first("reduce", p, nbytes, native_dtype=False)
    assert c.name == want, c
    if want == "knomial":
        assert "k-nomial" in c.reason
    # a dtype MPI reduces: the native call, whatever the size
    assert select.native_first("reduce", p, nbytes, native_dtype=True).name == "mpi"
    # without knomial registered: the tree
    assert select.native_first("reduce", p, nbytes, native_dtype=False, available=lambda a: False).name == "tree"


def test_select_simple_is_a_deprecated_alias_of_native_first():
    with pytest.warns(DeprecationWarning, match="native_first"):
        old = select.simple("reduce", 64, 8, native_dtype=False)
    assert old == select.native_first("reduce", 64, 8, native_dtype=False)


def test_knomial_not_for_the_allreduce():
    # recursive doubling was faster in every simulated short all-reduce
    for p in (16, 64, 256, 1024):
        c = select.allreduce(p, 1024, "sum", "float16", native_dtype=False, ranks_per_node=1, nodes=p)
        assert c.name == "recursive_doubling" and "k-nomial" in c.reason


def test_hetero_ring_only_with_uneven_weights():
    w = (1.0, 2.0, 2.0, 1.0)
    c = select.allreduce(4, 16 * MiB, "sum", "float32", link_weights=w)
    assert c.name == "hetero_ring" and dict(c.knobs)["weights"] == w and "uneven links" in c.reason
    # before the shared-memory rule: the weights say the links differ
    assert select.allreduce(4, 16 * MiB, "sum", "float32", link_weights=w, ranks_per_node=2,
                            nodes=2).name == "hetero_ring"
    # no weights, equal weights, the wrong number of them, or a short message: not hetero_ring
    for kw in ({}, {"link_weights": (3.0,) * 4}, {"link_weights": (1.0, 2.0, 1.0)}):
        assert select.allreduce(4, 16 * MiB, "sum", "float32", **kw).name == "ring"
    assert select.allreduce(4, select.HETERO_MIN_BYTES - 4, "sum", "float32", link_weights=w).name != "hetero_ring"
    assert select.allreduce(4, 16 * MiB, "sum", "float32", link_weights=w,
                            available=lambda a: a != "hetero_ring").name == "ring"


@pytest.mark.mpi
def test_every_rank_agrees():
    # select is a pure function of what every rank holds alike (size, layout,
    # profile, weights): the same answers on every rank, and explain() too
    from mpi4py import MPI

    import mpicoll

    comm = MPI.COMM_WORLD
    p = comm.size
    answers = []
    for nbytes in (8, 4096, MiB, 16 * MiB):
        for rpn, nodes in ((1, p), (p, 1), (2, -(-p // 2))):
            answers.append(select.allreduce(p, nbytes, "sum", "float32", ranks_per_node=rpn, nodes=nodes))
            answers.append(select.allreduce(p, nbytes, "sum", "float32", ranks_per_node=rpn, nodes=nodes,
                                            link_weights=tuple(float(1 + (r == 0)) for r in range(p))))
        answers.append(select.native_first("reduce", p, nbytes, native_dtype=False))
        answers.append(mpicoll.explain(nbytes, comm=comm))
    gathered = comm.allgather(answers)
    assert all(g == gathered[0] for g in gathered)


def test_auto_diff_lists_the_changed_cells():
    # sim/auto_diff.py, the tool docs/scale.md quotes: same module -> no
    # cells; against a selector that always answers "mpi", exactly the
    # cells where select does not
    import importlib.util
    import os
    import types

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("auto_diff", os.path.join(root, "sim", "auto_diff.py"))
    auto_diff = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(auto_diff)
    ps, sizes = [4, 64], [8, MiB, 16 * MiB]
    assert auto_diff.diff(select, select, ps, sizes) == []
    always_mpi = types.SimpleNamespace(allreduce=lambda *a, **k: select.Choice("mpi", "stub"))
    rows = auto_diff.diff(always_mpi, select, ps, sizes)
    assert rows and all(r[4] == "mpi" and r[5] != "mpi" for r in rows)
    assert (64, 16 * MiB, "1 per node", "float32", "mpi", "rabenseifner") in [r[:6] for r in rows]
    assert (64, 16 * MiB, "8 per node, no shm window", "float32", "mpi", "cascade") in [r[:6] for r in rows]


@pytest.mark.mpi
def test_auto_runs_hetero_ring_with_the_measured_weights():
    """plan.py passes the communicator's measured link weights (what
    hetero_ring's 'measure' leaves in the state) to the selection and the
    chosen weights to the schedule; the result stays MPI_Allreduce's."""
    import numpy as np
    from mpi4py import MPI

    import mpicoll
    from mpicoll.commstate import state

    comm = MPI.COMM_WORLD.Dup()
    try:
        p, r = comm.size, comm.rank
        st = state(comm)
        n = (4 * MiB) // 4 + 3
        x = np.full(n, r + 1, np.float32)
        if p == 1:
            assert mpicoll.allreduce(x, comm=comm).tobytes() == x.tobytes()
            return
        st.extra["hetero_ring"] = tuple(1.0 if q else 2.0 for q in range(p))  # as if rank 0's link were faster
        assert mpicoll.explain(n * 4, comm=comm).name == "hetero_ring"
        plan = mpicoll.plan.allreduce(x, comm=comm)
        assert plan.algorithm == "hetero_ring"
        ref = np.empty_like(x)
        comm.Allreduce(x, ref)
        np.testing.assert_array_equal(plan.run(), ref)
    finally:
        comm.Free()
