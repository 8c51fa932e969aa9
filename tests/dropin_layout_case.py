"""One drop-in call whose buffer layout differs between the ranks (legal MPI:
only the type signatures must match), or a vector spec that mpi4py reads in
its own way, run through plain mpi4py and through
mpicoll.Comm, in every mode (blocking, nonblocking, persistent): the bits
must agree and mpicoll must have served the call on every rank.

    mpiexec -n P python -m mpi4py tests/dropin_layout_case.py CASE [CASE...]

Launched by tests/test_dropin_layouts.py under a hard timeout: before
mpicoll.Comm decided from facts every rank shares (and read vector specs as
mpi4py does), the ranks took different paths (one mpi4py's, the others
mpicoll's) and the job hung.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import dropin

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.Get_size(), WORLD.Get_rank()
N = 3  # entries per block


def values(n, rank=RANK, dtype=np.float64):
    return (np.arange(n) + 100 * rank + 1).astype(dtype)


def scatterv_displs(root=P - 1):
    """The root's send blocks lie apart (displacements 0, 2N, 4N...)."""
    def build():
        if RANK == root:
            send = [values(2 * N * P, root), ([N] * P, [2 * N * i for i in range(P)]), MPI.DOUBLE]
        else:
            send = None
        out = np.full(N, -1.0)
        return (send, out, root), out
    return "Scatterv", build


def gatherv_displs(root=0):
    """The root receives into blocks with gaps (which must stay untouched)."""
    def build():
        out = np.full(2 * N * P, -1.0)
        recv = [out, ([N] * P, [2 * N * (P - 1 - i) for i in range(P)]), MPI.DOUBLE] if RANK == root else None
        return (values(N), recv, root), out
    return "Gatherv", build


def allgatherv_strided():
    """Every rank receives with a scalar count and a stride: [buf, (N, 2N), type]."""
    def build():
        out = np.full(2 * N * P, -1.0)
        return (values(N), [out, (N, 2 * N), MPI.DOUBLE]), out
    return "Allgatherv", build


def alltoallv_one_rank_gapped():
    """Only rank 1 receives into gapped blocks; the others' layouts are packed."""
    def build():
        send = values(N * P)
        out = np.full(2 * N * P, -1.0)
        if RANK == 1:
            recv = [out, ([N] * P, [2 * N * i + 1 for i in range(P)]), MPI.DOUBLE]
        else:
            recv = [out, ([N] * P, [N * i for i in range(P)]), MPI.DOUBLE]
        return ([send, [N] * P, [N * i for i in range(P)], MPI.DOUBLE], recv), out
    return "Alltoallv", build


def bcast_derived_on_root(root=0):
    """The root sends 1 entry of contiguous(4, DOUBLE), the others receive 4 DOUBLEs."""
    c4 = MPI.DOUBLE.Create_contiguous(4).Commit()

    def build():
        b = values(4, root) if RANK == root else np.full(4, -1.0)
        return ([b, 1, c4] if RANK == root else [b, 4, MPI.DOUBLE], root), b
    return "Bcast", build


def bcast_bottom_on_root(root=P - 1):
    """The root names its buffer by absolute address ([MPI.BOTTOM, 1, struct]),
    the others pass 4 DOUBLEs."""
    def build():
        b = values(4, root) if RANK == root else np.full(4, -1.0)
        if RANK != root:
            return ([b, 4, MPI.DOUBLE], root), b
        t = MPI.Datatype.Create_struct([4], [MPI.Get_address(b)], [MPI.DOUBLE]).Commit()
        return ([MPI.BOTTOM, 1, t], root), b
    return "Bcast", build


def gather_strided_derived_on_root(root=0):
    """The root receives each block through a vector type (every other double), the others send DOUBLEs."""
    every_other = MPI.DOUBLE.Create_vector(N, 1, 2).Commit()

    def build():
        out = np.full(2 * N * P, -1.0)
        recv = [out, 1, every_other] if RANK == root else None
        return ([values(N), N, MPI.DOUBLE], recv, root), out
    return "Gather", build


# The other vector specs mpi4py's message_vector accepts (one count for every
# block, a bare buffer whose entries do not split evenly, four items).
UNEVEN = N * P + (P - 1)  # mpi4py gives the first UNEVEN % P blocks one entry more
PER = [UNEVEN // P + (UNEVEN % P > i) for i in range(P)]


def allgatherv_count():
    def build():
        out = np.full(N * P + 2, -1.0)
        return (values(N), [out, N]), out
    return "Allgatherv", build


def allgatherv_bare_uneven():
    def build():
        out = np.full(UNEVEN, -1, np.int32)
        return (values(PER[RANK], dtype=np.int32), out), out
    return "Allgatherv", build


def allgatherv_four_items():
    def build():
        out = np.full(2 * N * P, -1, np.int16)
        displs = [2 * N * (P - 1 - i) for i in range(P)]
        return (values(N, dtype=np.int16), [out, [N] * P, displs, MPI.SHORT]), out
    return "Allgatherv", build


def gatherv_count(root=P - 1):
    def build():
        out = np.full(N * P, -1.0)
        return (values(N), [out, N] if RANK == root else None, root), out
    return "Gatherv", build


def gatherv_strided(root=P - 1):
    def build():
        out = np.full(2 * N * P, -1.0)
        return ([values(N), MPI.DOUBLE], [out, (N, 2 * N), MPI.DOUBLE] if RANK == root else None, root), out
    return "Gatherv", build


def scatterv_bare_uneven(root=0):
    def build():
        out = np.full(PER[RANK], -1, np.int64)
        return (values(UNEVEN, root, np.int64) if RANK == root else None, out, root), out
    return "Scatterv", build


def alltoallv_strided_recv():
    def build():
        out = np.full(2 * N * P, -1.0)
        return ([values(N * P), N], [out, (N, 2 * N), MPI.DOUBLE]), out
    return "Alltoallv", build


CASES = {f.__name__: f for f in (scatterv_displs, gatherv_displs, allgatherv_strided, alltoallv_one_rank_gapped,
                                 bcast_derived_on_root, bcast_bottom_on_root, gather_strided_derived_on_root,
                                 allgatherv_count,
                                 allgatherv_bare_uneven, allgatherv_four_items, gatherv_count, gatherv_strided,
                                 scatterv_bare_uneven, alltoallv_strided_recv)}


def call(comm, name, args, mode, starts=1):
    """``comm.<name>(*args)`` in ``mode`` ("run", "start", "init"), completed
    (a persistent request started and waited for ``starts`` times, then
    freed). Returns what the call returned."""
    req = getattr(comm, name)(*args)
    if mode == "init":
        for _ in range(starts):
            req.Start()
            req.Wait()
        req.Free()
    elif req is not None:
        req.Wait()
    return req


def main(case: str) -> int:
    method, build = CASES[case]()
    comm = mpicoll.Comm(WORLD)
    for mode in ("run", "start", "init"):
        name = dropin._method(method, mode)
        args, ref = build()
        call(WORLD, name, args, mode)
        args, got = build()
        calls = dropin.count_calls()
        call(comm, name, args, mode, starts=2)  # a persistent request repeats the local packing at every start
        dropin.count_calls(False)
        assert ref.tobytes() == got.tobytes(), (case, name, RANK, ref, got)
        assert calls[name, "mpicoll"] == 1 and not calls[name, "mpi4py"], (case, name, RANK, dict(calls))
    WORLD.Barrier()
    if RANK == 0:
        print(f"{case}: OK at p={P}", flush=True)
    return 0


if __name__ == "__main__":
    for name in sys.argv[1:]:
        main(name)
