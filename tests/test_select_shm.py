"""select.allreduce's shared-memory rule: a pure function, no MPI."""
from mpicoll import select


def _fixed_decision(p, nbytes, native):
    """The decision before layouts existed, written out: native types use
    MPI_Allreduce until the ring pays (1 MiB and 512 KiB per rank), others
    recursive doubling up to 64 KiB, then Rabenseifner (powers of two) or
    the ring."""
    if native:
        return "ring" if nbytes >= max(1 << 20, (512 << 10) * p) else "mpi"
    if nbytes <= 64 << 10:
        return "recursive_doubling"
    return "rabenseifner" if p & (p - 1) == 0 else "ring"


def test_layout_defaults_keep_the_old_decision():
    # Compared with the decision itself, not with another call that takes
    # the same path. The defaults mean one rank on one node; one rank on
    # each of p nodes has its own simulated rules (test_select_scale.py).
    for p in (2, 3, 4, 8):
        for nbytes in (8, 1 << 16, 1 << 24):
            for native in (True, False):
                want = _fixed_decision(p, nbytes, native)
                assert select.allreduce(p, nbytes, "sum", "float32", native_dtype=native).name == want, (p, nbytes)
                assert select.allreduce(p, nbytes, "sum", "float32", native_dtype=native,
                                        ranks_per_node=1, nodes=1).name == want, (p, nbytes)
    assert select.allreduce(8, 1 << 24, "sum", "float32", ranks_per_node=1, nodes=8).name == "rabenseifner"
    # and the layout is read when it says something: the comparison above can tell
    assert select.allreduce(8, 1 << 24, "sum", "float32", ranks_per_node=8, nodes=1).name == "shm"


