"""How many MPI communicators mpicoll holds per user communicator
(docs/reliability.md, "Communicators"): each one counts against the MPI
library's limit (MPICH: 2046 context ids per process), and when mpicoll
takes too many the program's own ``Dup()`` is what fails.

Measured, not assumed: under MPICH, the number of ``Dup()`` a program can
still make falls by exactly what mpicoll holds for K communicators (the
communicators an MPI library makes inside a window included). Other MPI
libraries have no small limit to exhaust: skipped there.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.commstate import ENV_FAKE_NODE_SIZE

K = 6  # user communicators per measurement


def _headroom(comm) -> int:
    """How many more Dup() of ``comm`` succeed (collective), all freed again."""
    got = []
    try:
        while True:
            got.append(comm.Dup())
    except MPI.Exception:
        pass
    for c in got:
        c.Free()
    # Buffer form: mpi4py's object collectives may keep a communicator of
    # their own from their first use on, which would be counted here.
    n = np.array([len(got)], np.int64)
    comm.Allreduce(MPI.IN_PLACE, n, op=MPI.MIN)
    return int(n[0])


def _held(base, algorithm, fake_node_size=None) -> float:
    """Communicators mpicoll holds per user communicator after one all-reduce
    with ``algorithm`` on it; ``base`` is the headroom without them."""
    world = MPI.COMM_WORLD
    if fake_node_size is not None:
        os.environ[ENV_FAKE_NODE_SIZE] = str(fake_node_size)
    users = [world.Dup() for _ in range(K)]
    try:
        x = np.arange(1 << 12, dtype=np.float32)
        for c in users:
            got = mpicoll.allreduce(x, comm=c, algorithm=algorithm)
            assert np.array_equal(got, x * world.size)
        after = _headroom(world)
    finally:
        for c in users:
            c.Free()  # mpicoll's state goes with it
        os.environ.pop(ENV_FAKE_NODE_SIZE, None)
    return (base - after - K) / K


def _window_cost(base) -> int:
    """Communicators one shared-memory window takes (the MPI library may
    make its own for it), measured the same way."""
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    win = MPI.Win.Allocate_shared(4096, 1, comm=node)
    after = _headroom(world)
    win.Free()
    node.Free()
    return base - after - 1


def _mpich() -> bool:
    return "MPICH" in MPI.Get_library_version()


@pytest.mark.mpi
@pytest.mark.skipif(not _mpich(), reason="only MPICH has a small communicator limit to count against")
@pytest.mark.skipif(MPI.COMM_WORLD.size > 2, reason="each count is ~2046 collective Dups: minutes when oversubscribed")
def test_communicators_held_per_user_communicator():
    p = MPI.COMM_WORLD.size
    base = _headroom(MPI.COMM_WORLD)
    # A point-to-point algorithm: the private duplicate only.
    assert _held(base, "ring") == 1
    if p > 1:  # one rank: no node or cross communicator is ever made
        win = _window_cost(base)
        # One node (shm): the duplicate, the node communicator and the window
        # (with what the MPI library makes for it); no cross communicator.
        assert _held(base, "shm") == 2 + win
        # Across nodes (p emulated nodes of one rank): the duplicate, the
        # node and cross communicators, the window; the cross communicator
        # needs no duplicate of its own.
        assert _held(base, "hierarchical", fake_node_size=1) == 3 + win
    assert _headroom(MPI.COMM_WORLD) == base, "mpicoll's communicators were not all freed with the user's"
