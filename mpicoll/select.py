"""How "auto" picks an algorithm: a pure function of (p, nbytes, op, dtype).

No MPI calls here, so the decision can be unit-tested and explained
(``mpicoll.explain``). A tuning profile (``python -m mpicoll.tune``,
loaded by the caller through ``mpicoll.profile`` and passed in) decides
first: its measured entries, then its fitted cost model; the fixed
defaults below, measured with ``make bench`` on a 2-core machine with the
MPICH wheel (see docs/algorithms.md), decide everything else. The reason
in each Choice says which of the three it was.

Order of the decision, as in Open MPI's fixed decision functions:
commutativity first (all of mpicoll's ops are commutative), then whether MPI
can reduce the dtype natively, then the message size.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

# Fixed defaults, measured with ``make bench`` (float32 sum, MPICH wheel,
# p = 2 and 4 on a 2-core machine; docs/algorithms.md has the tables).
#
# Short messages: MPI_Allreduce. Each point-to-point message our algorithms
# send costs microseconds of Python, several times MPICH's whole
# shared-memory all-reduce, so nothing built from them wins here.
#
# Long messages: the pipelined ring. MPICH's shared-memory MPI_Allreduce
# (Rabenseifner at these sizes) copies every message through a bounded
# shared-memory queue and reduces in one pass after it; the ring overlaps
# the reduction of one segment with the transfer of the next, and measured
# here it is faster from a few hundred KiB on. It takes over when the
# message is at least RING_MIN_BYTES *and* each rank's block is at least
# RING_MIN_BLOCK_BYTES: the ring's 2(p-1) latency terms grow with p, so on
# large communicators it needs proportionally longer messages.
RING_MIN_BYTES = 1 << 20
RING_MIN_BLOCK_BYTES = 512 << 10
# float16/bfloat16 have no MPI datatype, so a native call runs a Python
# callback per chunk; our algorithms with the C kernels win from small sizes.
SMALL_MESSAGE_BYTES = 64 << 10


class Choice(NamedTuple):
    name: str
    reason: str
    # A knob for the chosen algorithm (the ring's), from a tuning profile.
    segment_bytes: Optional[int] = None


def _registered(name: str) -> bool:
    # Imported late, by submodule (mpicoll.algorithms the attribute is the
    # public function): keeps this module importable on its own.
    from .algorithms import has

    return has("allreduce", name)


# Memoised: "auto" asks on every call, and building the reason string costs
# microseconds, as much as a short native MPI_Allreduce. The answer depends
# only on the arguments (a profile is immutable once loaded; the registry
# is filled at import), so caching does not change it; call
# ``allreduce.cache_clear()`` after registering an algorithm late.
@functools.lru_cache(maxsize=4096)
def allreduce(p: int, nbytes: int, op: str, dtype: str, *, native_dtype: bool = True,
              profile=None, available=None, ranks_per_node: int = 1, nodes: int = 1) -> Choice:
    """The all-reduce algorithm for ``p`` ranks and an ``nbytes`` message.

    ``ranks_per_node`` (the largest node) and ``nodes`` describe the layout
    (``mpicoll.node``); the defaults mean "one rank per node".

    ``profile`` is a loaded ``mpicoll.profile.Profile`` (or None): its
    first matching rule decides, then its fitted model, then the fixed
    defaults below. ``available(name)`` says which algorithms exist
    (default: the registry); a profile naming a missing one is passed over.
    """
    if p == 1:
        return Choice("mpi", "one rank: nothing to exchange")
    available = available or _registered
    if profile is not None:
        choice = _from_profile(profile, p, nbytes, native_dtype, available)
        if choice is not None:
            return choice
    shared = _shared_memory_rule(nbytes, ranks_per_node, nodes, native_dtype)
    if shared is not None and available(shared.name):
        return shared
    return _default(p, nbytes, dtype, native_dtype, available)


def _default(p, nbytes, dtype, native_dtype, available) -> Choice:
    """The fixed decision (no profile, or no profile entry for this case)."""
    if native_dtype:
        if nbytes >= RING_MIN_BYTES and nbytes >= RING_MIN_BLOCK_BYTES * p and available("ring"):
            return Choice("ring", f"default: long message ({nbytes} B >= {RING_MIN_BYTES} B, blocks of >= "
                                  f"{RING_MIN_BLOCK_BYTES} B per rank): the pipelined ring overlaps reduction "
                                  "and transfer and beat MPI_Allreduce in the measurements")
        return Choice("mpi", f"default: {dtype} is native to MPI and the message is short for p={p} "
                             f"(ring from {max(RING_MIN_BYTES, RING_MIN_BLOCK_BYTES * p)} B): "
                             "MPI_Allreduce has the least per-call overhead")
    if nbytes <= SMALL_MESSAGE_BYTES and available("recursive_doubling"):
        return Choice("recursive_doubling", f"default: no native MPI reduction for {dtype} and a short message "
                                            f"(<= {SMALL_MESSAGE_BYTES} B): log2(p) exchanges of the vector")
    if p & (p - 1) == 0 and available("rabenseifner"):
        return Choice("rabenseifner", f"default: long message on a power-of-two p={p}: halving/doubling moves "
                                      "2(p-1)/p n bytes in 2 log2(p) steps")
    if available("ring"):
        return Choice("ring", f"default: long message on p={p} (not a power of two): the ring moves "
                              "2(p-1)/p n bytes with no fold-in")
    return Choice("mpi", "default: MPI's own all-reduce (no point-to-point algorithm is registered)")


def _from_profile(profile, p, nbytes, native_dtype, available) -> Optional[Choice]:
    where = profile.path or "tuning profile"
    rule = profile.lookup(p, nbytes, native_dtype, available)
    if rule is not None:
        what = "measured on this machine" if rule.source == "measured" else "predicted by the fitted cost model"
        note = f": {rule.note}" if rule.note else ""
        return Choice(rule.algorithm, f"profile entry ({what}) in {where}: {rule.describe()}{note}",
                      rule.segment_bytes)
    model = getattr(profile, "model", None)
    if model is None or not native_dtype:  # the model is fitted on native dtypes only
        return None
    from . import model as _model

    candidates = [a for a in _model.P2P + ("mpi",) if available(a) and _model.family(a) in model.params]
    if not candidates:
        return None
    t, name = _model.best(model, p, nbytes, candidates)
    return Choice(name, f"model fitted in {where} (no rule covers p={p}, {nbytes} B): "
                        f"predicted {t * 1e6:.1f} us, the least of {', '.join(candidates)}")


def simple(collective: str, p: int, nbytes: int, *, native_dtype: bool = True) -> Choice:
    """reduce_scatter, allgather, bcast, reduce: native MPI unless it cannot
    reduce the dtype, then our ring / tree."""
    if native_dtype or collective in ("allgather", "bcast"):
        return Choice("mpi", "the MPI library's own implementation")
    if collective == "reduce_scatter":
        return Choice("ring", "no native MPI reduction for this dtype: ring reduce-scatter")
    return Choice("tree", "no native MPI reduction for this dtype: binomial tree")


# ---- shared memory: shm on one node, hierarchical across nodes ----
# Measured with `make bench-shm` / `make bench-testbed` (2-core machine,
# MPICH wheel, float32 sum; docs/shm.md): shm beat MPI_Allreduce from 256 KiB
# at p=2 and 4 on one node (64 KiB: 0.9x at p=2), the two-level algorithm
# from 1 MiB on the namespace test bed (256 KiB: 0.9-1.0x).
SHM_MIN_BYTES = 256 << 10
HIERARCHICAL_MIN_BYTES = 1 << 20
# ... and up to blocks of this many bytes per rank: beyond, the pipelined
# ring was as fast or faster on one node in every measurement (float32 sum,
# idle machine: p=2 8-64 MiB ring 0.26-0.91x native vs shm 0.40-1.22x; p=4
# 8 MiB shm 0.70x vs ring 0.92x, 32-64 MiB a tie within 10%): shm copies
# every byte into the window and out again, the ring streams it.
SHM_MAX_BLOCK_BYTES = 4 << 20
# Across nodes with a dtype MPI cannot reduce (float16, bfloat16: the DDP
# compression hooks' buckets), the alternative to the two-level algorithm
# is not MPI_Allreduce but our flat ones, which send the whole vector over
# the slow links. Measured on the test bed (2 hosts x 2 ranks, 1 Gbit/s,
# float16 sum, ms): hierarchical 0.47 vs recursive doubling 1.05 and
# Rabenseifner 1.06 at 64 KiB, 2.27 vs 4.36/4.37 at 256 KiB, 4.76 vs
# 8.99/12.75 at 512 KiB; at 16 KiB a tie (0.40 vs 0.36).
HIERARCHICAL_MIN_BYTES_NOT_NATIVE = 64 << 10


def _shared_memory_rule(nbytes: int, ranks_per_node: int, nodes: int, native_dtype: bool = True):
    if ranks_per_node < 2:
        return None
    if nodes == 1 and nbytes >= SHM_MAX_BLOCK_BYTES * ranks_per_node:
        return Choice("ring", f"{ranks_per_node} ranks on one node and blocks of >= {SHM_MAX_BLOCK_BYTES} B "
                              "per rank: the pipelined ring streams what shm would copy in and out")
    if nodes == 1 and nbytes >= SHM_MIN_BYTES:
        return Choice("shm", f"{ranks_per_node} ranks on one node and >= {SHM_MIN_BYTES} B: "
                             "reduce through a shared-memory window, one pass per slice")
    least = HIERARCHICAL_MIN_BYTES if native_dtype else HIERARCHICAL_MIN_BYTES_NOT_NATIVE
    if nodes > 1 and nbytes >= least:
        return Choice("hierarchical", f"{nodes} nodes of up to {ranks_per_node} ranks and >= {least} B"
                                      f"{'' if native_dtype else ' of a dtype MPI cannot reduce'}: shared memory "
                                      "inside nodes, one slice per rank across nodes")
    return None


# ---- scatter, gather, allgatherv, alltoall, alltoallv -----------------------------
# Measured with `python -m mpicoll.bench family` at p = 2 and 4 (2-core
# machine shared with other jobs, MPICH wheel; tables in docs/algorithms.md).
# Below a few hundred KiB every mpicoll algorithm is bound by its Python
# per-call and per-message cost (tens of microseconds against MPICH's
# 2-40 us), so the native call stays. From 256 KiB per rank on, the
# allgatherv ring (3.3x native at p=4, 20-140x at 2-16 MiB where
# MPI_Allgatherv collapsed; 0.6-3.9x at p=2) and the windowed all-to-all
# ring (1.7-2.4x at p=4, 1.0-1.2x at p=2) beat the native call. Bruck never
# did (0.03-0.7x: its per-round packing and messages cost more in Python
# than MPICH's Bruck in C), and linear/binomial scatter and gather were
# within the run-to-run spread of the native call (the same native call
# under "auto" and "mpi" differed by up to 2x), so they are never chosen.
FAMILY_RING_MIN_BLOCK_BYTES = 256 << 10


def family(collective: str, p: int, nbytes: int) -> Choice:
    """The data-movement collectives added with scatter. ``nbytes`` is the
    same on every rank (scatter/gather: all blocks; allgatherv: the result;
    alltoall: one rank's send buffer; alltoallv: -1, since its ranks know
    only their own counts, so its rule cannot depend on size)."""
    if collective == "allgatherv" and nbytes >= FAMILY_RING_MIN_BLOCK_BYTES * p:
        return Choice("ring", f"default: blocks of >= {FAMILY_RING_MIN_BLOCK_BYTES} B on average: the ring "
                              "beat MPI_Allgatherv in the measurements")
    if collective == "alltoall" and nbytes >= FAMILY_RING_MIN_BLOCK_BYTES:
        return Choice("ring", f"default: >= {FAMILY_RING_MIN_BLOCK_BYTES} B per rank: the windowed shift "
                              "exchange beat MPI_Alltoall in the measurements")
    if nbytes < 0:
        return Choice("mpi", "the ranks know only their own counts, so the rule cannot depend on size: "
                             "the MPI library's own implementation")
    return Choice("mpi", "default: short messages (mpicoll's per-call cost dominates) or no algorithm "
                         "measured faster: the MPI library's own implementation")
