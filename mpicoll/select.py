"""How "auto" picks an algorithm: a pure function of (p, nbytes, op, dtype).

No MPI calls here, so the decision can be unit-tested and explained
(``mpicoll.explain``). The thresholds are fixed defaults, measured with
``make demo`` / the kernel and algorithm benchmarks on a 2-core machine
with the MPICH wheel (see docs/algorithms.md); a measured tuning profile
replaces them where one exists.

Order of the decision, as in Open MPI's fixed decision functions:
commutativity first (all of mpicoll's ops are commutative), then whether MPI
can reduce the dtype natively, then the message size.
"""
from __future__ import annotations

from typing import NamedTuple

# Below this, one native MPI_Allreduce call beats anything built from
# Python-level point-to-point calls: the MPI library's own recursive doubling
# costs a few microseconds, each of our messages costs about as much again in
# Python overhead.
NATIVE_MAX_BYTES = 1 << 62
# float16/bfloat16 have no MPI datatype, so a native call runs a Python
# callback per chunk; our algorithms with the C kernels win from small sizes.
SMALL_MESSAGE_BYTES = 64 << 10


class Choice(NamedTuple):
    name: str
    reason: str


def allreduce(p: int, nbytes: int, op: str, dtype: str, *, native_dtype: bool = True,
              ranks_per_node: int = 1, nodes: int = 1) -> Choice:
    """The all-reduce algorithm for ``p`` ranks and an ``nbytes`` message.

    ``ranks_per_node`` (the largest node) and ``nodes`` describe the layout
    (``mpicoll.node``); the defaults mean "one rank per node"."""
    if p == 1:
        return Choice("mpi", "one rank: nothing to exchange")
    shared = _shared_memory_rule(nbytes, ranks_per_node, nodes)
    if shared is not None:
        return shared
    if native_dtype:
        if nbytes <= NATIVE_MAX_BYTES:
            return Choice("mpi", f"{dtype} is native to MPI and the message is at most "
                                 f"{NATIVE_MAX_BYTES} bytes: MPI_Allreduce has the least overhead")
    if nbytes <= SMALL_MESSAGE_BYTES:
        return Choice("recursive_doubling", f"no native MPI reduction for {dtype} and a short message "
                                            f"(<= {SMALL_MESSAGE_BYTES} B): log2(p) exchanges of the vector")
    if p & (p - 1) == 0:
        return Choice("rabenseifner", f"long message on a power-of-two p={p}: halving/doubling moves "
                                      "2(p-1)/p n bytes in 2 log2(p) steps")
    return Choice("ring", f"long message on p={p} (not a power of two): the ring moves 2(p-1)/p n bytes "
                          "with no fold-in")


def simple(collective: str, p: int, nbytes: int, *, native_dtype: bool = True) -> Choice:
    """reduce_scatter, allgather, bcast, reduce: native MPI unless it cannot
    reduce the dtype, then our ring / tree."""
    if native_dtype or collective in ("allgather", "bcast"):
        return Choice("mpi", "the MPI library's own implementation")
    if collective == "reduce_scatter":
        return Choice("ring", f"no native MPI reduction for this dtype: ring reduce-scatter")
    return Choice("tree", "no native MPI reduction for this dtype: binomial tree")


# ---- shared memory (issue 4): shm on one node, hierarchical across nodes ----
# Measured with `make bench-shm` / `make bench-testbed` (2-core machine,
# MPICH wheel, float32 sum; docs/shm.md): shm beat MPI_Allreduce from 256 KiB
# at p=2 and 4 on one node (64 KiB: 0.9x at p=2), the two-level algorithm
# from 1 MiB on the namespace test bed (256 KiB: 0.9-1.0x).
SHM_MIN_BYTES = 256 << 10
HIERARCHICAL_MIN_BYTES = 1 << 20


def _shared_memory_rule(nbytes: int, ranks_per_node: int, nodes: int):
    if ranks_per_node < 2:
        return None
    if nodes == 1 and nbytes >= SHM_MIN_BYTES:
        return Choice("shm", f"{ranks_per_node} ranks on one node and >= {SHM_MIN_BYTES} B: "
                             "reduce through a shared-memory window, one pass per slice")
    if nodes > 1 and nbytes >= HIERARCHICAL_MIN_BYTES:
        return Choice("hierarchical", f"{nodes} nodes of up to {ranks_per_node} ranks and >= "
                                      f"{HIERARCHICAL_MIN_BYTES} B: shared memory inside nodes, "
                                      "one slice per rank across nodes")
    return None
