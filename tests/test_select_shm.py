"""select.allreduce's shared-memory rule: a pure function, no MPI."""
from mpicoll import select


def test_layout_defaults_keep_the_old_decision():
    for p in (2, 3, 4, 8):
        for nbytes in (8, 1 << 16, 1 << 24):
            for native in (True, False):
                assert select.allreduce(p, nbytes, "sum", "float32", native_dtype=native) == \
                    select.allreduce(p, nbytes, "sum", "float32", native_dtype=native, ranks_per_node=1, nodes=p)


def test_one_node_uses_shm_for_long_messages():
    big = select.SHM_MIN_BYTES
    assert select.allreduce(4, big, "sum", "float32", ranks_per_node=4, nodes=1).name == "shm"
    assert select.allreduce(2, 4 << 20, "sum", "float16", native_dtype=False, ranks_per_node=2).name == "shm"
    # long blocks per rank: the ring (measured faster there)
    assert select.allreduce(2, 64 << 20, "sum", "float32", ranks_per_node=2, nodes=1).name == "ring"
    assert select.allreduce(4, 8 << 20, "sum", "float32", ranks_per_node=4, nodes=1).name == "shm"
    assert select.allreduce(4, 16 << 20, "sum", "float32", ranks_per_node=4, nodes=1).name == "ring"
    assert select.allreduce(4, big - 1, "sum", "float32", ranks_per_node=4, nodes=1).name != "shm"


def test_several_nodes_use_hierarchical_for_long_messages():
    big = select.HIERARCHICAL_MIN_BYTES
    assert select.allreduce(4, big, "sum", "float32", ranks_per_node=2, nodes=2).name == "hierarchical"
    assert select.allreduce(4, big - 1, "sum", "float32", ranks_per_node=2, nodes=2).name != "hierarchical"
    # one rank per node: nothing to share (this is also what hierarchical's
    # inter-node step asks, so it can never recurse into itself)
    assert select.allreduce(4, 1 << 30, "sum", "float32", ranks_per_node=1, nodes=4).name not in ("shm", "hierarchical")


def test_one_rank():
    assert select.allreduce(1, 1 << 30, "sum", "float32", ranks_per_node=1, nodes=1).name == "mpi"
