"""The ``mpi://`` rendezvous: rank and world size from MPI, a store no outsider can write.

    dist.init_process_group("gloo", init_method="mpi://")            # any backend
    dist.init_process_group("mpicoll", init_method="mpi://HOST")     # HOST: the address the others reach rank 0 by

torch's store is an unauthenticated key-value server: whoever can connect to
a ``TCPStore`` can read, list and write every key (and so, for gloo, steer
the ranks' connections). The rendezvous therefore opens no socket where it
needs none:

* Every rank on rank 0's node (the usual single-node job): a ``FileStore``
  in a fresh directory that only the job's user can open (``mkdtemp``: mode
  0700, under ``TMPDIR`` or /tmp), its path broadcast over MPI. Nothing
  listens on any interface. Used when every rank sees that directory;
  otherwise (nodes' private /tmp), the TCP store below.
* Ranks on several nodes: a ``TCPStore`` on rank 0 listening on one address
  only, the one the others reach rank 0 by (the URL's host, else
  ``MASTER_ADDR``, else the address rank 0's host name resolves to), not on
  every interface; rank 0 binds the socket itself (port 0: the kernel picks
  a free port, so none is guessed and none can be taken in between) and
  broadcasts address and port over MPI. What remains exposed: TCPStore has
  no authentication, so a process that can reach that address and port
  while the job runs can read and write the store; keep the ranks' network
  private (docs/torch.md).
"""
from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import socket
import tempfile
import urllib.parse
from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI

SCHEME = "mpi"

_registered = False


def _all_on_one_node(comm) -> bool:
    """Collective over ``comm``: is every rank on rank 0's node?"""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return comm.bcast(node.Get_size() == comm.Get_size(), root=0)
    finally:
        node.Free()


def _file_store(comm, timeout: timedelta):
    """Collective: a FileStore in a private directory of rank 0's, or None
    when some rank cannot see that directory (then no rank made a store)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    path, error = None, None
    if rank == 0:
        try:
            directory = tempfile.mkdtemp(prefix="mpicoll-store-")  # 0700: the job's user only
            path = os.path.join(directory, "store")
        except OSError as exc:  # told to the others, so that they do not wait for a store that never opens
            error = exc
    path = comm.bcast(path, root=0)
    if path is None:
        raise RuntimeError(f"mpicoll: mpi:// rendezvous: rank 0 could not make a private directory: {error}")
    directory = os.path.dirname(path)
    seen = comm.allreduce(int(os.path.isdir(directory)), op=MPI.MIN)
    if not seen:
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
        return None
    if rank == 0:
        # The FileStore removes its file when the last rank lets go of it; the
        # empty directory goes at exit (a rank may still be using the store
        # after rank 0 has dropped its own).
        atexit.register(shutil.rmtree, directory, True)
    store = dist.FileStore(path, size)
    store.set_timeout(timeout)
    return store


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``'s address (not every interface) and listening."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def _tcp_store(url: urllib.parse.ParseResult, comm, timeout: timedelta, one_node: bool):
    """Collective: a TCPStore on rank 0, listening on the one address the
    other ranks reach it by (loopback when they are all on its node)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    store, sock, address, error = None, None, None, None
    if rank == 0:
        host = url.hostname or os.environ.get("MASTER_ADDR") or ("127.0.0.1" if one_node else socket.gethostname())
        try:
            sock = _listening_socket(host, url.port or 0)
            ip, port = sock.getsockname()[:2]
            if not one_node and ipaddress.ip_address(ip).is_loopback:
                raise RuntimeError(f"mpicoll: mpi:// rendezvous: the ranks span several nodes but {host!r} is "
                                   f"the loopback address {ip}: give the address the other nodes reach rank 0 "
                                   "by, as mpi://ADDRESS or MASTER_ADDR")
            store = dist.TCPStore(ip, port, size, is_master=True, timeout=timeout, wait_for_workers=False,
                                  master_listen_fd=sock.fileno())
            sock.detach()  # the store's server owns the descriptor now, and closes it
            address = (ip, port)
        except Exception as exc:  # told to the others, so that they do not wait for a store that never opens
            error = exc
        finally:
            if sock is not None and store is None:
                sock.close()
    address = comm.bcast(address, root=0)
    if error is not None:
        raise error
    if address is None:
        raise RuntimeError("mpicoll: mpi:// rendezvous: rank 0 could not open its TCPStore")
    if rank != 0:
        store = dist.TCPStore(address[0], address[1], size, is_master=False, timeout=timeout)
    return store


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
    one_node = _all_on_one_node(comm)
    store = _file_store(comm, timeout) if one_node else None
    if store is None:
        store = _tcp_store(parsed, comm, timeout, one_node)
    yield store, rank, size
    raise RuntimeError("mpicoll: the mpi:// rendezvous cannot be used twice")


def register_rendezvous() -> None:
    """Register ``mpi://`` with torch.distributed (idempotent; importing mpicoll.torch does it)."""
    global _registered
    if not _registered:
        dist.register_rendezvous_handler(SCHEME, _mpi_handler)
        _registered = True
