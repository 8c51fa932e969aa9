"""The mpi:// rendezvous: it works at every p, and no outside client can write its store."""
from __future__ import annotations

import os
import stat
import urllib.parse
from datetime import timedelta

import pytest
from mpi4py import MPI

from torch_helpers import skip_if_too_many_ranks, torch  # noqa: F401  (skips without torch)

import torch.distributed as dist  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def pg():
    skip_if_too_many_ranks()
    import mpicoll.torch  # noqa: F401

    dist.init_process_group("mpicoll", init_method="mpi://")
    yield
    dist.destroy_process_group()


def base_store():
    """The store the rendezvous made (torch wraps it in PrefixStores)."""
    store = c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def test_the_rendezvous_works(pg):
    """Ranks from MPI, the store shared by every rank, collectives on mpicoll and on gloo."""
    comm = MPI.COMM_WORLD
    p, r = comm.Get_size(), comm.Get_rank()
    assert (dist.get_rank(), dist.get_world_size()) == (r, p)
    store = c10d._get_default_store()
    store.set(f"rank{r}", str(r * r))
    store.wait([f"rank{q}" for q in range(p)], timedelta(seconds=60))
    assert [store.get(f"rank{q}") for q in range(p)] == [str(q * q).encode() for q in range(p)]
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    assert (t == p * (p + 1) / 2).all()
    gloo = dist.new_group(backend="gloo")  # gloo's ranks connect through the store
    u = torch.full((3,), float(r))
    dist.all_reduce(u, group=gloo)
    assert (u == p * (p - 1) / 2).all()


def test_outside_client_cannot_write_keys(pg):
    """Every rank on one node: the store is a file in a directory only this
    user can open; nothing listens. Before, a TCPStore on every interface
    took keys from any client, through 127.0.0.1 and ::1 alike."""
    store = base_store()
    if MPI.COMM_WORLD.Get_rank() == 0 and isinstance(store, dist.TCPStore):
        wrote = []
        for host in ("127.0.0.1", "::1"):
            try:
                outsider = dist.TCPStore(host, store.port, is_master=False, timeout=timedelta(seconds=2))
                outsider.set(f"outsider-{host}", "x")
            except Exception:  # refused: what this test wants
                continue
            wrote.append(host)
        assert not wrote, f"an outside client wrote keys through {wrote}"
    assert isinstance(store, dist.FileStore), type(store)
    directory = os.path.dirname(store.path)
    info = os.stat(directory)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid(), (directory, oct(info.st_mode))
    assert MPI.COMM_WORLD.allgather(directory) == [directory] * MPI.COMM_WORLD.Get_size()


def test_file_store_needs_every_rank_to_see_it(pg, monkeypatch):
    """A rank that cannot see rank 0's directory (a node-private /tmp): no
    rank makes a FileStore, and the directory is gone."""
    from mpicoll.torch import rendezvous

    comm = MPI.COMM_WORLD
    if comm.Get_rank() == comm.Get_size() - 1:
        monkeypatch.setattr(rendezvous.os.path, "isdir", lambda path: False)
    made = []
    real_mkdtemp = rendezvous.tempfile.mkdtemp

    def recording_mkdtemp(prefix):
        made.append(real_mkdtemp(prefix=prefix))
        return made[-1]

    monkeypatch.setattr(rendezvous.tempfile, "mkdtemp", recording_mkdtemp)
    assert rendezvous._file_store(comm, timedelta(seconds=30)) is None
    monkeypatch.undo()
    if comm.Get_rank() == 0:
        assert len(made) == 1 and not os.path.exists(made[0])


def test_tcp_store_listens_on_one_address_only(pg):
    """The fallback (several nodes, or a directory some rank cannot see): the
    TCPStore listens on the given address only; here 127.0.0.1, so that ::1
    is refused, and the store works for every rank."""
    from mpicoll.torch import rendezvous

    comm = MPI.COMM_WORLD
    p, r = comm.Get_size(), comm.Get_rank()
    store = rendezvous._tcp_store(urllib.parse.urlparse("mpi://127.0.0.1"), comm, timedelta(seconds=60),
                                  one_node=True)
    assert store.host == "127.0.0.1"
    store.set(f"tcp{r}", str(r))
    store.wait([f"tcp{q}" for q in range(p)], timedelta(seconds=60))
    assert [store.get(f"tcp{q}") for q in range(p)] == [str(q).encode() for q in range(p)]
    if r == 0:
        with pytest.raises(Exception):
            dist.TCPStore("::1", store.port, is_master=False, timeout=timedelta(seconds=1))
    comm.Barrier()


def test_tcp_store_refuses_loopback_across_nodes(pg):
    """Ranks on several nodes cannot meet on a loopback address: every rank
    raises, before any store is made."""
    from mpicoll.torch import rendezvous

    with pytest.raises(RuntimeError, match="loopback|could not open"):
        rendezvous._tcp_store(urllib.parse.urlparse("mpi://127.0.0.1"), MPI.COMM_WORLD, timedelta(seconds=30),
                              one_node=False)
