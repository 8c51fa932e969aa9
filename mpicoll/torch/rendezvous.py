"""The ``mpi://`` rendezvous: rank and world size from MPI, a TCPStore on rank 0.

    dist.init_process_group("gloo", init_method="mpi://")            # any backend
    dist.init_process_group("mpicoll", init_method="mpi://HOST")     # HOST: the address the others reach rank 0 by

Rank 0 opens the store on port 0 and reads the port the kernel chose back
from it, so no port is guessed and none can be taken by someone else in
between; it then broadcasts "host:port" over MPI.COMM_WORLD and the other
ranks connect. The host is, in this order: the URL's host, ``MASTER_ADDR``,
127.0.0.1 when every rank is on rank 0's node (no name lookup needed), else
rank 0's host name.
"""
from __future__ import annotations

import os
import socket
import urllib.parse
from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI

SCHEME = "mpi"

_registered = False


def _host_for_store(url: urllib.parse.ParseResult, comm) -> str:
    """Collective over ``comm`` (every rank finds its node); rank 0's answer is used."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        local_all = node.Get_size() == comm.Get_size()
    finally:
        node.Free()
    if url.hostname:
        return url.hostname
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    return "127.0.0.1" if local_all else socket.gethostname()


def _check_given(query: dict, key: str, actual: int) -> None:
    given = query.get(key)
    if given is not None and int(given[0]) not in (-1, actual):
        raise ValueError(f"mpicoll: mpi:// rendezvous: {key}={given[0]} was given but MPI says {actual}; "
                         "leave rank and world_size out, MPI provides them")


def _mpi_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """The rendezvous handler: yields (store, rank, world_size) once."""
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    _check_given(query, "rank", rank)
    _check_given(query, "world_size", size)
    host = _host_for_store(parsed, comm)
    store = None
    error = None
    if rank == 0:
        try:
            store = dist.TCPStore(host, parsed.port or 0, size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            address = (host, store.port)
        except Exception as exc:  # told to the others, so that they do not wait for a store that never opens
            error, address = exc, None
    else:
        address = None
    address = comm.bcast(address, root=0)
    if error is not None:
        raise error
    if address is None:
        raise RuntimeError("mpicoll: mpi:// rendezvous: rank 0 could not open its TCPStore")
    if rank != 0:
        store = dist.TCPStore(address[0], address[1], size, is_master=False, timeout=timeout)
    yield store, rank, size
    raise RuntimeError("mpicoll: the mpi:// rendezvous cannot be used twice")


def register_rendezvous() -> None:
    """Register ``mpi://`` with torch.distributed (idempotent; importing mpicoll.torch does it)."""
    global _registered
    if not _registered:
        dist.register_rendezvous_handler(SCHEME, _mpi_handler)
        _registered = True
