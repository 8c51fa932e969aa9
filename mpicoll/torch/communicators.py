"""The MPI communicator of each torch process group.

The world group is MPI.COMM_WORLD (re-ordered to torch's ranks by one
MPI_Comm_split when the rendezvous is not ``mpi://``); a subgroup is made
with MPI_Comm_create_group over its members alone. ``deadline_of`` turns a
group's timeout into mpicoll's ``timeout=``.
"""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI

_world_comm = None  # MPI.COMM_WORLD, or a split of it in torch's rank order


def _comm_for(group_rank: int, group_size: int, global_ranks) -> MPI.Intracomm:
    """The MPI communicator of a new process group (collective over its members)."""
    global _world_comm
    world = MPI.COMM_WORLD
    ranks = list(global_ranks or [])
    default = dist.GroupMember.WORLD is None  # the default group is being created
    if default or not ranks:
        if group_size != world.Get_size():
            raise ValueError(f"mpicoll backend: the world group has {group_size} ranks but MPI.COMM_WORLD "
                             f"{world.Get_size()}; launch every rank with mpiexec")
        in_order = world.allreduce(int(group_rank != world.Get_rank()), op=MPI.SUM) == 0
        base = world if in_order else world.Split(0, key=group_rank)
        if default:
            _world_comm = base
        return base.Dup()
    base = _world_comm if _world_comm is not None else world
    if base is world and dist.get_rank() != world.Get_rank():
        raise RuntimeError("mpicoll backend: a subgroup under a non-mpicoll default group needs torch's ranks "
                           "to be MPI's: initialise with init_method='mpi://'")
    group = base.Get_group().Incl(ranks)
    try:
        comm = base.Create_group(group, tag=0)
    finally:
        group.Free()
    return comm


def deadline_of(timeout) -> float | None:
    """A process group's timeout as mpicoll's ``timeout=`` (seconds), None for
    torch's default (see the module docstring)."""
    if timeout is None or not isinstance(timeout, timedelta):
        return None
    from torch.distributed.constants import default_pg_timeout

    if timeout == default_pg_timeout or timeout <= timedelta(0):
        return None
    return timeout.total_seconds()