def test_one_node_blocking_calls_take_shm_in_c_from_8_kib_on_up_to_four_ranks():
    assert sorted(select.SHM_DIRECT_RANGE) == [2, 3, 4]
    for k, (lo, hi) in select.SHM_DIRECT_RANGE.items():
        after = "ring" if hi >= select.SHM_MIN_BYTES else "mpi"
        for nbytes, want in ((lo - 1, "mpi"), (lo, "shm"), ((lo + hi) // 2, "shm"), (hi, "shm"), (hi + 1, after)):
            assert select.allreduce(k, nbytes, "sum", "float32", ranks_per_node=k, nodes=1).name == want, (k, nbytes)
        assert select.allreduce(k, lo, "sum", "bfloat16", native_dtype=False, ranks_per_node=k).name == "shm"
    # a call with a deadline runs shm's schedule, not its C path: not those ranges
    for k, (lo, hi) in select.SHM_DIRECT_RANGE.items():
        for nb in (False, True):
            got = select.allreduce(k, 64 << 10, "sum", "float32", ranks_per_node=k, nodes=1, nonblocking=nb,
                                   deadline=True).name
            assert got == "mpi", (k, nb, got)
    # nonblocking calls: their own measured ranges
    for k, (lo, hi) in select.SHM_DIRECT_RANGE_NONBLOCKING.items():
        for nbytes, want in ((lo - 1, "mpi"), (lo, "shm"), (hi, "shm"), (hi + 1, "ring")):
            got = select.allreduce(k, nbytes, "sum", "float32", ranks_per_node=k, nodes=1, nonblocking=True).name
            assert got == want, (k, nbytes, got)
    assert select.allreduce(2, 8 << 20, "sum", "float32", ranks_per_node=2, nodes=1).name == "ring"
    # not on several nodes, nor with one rank per node
    lo = select.SHM_DIRECT_RANGE[2][0]
    assert select.allreduce(4, lo, "sum", "float32", ranks_per_node=2, nodes=2).name != "shm"
    assert select.allreduce(4, lo, "sum", "float32", ranks_per_node=1, nodes=4).name != "shm"


def test_one_node_uses_the_ring_up_to_four_ranks_then_shm_for_long_messages():
    big = select.SHM_MIN_BYTES
    few = select.SHM_MIN_RANKS_PER_NODE - 1
    many = select.SHM_MIN_RANKS_PER_NODE
    # up to 4 ranks per node, beyond shm's C-path ranges: the compiled ring
    # (measured faster than shm's schedule) from 256 KiB, the library below
    hi = select.SHM_DIRECT_RANGE[2][1]
    assert select.allreduce(2, hi + 1, "sum", "float32", ranks_per_node=2, nodes=1).name == "ring"
    assert select.allreduce(2, 8 << 20, "sum", "float16", native_dtype=False, ranks_per_node=2).name == "ring"
    assert select.allreduce(2, 64 << 20, "sum", "float32", ranks_per_node=2, nodes=1).name == "ring"
    assert select.allreduce(few, 64 << 20, "sum", "float32", ranks_per_node=few, nodes=1, nonblocking=True).name \
        == "ring"
    assert select.allreduce(2, select.SHM_DIRECT_RANGE[2][0] - 1, "sum", "float32", ranks_per_node=2,
                            nodes=1).name == "mpi"
    # more ranks per node: shm, up to 4 MiB blocks per rank, then the ring again
    assert select.allreduce(many, big, "sum", "float32", ranks_per_node=many, nodes=1).name == "shm"
    assert select.allreduce(8, 16 << 20, "sum", "float16", native_dtype=False, ranks_per_node=8).name == "shm"
    assert select.allreduce(many, (4 << 20) * many - 1, "sum", "float32", ranks_per_node=many,
                            nodes=1).name == "shm"
    assert select.allreduce(many, (4 << 20) * many, "sum", "float32", ranks_per_node=many, nodes=1).name == "ring"
    assert select.allreduce(many, big - 1, "sum", "float32", ranks_per_node=many, nodes=1).name != "shm"


def test_several_nodes_use_hierarchical_or_the_cascade_for_long_messages():
    big = select.HIERARCHICAL_MIN_BYTES
    # 4 ranks, 1 MiB: blocks of 256 KiB, the cascade (select.py:
    # CASCADE_OVER_HIERARCHICAL_MIN_BLOCK_BYTES); without it, hierarchical
    assert select.allreduce(4, big, "sum", "float32", ranks_per_node=2, nodes=2).name == "cascade"
    assert select.allreduce(4, big, "sum", "float32", ranks_per_node=2, nodes=2,
                            available=lambda a: a != "cascade").name == "hierarchical"
    assert select.allreduce(4, big - 1, "sum", "float32", ranks_per_node=2, nodes=2).name not in \
        ("hierarchical", "cascade")
    # 128 ranks, 1 MiB: blocks of 8 KiB, hierarchical
    assert select.allreduce(128, big, "sum", "float32", ranks_per_node=8, nodes=16).name == "hierarchical"
    # float16/bfloat16 (no MPI reduction): from 64 KiB, where the flat algorithms
    # would send the whole vector across the nodes
    small = select.HIERARCHICAL_MIN_BYTES_NOT_NATIVE
    assert small < big
    assert select.allreduce(4, small, "sum", "float16", native_dtype=False, ranks_per_node=2,
                            nodes=2).name == "hierarchical"
    assert select.allreduce(4, small - 1, "sum", "float16", native_dtype=False, ranks_per_node=2,
                            nodes=2).name == "recursive_doubling"
    assert select.allreduce(4, small, "sum", "float32", ranks_per_node=2, nodes=2).name == "mpi"
    # one rank per node: nothing to share (this is also what hierarchical's
    # inter-node step asks, so it can never recurse into itself)
    assert select.allreduce(4, 1 << 30, "sum", "float32", ranks_per_node=1, nodes=4).name not in ("shm", "hierarchical")


def test_one_rank():
    assert select.allreduce(1, 1 << 30, "sum", "float32", ranks_per_node=1, nodes=1).name == "mpi"


def test_hierarchical_cross_choice_follows_the_cross_profile_but_never_recurses(monkeypatch):
    """The cross-node all-reduce inside hierarchical is auto's choice on the
    cross communicator, its tuning profile included; a rule naming a
    node-level algorithm (which would recurse) is passed over."""
    from types import SimpleNamespace

    from mpicoll import dtypes, kernels, ops, profile
    from mpicoll.algorithms import hierarchical

    red = kernels.Reduction(ops.resolve("sum"), dtypes.BY_NAME["float32"])
    n = 1 << 16

    def choice(rule_alg):
        prof = None if rule_alg is None else profile.Profile(
            [profile.Rule(2, 64, 0, None, rule_alg, None, True, "measured")])
        cross = SimpleNamespace(size=4, profile=prof)
        info = SimpleNamespace(cross_state=lambda: cross, local_size=1, uniform=True)
        with monkeypatch.context() as m:
            m.setattr(hierarchical, "node_info", lambda st: info)
            return hierarchical.cross_choice(None, n, 4, red.dtype, red.op).name

    default = choice(None)
    assert default not in ("shm", "hierarchical", "cascade")
    other = "ring" if default != "ring" else "recursive_doubling"
    assert choice(other) == other  # the profile decides
    for node_level in ("shm", "hierarchical", "cascade"):
        assert choice(node_level) == default  # passed over: the defaults decide


def test_hierarchical_cross_choice_asks_for_one_rank_on_each_node(monkeypatch):
    """The cross communicator holds one rank of each node: its all-reduce is
    chosen by the across-nodes rules, with the node's 8 cross all-reduces
    sharing its link (Rabenseifner on 8 nodes from 128 KiB slices), not by
    the one-node rules, which kept MPI_Allreduce there (blocks under 512 KiB)."""
    from types import SimpleNamespace

    from mpicoll import dtypes, ops
    from mpicoll.algorithms import hierarchical

    cross = SimpleNamespace(size=8, profile=None)
    info = SimpleNamespace(cross_state=lambda: cross, local_size=8, uniform=True)
    monkeypatch.setattr(hierarchical, "node_info", lambda st: info)
    f32, add = dtypes.BY_NAME["float32"], ops.resolve("sum")
    # 16 MiB in two chunks of 8 MiB: slices of 1 MiB per rank
    assert hierarchical.cross_choice(None, (16 << 20) // 4, 4, f32, add).name == "rabenseifner"
    assert select.allreduce(8, 1 << 20, "sum", "float32").name == "mpi"  # what the one-node rules say
    # 1 MiB: slices of 128 KiB, still Rabenseifner (8 at once per node) ...
    assert hierarchical.cross_choice(None, (1 << 20) // 4, 4, f32, add).name == "rabenseifner"
    # ... 512 KiB: slices of 64 KiB, the native call
    assert hierarchical.cross_choice(None, (512 << 10) // 4, 4, f32, add).name == "mpi"
    # uneven nodes: the leaders alone cross, with whole chunks: one all-reduce per node link
    info.uniform = False
    assert hierarchical.cross_choice(None, (512 << 10) // 4, 4, f32, add).name == "mpi"
    assert select.allreduce(8, 512 << 10, "sum", "float32", ranks_per_node=1, nodes=8, concurrent=8).name \
        == "rabenseifner"


def test_cross_knob_values_are_checked_before_anything_runs():
    """A bad ``cross`` is refused where the call's knobs are checked (the
    registry's check_values), so on one rank too, which runs no algorithm."""
    import pytest

    from mpicoll.algorithms import get

    for name in ("shm", "hierarchical", "cascade"):
        with pytest.raises(ValueError, match="cross"):
            get("allreduce", name).check_knobs({"cross": "no_such"})
        get("allreduce", name).check_knobs({"cross": None})
    get("allreduce", "hierarchical").check_knobs({"cross": "ring"})
