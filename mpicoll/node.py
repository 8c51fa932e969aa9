"""Node discovery: which ranks of a communicator share a node's memory.

``node_info(st)`` splits mpicoll's private duplicate with
``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` once and caches the result in
``st.extra["node"]`` (freed with the communicator, like every other piece
of per-communicator state). It is a collective call on first use; every
later call is a dictionary look-up. It runs only when a shared-memory or
hierarchical algorithm is about to run (at call time, in the plan layer's
``prepare`` step); "auto" decides from the cheaper layout the
communicator's state found when it was created (``CommState.nodes``,
``ranks_per_node``: processor names).

What it records:

* ``local``: the ranks on this node, ordered by their rank in ``st.comm``
  (so "lower local rank" still means "lower rank" when reducing);
* ``cross_state()``: mpicoll's state on the cross communicator, the ranks
  of every node that have this rank's local index (local rank j of each
  node), ordered by node; with equal rank counts per node there are
  ``local_size`` of them, so every rank of a node talks to the network at
  once. Made on first use only (hierarchical across nodes), collectively;
* ``nodes``, ``ranks_per_node`` (the largest node) and ``uniform`` (every
  node has the same number of ranks), identical on every rank, so that
  ``select.allreduce`` can use them and still pick the same algorithm
  everywhere;
* ``node_ranks``: for every node (ordered by its lowest rank), the
  ``st.comm`` ranks on it; ``contiguous`` says whether each node holds a
  consecutive range of ranks (what the reproducible path needs to reduce a
  node's ranks first and still keep global rank order).
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from .commstate import ENV_FAKE_NODE_SIZE  # noqa: F401  (documented there)
from .commstate import CommState as _CommState

# ENV_FAKE_NODE_SIZE: emulation for tests on one machine, "nodes" of this
# many consecutive ranks (MPI_Comm_split instead of MPI_Comm_split_type; the
# shared-memory window still works because all ranks really share the
# machine's memory). Real multi-host runs use scripts/testbed.sh instead.


class NodeInfo:
    def __init__(self, comm: MPI.Intracomm):
        rank = comm.Get_rank()
        fake = os.environ.get(ENV_FAKE_NODE_SIZE)
        if fake:
            self.local = comm.Split(rank // max(1, int(fake)), key=rank)
        else:
            self.local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        # Every rank learns every rank's (lowest rank on its node): one small
        # allgather, after which all node facts are computed identically.
        # The node's lowest rank is its local rank 0 (ordered by rank), found
        # locally; mpi4py's object all-reduce would keep a hidden duplicate
        # of the node communicator for itself.
        local_group, group = self.local.Get_group(), comm.Get_group()
        leader = MPI.Group.Translate_ranks(local_group, [0], group)[0]
        local_group.Free()
        group.Free()
        mine = np.array([leader], np.int64)
        every = np.empty(comm.Get_size(), np.int64)
        comm.Allgather(mine, every)
        leader_of = every.tolist()
        leaders = sorted(set(leader_of))
        self.node = leaders.index(leader_of[rank])
        self.nodes = len(leaders)
        self.node_ranks = [[r for r in range(len(leader_of)) if leader_of[r] == ld] for ld in leaders]
        sizes = [len(rs) for rs in self.node_ranks]
        self.ranks_per_node = max(sizes)
        self.uniform = min(sizes) == self.ranks_per_node
        self.contiguous = all(rs == list(range(rs[0], rs[0] + len(rs))) for rs in self.node_ranks)
        # The cross communicator only when an inter-node step needs it
        # (hierarchical, several nodes): shm on one node and the
        # reproducible path never do, and each communicator counts against
        # the MPI library's limit (docs/reliability.md, "Communicators").
        self._comm = comm
        self._cross = None

    def cross_state(self):
        """mpicoll's state on the cross communicator (inter-node algorithms
        run there): collective over the whole communicator on first use."""
        if self._cross is None:
            # Split from mpicoll's private duplicate, so already private: its
            # state uses it as is, without another duplicate.
            self._cross = _CommState(self._comm.Split(self.local_rank, self.node), private=True)
        return self._cross

    def free(self) -> None:
        if MPI.Is_finalized():
            return
        if self._cross is not None:
            self._cross.free()
            self._cross = None
        if self.local != MPI.COMM_NULL:
            self.local.Free()


def node_info(st) -> NodeInfo:
    """The communicator's node layout (collective on first call, cached)."""
    info = st.extra.get("node")
    if info is None:
        info = NodeInfo(st.comm)
        st.extra["node"] = info
    return info
