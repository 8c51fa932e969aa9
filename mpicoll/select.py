"""How "auto" picks an algorithm: a pure function of (p, nbytes, op, dtype,
the node layout, link weights).

No MPI calls here, so the decision can be unit-tested and explained
(``mpicoll.explain``). A tuning profile (``python -m mpicoll.tune``,
loaded by the caller through ``mpicoll.profile`` and passed in) decides
first: its measured entries, then its fitted cost model; the fixed
defaults below decide everything else: measured with ``make bench`` on a
2-core machine with the MPICH wheel (see docs/algorithms.md) on one node,
simulated with SimGrid (docs/scale.md) across nodes, where this machine
cannot measure. The reason in each Choice says which it was.

Order of the decision, as in Open MPI's fixed decision functions:
commutativity first (all of mpicoll's ops are commutative), then whether MPI
can reduce the dtype natively, then the message size.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

from . import model as _model
from .registry import has

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
    # Other knobs the choice depends on, as ((name, value), ...): hetero_ring's
    # weights (the link speeds that made it the choice).
    knobs: tuple = ()


def _registered(name: str) -> bool:
    return has("allreduce", name)


# Memoised: "auto" asks on every call, and building the reason string costs
# microseconds, as much as a short native MPI_Allreduce. The answer depends
# only on the arguments (a profile is immutable once loaded; the registry
# is filled at import), so caching does not change it; call
# ``allreduce.cache_clear()`` after registering an algorithm late.
@functools.lru_cache(maxsize=4096)
def allreduce(p: int, nbytes: int, op: str, dtype: str, *, native_dtype: bool = True,
              profile=None, available=None, ranks_per_node: int = 1, nodes: int = 1,
              link_weights: Optional[tuple] = None, concurrent: int = 1, nonblocking: bool = False,
              deadline: bool = False) -> Choice:
    """The all-reduce algorithm for ``p`` ranks and an ``nbytes`` message.

    ``ranks_per_node`` (the largest node) and ``nodes`` describe the layout
    (``mpicoll.node``); the defaults mean "one rank per node".
    ``concurrent``: how many all-reduces of this size share each node's
    link at once (hierarchical's cross communicators: one per local rank);
    1 for an ordinary call. ``nonblocking``: the call is an ``i*`` or
    persistent one (measured apart: shm's C path serves both forms, the
    others' nonblocking forms cost differently). ``deadline``: the call has
    a ``timeout=``; it runs shm's schedule, not its C path (kept plans and
    runners serve calls without one), so shm's C-path ranges, measured on
    that path, do not apply.
    ``link_weights``: hetero_ring's weights for this communicator's ring
    (a tuple of p numbers, the same on every rank: measured by its
    ``weights="measure"`` or declared by the user), or None when the links
    are not known to differ.

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
    uneven = _uneven_links(p, nbytes, link_weights, available)
    if uneven is not None:
        return uneven
    shared = _shared_memory_rule(p, nbytes, ranks_per_node, nodes, native_dtype, available, nonblocking, deadline)
    if shared is not None and available(shared.name):
        return shared
    return _default(p, nbytes, dtype, native_dtype, available, ranks_per_node, nodes, concurrent)


def _default(p, nbytes, dtype, native_dtype, available, ranks_per_node=1, nodes=1, concurrent=1) -> Choice:
    """The fixed decision (no profile, or no profile entry for this case)."""
    if native_dtype:
        if nodes > 1 and ranks_per_node == 1:
            # One rank per node: the simulated rules below, before the ring
            # rule measured on one node (whose 512 KiB blocks cost up to 16 %
            # against Rabenseifner on the fat tree, p = 32..128).
            across = _across_nodes(p, nbytes, ranks_per_node, nodes, available, concurrent)
            if across is not None:
                return across
        if nbytes >= RING_MIN_BYTES and nbytes >= RING_MIN_BLOCK_BYTES * p and available("ring"):
            return Choice("ring", f"default: long message ({nbytes} B >= {RING_MIN_BYTES} B, blocks of >= "
                                  f"{RING_MIN_BLOCK_BYTES} B per rank): the pipelined ring overlaps reduction "
                                  "and transfer and beat MPI_Allreduce in the measurements")
        if nodes > 1:
            across = _across_nodes(p, nbytes, ranks_per_node, nodes, available, concurrent)
            if across is not None:
                return across
        ours = _across_min_bytes(concurrent) if nodes > 1 else max(RING_MIN_BYTES, RING_MIN_BLOCK_BYTES * p)
        return Choice("mpi", f"default: {dtype} is native to MPI and the message is short for p={p} "
                             f"(ours from {ours} B): MPI_Allreduce has the least per-call overhead")
    if nbytes <= SMALL_MESSAGE_BYTES and available("recursive_doubling"):
        return Choice("recursive_doubling", f"default: no native MPI reduction for {dtype} and a short message "
                                            f"(<= {SMALL_MESSAGE_BYTES} B): log2(p) exchanges of the vector (the "
                                            "k-nomial tree, simulated, was slower)")
    if p & (p - 1) == 0 and available("rabenseifner"):
        return Choice("rabenseifner", f"default: long message on a power-of-two p={p}: halving/doubling moves "
                                      "2(p-1)/p n bytes in 2 log2(p) steps")
    if available("ring"):
        return Choice("ring", f"default: long message on p={p} (not a power of two): the ring moves "
                              "2(p-1)/p n bytes with no fold-in")
    return Choice("mpi", "default: MPI's own all-reduce (no point-to-point algorithm is registered)")


# ---- across nodes, native dtypes: from the SimGrid study --------------------------
# With one rank per node, before the ring rule measured on one node; with
# several, where that rule has not decided (blocks < 512 KiB) and neither
# has the shared-memory one (the cascade or hierarchical, above).
# Simulated (SimGrid, docs/scale.md "auto at scale": a 100 Gbit/s fat tree
# and 1 Gbit/s copies of this machine, p = 4..256, MPICH's own call priced
# by SMPI plus its reductions). From 1 MiB mpicoll's algorithms beat or tied
# MPI_Allreduce in every simulated cell across nodes, and which one wins
# depends on whether ranks share a node's link:
# * one rank per node: Rabenseifner on powers of two (1.0-3.5x faster than
#   MPICH's call, up to 5x the ring at 1 MiB: log2 p steps against 2(p-1)),
#   the ring there from 4 MiB blocks (below); otherwise
#   the ring while its blocks are long (its 2(p-1) steps, unfolded, beat
#   Rabenseifner's fold, which sends the whole vector twice more), and
#   Rabenseifner once blocks are short (1 MiB at p = 48 and 96);
# * several ranks per node (reached only when the shared-memory rule has
#   not decided, i.e. hierarchical is unavailable): the cascade, every rank
#   of a node carrying 1/L of the node's traffic (1.35-2.5x MPICH's call,
#   1.2-2.1x the next best from 1 MiB, p = 64 and 256); the flat ring and
#   Rabenseifner push n/2 (halving) or a whole block per step through a
#   link 8 ranks share. While n/p >= 4 KiB: that is the block of the
#   cascade's cross ring (n/L bytes over N nodes), whose 2(N-1) steps cost
#   more than they save below (1 MiB at p = 1024: 1 KiB blocks, 1.7x
#   slower than MPICH's call; 4 KiB at p = 256 still won).
ACROSS_NODES_MIN_BYTES = 1 << 20
ACROSS_NODES_RING_MIN_BLOCK_BYTES = 64 << 10
# On powers of two the ring only from blocks this long: below, Rabenseifner
# was up to 16 % faster on the fat tree (p = 2..128, 1-128 MiB, docs/scale.md
# "One rank per node, powers of two, long messages"; within 2 % either way
# on 1 Gbit/s); from 4 MiB blocks the ring, by 7-21 % (p = 2 from 8 MiB,
# p = 4 from 16 MiB, p = 8 from 32 MiB, p = 16 from 64 MiB, p = 32 at
# 128 MiB).
ACROSS_NODES_POF2_RING_MIN_BLOCK_BYTES = 4 << 20
CASCADE_MIN_BLOCK_BYTES = 4 << 10


# Several all-reduces at once through each node's link (hierarchical's
# cross step, one per local rank) favour mpicoll's algorithms from shorter
# messages than one alone: simulated, hierarchical's cross step at 8 per node
# on 16-64 nodes (sim/anchor.c's cross_allreduce, docs/scale.md
# "hierarchical, simulated"): with 128 KiB and 512 KiB slices Rabenseifner
# took 0.42-0.70x the time of MPICH's call on the fat tree, 0.33-0.49x on
# 1 Gbit/s, where one all-reduce alone of 128-256 KiB was 1.1-1.6x faster
# through MPICH's call on the fat tree. No smaller slice was simulated: the
# cross slices of auto's hierarchical (from 1 MiB at 8 per node) start here.
CONCURRENT_ACROSS_NODES_MIN_BYTES = 128 << 10


def _across_min_bytes(concurrent: int) -> int:
    return ACROSS_NODES_MIN_BYTES if concurrent <= 1 else CONCURRENT_ACROSS_NODES_MIN_BYTES


def _across_nodes(p, nbytes, ranks_per_node, nodes, available, concurrent=1) -> Optional[Choice]:
    least = _across_min_bytes(concurrent)
    if nbytes < least:
        return None
    spread = (f"{nodes} nodes of up to {ranks_per_node} ranks" if ranks_per_node > 1
              else f"one rank on each of {nodes} nodes")
    shared = f", {concurrent} all-reduces at once per node" if concurrent > 1 else ""
    where = f"{spread}{shared} and >= {least} B (simulated)"
    if ranks_per_node > 1:
        if nbytes >= CASCADE_MIN_BLOCK_BYTES * p and available("cascade"):
            return Choice("cascade", f"default: {where}, blocks of >= {CASCADE_MIN_BLOCK_BYTES} B, no "
                                     "shared-memory algorithm: the cascade spreads each node's inter-node "
                                     "traffic over all its ranks, where flat algorithms crowd the node's one link")
        return None
    pof2 = p & (p - 1) == 0
    if not pof2 and nbytes >= ACROSS_NODES_RING_MIN_BLOCK_BYTES * p and available("ring"):
        return Choice("ring", f"default: {where}, p={p} not a power of two and blocks of >= "
                              f"{ACROSS_NODES_RING_MIN_BLOCK_BYTES} B: the ring has no fold-in")
    if pof2 and nbytes >= ACROSS_NODES_POF2_RING_MIN_BLOCK_BYTES * p and available("ring"):
        return Choice("ring", f"default: {where}, blocks of >= {ACROSS_NODES_POF2_RING_MIN_BLOCK_BYTES} B: the "
                              "ring's pipelined reductions outweigh its 2(p-1) steps")
    if available("rabenseifner"):
        return Choice("rabenseifner", f"default: {where}: halving/doubling moves "
                                      f"2(p-1)/p n bytes in {2 * (p.bit_length() - 1)} steps"
                                      + ("" if pof2 else " plus a fold"))
    return None


# ---- uneven links: hetero_ring, only with weights ------------------------------------
# Measured on the namespace test bed (docs/algorithms.md, hetero_ring: 4
# hosts, one on 1 Gbit/s, the others on 10 Gbit/s): with the measured
# weights 0.71x the ring's time at 4 MiB, 0.89x at 16-64 MiB. Without
# weights there is nothing to size the blocks by (equal weights are the
# plain ring), so auto never guesses them: it takes hetero_ring only when
# the weights are given and differ. Simulated on platforms/hetero-8x1.xml
# (docs/scale.md), the weights from the nominal rates were slower than the
# ring (the heuristic overloads the fast links' chain): measured weights
# are the ones that paid.
HETERO_MIN_BYTES = 4 << 20


def _uneven_links(p, nbytes, weights, available) -> Optional[Choice]:
    if weights is None or len(weights) != p or len(set(weights)) < 2 or nbytes < HETERO_MIN_BYTES \
            or not available("hetero_ring"):
        return None
    return Choice("hetero_ring", f"uneven links (weights {list(weights)}) and >= {HETERO_MIN_BYTES} B: the ring "
                                 "with blocks sized to the links relieves the slow ones (measured 0.71-0.89x the "
                                 "plain ring on the test bed with measured weights)",
                  knobs=(("weights", tuple(weights)),))


# How a profile rule's reason names where the rule came from (profile.SOURCES).
_RULE_SOURCES = {"measured": "measured on this machine", "model": "predicted by the fitted cost model",
                 "simulated": "simulated on a SimGrid platform"}


def _from_profile(profile, p, nbytes, native_dtype, available) -> Optional[Choice]:
    where = profile.path or "tuning profile"
    rule = profile.lookup(p, nbytes, native_dtype, available)
    if rule is not None:
        what = _RULE_SOURCES.get(rule.source, rule.source)
        note = f": {rule.note}" if rule.note else ""
        return Choice(rule.algorithm, f"profile entry ({what}) in {where}: {rule.describe()}{note}",
                      rule.segment_bytes)
    model = getattr(profile, "model", None)
    if model is None or not native_dtype:  # the model is fitted on native dtypes only
        return None
    candidates = [a for a in _model.P2P + ("mpi",) if available(a) and _model.family(a) in model.params]
    if not candidates:
        return None
    t, name = _model.best(model, p, nbytes, candidates)
    return Choice(name, f"model fitted in {where} (no rule covers p={p}, {nbytes} B): "
                        f"predicted {t * 1e6:.1f} us, the least of {', '.join(candidates)}")


# Rooted reduce of a dtype MPI cannot reduce: the k-nomial tree (radix 4,
# knomial.RADIX) for short messages on many ranks. Simulated (SimGrid,
# docs/scale.md "k-nomial"; p = 64 and 256, 8 ranks per node, both
# platforms): 1.1-1.9x faster than the binomial tree up to 4 KiB (half the
# levels; a parent's k-1 receives share one wait), slower from 16 KiB on 1
# Gbit/s (the root takes in 3 whole vectors per level). For the all-reduce
# it never paid: recursive doubling, log2 p exchanges with no root, was
# faster at every short size simulated (0.5-0.9x the k-nomial's time on
# the fat tree, within 10 % on 1 Gbit/s).
KNOMIAL_REDUCE_MAX_BYTES = 4 << 10
KNOMIAL_MIN_P = 16


def native_first(collective: str, p: int, nbytes: int, *, native_dtype: bool = True, available=None) -> Choice:
    """reduce_scatter, allgather, bcast, reduce: the MPI library's own call
    unless it cannot reduce the dtype (float16, bfloat16), then our ring /
    tree (k-nomial for short reduces on many ranks)."""
    if native_dtype or collective in ("allgather", "bcast"):
        return Choice("mpi", "the MPI library's own implementation")
    if collective == "reduce_scatter":
        return Choice("ring", "no native MPI reduction for this dtype: ring reduce-scatter")
    if collective == "reduce" and p >= KNOMIAL_MIN_P and nbytes <= KNOMIAL_REDUCE_MAX_BYTES \
            and (available or (lambda a: _registered_for("reduce", a)))("knomial"):
        return Choice("knomial", f"no native MPI reduction for this dtype, p={p} >= {KNOMIAL_MIN_P} and <= "
                                 f"{KNOMIAL_REDUCE_MAX_BYTES} B: the k-nomial tree has half the binomial "
                                 "tree's levels (simulated 1.1-1.9x faster)")
    return Choice("tree", "no native MPI reduction for this dtype: binomial tree")


def simple(*args, **kwargs) -> Choice:
    """Deprecated name of :func:`native_first` (it said nothing of the rule)."""
    import warnings

    warnings.warn("mpicoll.select.simple is now mpicoll.select.native_first", DeprecationWarning, stacklevel=2)
    return native_first(*args, **kwargs)


def _registered_for(collective: str, name: str) -> bool:
    return has(collective, name)


# ---- shared memory: shm on one node, hierarchical across nodes ----
# Measured with `make bench-shm` / `make bench-testbed` (2-core machine,
# MPICH wheel, float32 sum; docs/shm.md): shm beat MPI_Allreduce from 256 KiB
# at p=2 and 4 on one node (64 KiB: 0.9x at p=2), the two-level algorithm
# from 1 MiB on the namespace test bed (256 KiB: 0.9-1.0x).
SHM_MIN_BYTES = 256 << 10
HIERARCHICAL_MIN_BYTES = 1 << 20
# ... but since the ring runs as a compiled program in the C executor it
# beats shm on one node at every size measured (docs/shm.md, "Since the
# executor": p = 2, 3, 4, float32 and bfloat16, 256 KiB - 4 MiB, ring 1.2-2x
# faster than shm): up to this many ranks per node auto takes the ring
# there. Beyond it (not measurable on the 2-core machine) shm stays: its two
# syncs per chunk do not grow with p, the ring's 2(p-1) steps do.
SHM_MIN_RANKS_PER_NODE = 5
# ... and, from 5 ranks per node, up to blocks of this many bytes per rank:
# beyond, the pipelined ring was as fast or faster on one node in every
# measurement (float32 sum, idle machine: p=2 8-64 MiB ring 0.26-0.91x
# native vs shm 0.40-1.22x; p=4 8 MiB shm 0.70x vs ring 0.92x, 32-64 MiB a
# tie within 10%): shm copies every byte into the window and out again,
# the ring streams it.
SHM_MAX_BLOCK_BYTES = 4 << 20
# ... but a kept *blocking* shm call of one chunk now runs whole in C
# (shm.program, the executor's shared-memory step: no Python per step). On one node it beat MPI_Allreduce
# through mpicoll, the compiled ring and the native call in these ranges
# (float32 sum, MPICH, median us; `python -m mpicoll.bench allreduce --mode
# out --stat median --repeat 5 --algorithms shm,ring,mpi`, two runs at p=2):
# p=2: 8 KiB shm 7.0-11.1 vs ring 8.7-12.0, mpi 8.7-12.0; 16-64 KiB shm
# 8.3-15.6 vs 15.7-23.1 and 16.8-29.1; 128 KiB once each way (24 vs 32, 72
# vs 62), 256 KiB - 1 MiB the ring (105 vs 127, 357 vs 520). p=3 (three
# ranks on two cores): 16 KiB - 4 MiB shm 42-1846 vs ring 52-2355 (1 MiB
# 239 vs 475). p=4: 16 KiB - 4 MiB shm 45-2986 vs ring 73-3309, mpi 81-5020;
# at 8 KiB mpi (58 vs 74). Measured again at p=2 on a later session's
# machine (same command, --sizes 64K..8M, two runs), shm's C path won from
# 64 KiB to 4 MiB: 64 KiB 8.4 vs ring 18.1, 256 KiB 16.1 vs 36.5, 1 MiB
# 59.4 vs 111.9, 2 MiB 128.9 vs 209.1, 4 MiB 305 vs 333 us (MPI_Allreduce
# 18.1 / 43.7 / 154.6 / 290.5 / 502.5); 8 MiB the ring (6.4-6.7 vs 7.6
# GB/s); 8-32 KiB shm too (1.5 vs 1.2, 2.8 vs 1.2, 4.9 vs 2.2 GB/s). The
# earlier p=2 runs' 256 KiB - 1 MiB figures for shm were 4-8x these: the
# upper end follows the later ones, as p=3-4's does. ranks per node ->
# (from, to) bytes.
SHM_DIRECT_RANGE = {2: (8 << 10, 4 << 20), 3: (16 << 10, 4 << 20), 4: (16 << 10, 4 << 20)}
# Nonblocking and persistent calls (shm's C path runs them too, a sync
# tested per pass) against the others' nonblocking forms: `iallreduce(x,
# out=y, algorithm=A).wait()`, median of 5 interleaved rounds, slowest
# rank, float32, us (p = 2 / 3 / 4): 16 KiB shm 18.8 / 58.1 / 88.3 vs ring
# 26.3 / 65.0 / 121.8, mpi 31.3 / 100.2 / 127.1; 64 KiB shm 50.5 / 158 /
# 184 vs mpi 44.0 / 197 / 294 (the generator ring, woken thread, 405-2004);
# 1 MiB shm 185 / 886 / 1108 vs mpi 260 / 1804 / 1654, ring 583-3467; 4 MiB
# shm 958 / 2243 / 3235 vs mpi 1237 / 5496 / 6156; 8 KiB a tie at p = 2
# and 4 (18.4 vs 15.5-17.8, 65.5 vs 71.2).
SHM_DIRECT_RANGE_NONBLOCKING = {2: (16 << 10, 4 << 20), 3: (16 << 10, 4 << 20), 4: (16 << 10, 4 << 20)}
# Across nodes with a dtype MPI cannot reduce (float16, bfloat16: the DDP
# compression hooks' buckets), the alternative to the two-level algorithm
# is not MPI_Allreduce but our flat ones, which send the whole vector over
# the slow links. Measured on the test bed (2 hosts x 2 ranks, 1 Gbit/s,
# float16 sum, ms): hierarchical 0.47 vs recursive doubling 1.05 and
# Rabenseifner 1.06 at 64 KiB, 2.27 vs 4.36/4.37 at 256 KiB, 4.76 vs
# 8.99/12.75 at 512 KiB; at 16 KiB a tie (0.40 vs 0.36).
HIERARCHICAL_MIN_BYTES_NOT_NATIVE = 64 << 10
# ... and for MPI dtypes, the cascade instead of hierarchical once each
# rank's block n/p is at least this long. Simulated with shm's pipeline
# priced (docs/scale.md, "hierarchical, simulated": p = 32..512, 8 per
# node, 1-16 MiB, both platforms; hierarchical with Rabenseifner across,
# the cascade): on the fat tree the cascade was 1.3-1.8x faster from 16 KiB
# blocks, 1.04-1.11x at 8 KiB (shm's copies in and out of the window,
# serial with its reduction, cost more than the cascade's pipelined
# intra-node ring); on 1 Gbit/s links the two were within 3 % from 16 KiB
# (once 6 %), hierarchical 1.11-1.15x faster at 8 KiB and 1.3-1.6x at 2-4
# KiB (the cascade's cross ring has 2(N-1) steps; on the fat tree too,
# 1.2-1.8x). 16 KiB: the smaller worst case of the two platforms (11 %
# against 15 % at 8 KiB). On the namespace test bed (3 hosts x 2 ranks, 1 Gbit/s,
# docs/algorithms.md) the cascade measured 0.80x hierarchical's time at
# 1 MiB and the same at 4-16 MiB.
CASCADE_OVER_HIERARCHICAL_MIN_BLOCK_BYTES = 16 << 10


def _shared_memory_rule(p: int, nbytes: int, ranks_per_node: int, nodes: int, native_dtype: bool, available,
                        nonblocking: bool = False, deadline: bool = False):
    if ranks_per_node < 2:
        return None
    ranges = SHM_DIRECT_RANGE_NONBLOCKING if nonblocking else SHM_DIRECT_RANGE
    direct = ranges.get(ranks_per_node) if nodes == 1 and not deadline else None
    if direct is not None and direct[0] <= nbytes <= direct[1]:
        return Choice("shm", f"{ranks_per_node} ranks on one node, a {'non' if nonblocking else ''}blocking call of "
                             f"{direct[0]}-{direct[1]} B: shm's one-chunk call runs in C (measured fastest there)")
    if nodes == 1 and nbytes >= SHM_MIN_BYTES and ranks_per_node < SHM_MIN_RANKS_PER_NODE:
        return Choice("ring", f"{ranks_per_node} ranks on one node and >= {SHM_MIN_BYTES} B: the compiled "
                              "ring beat shm at every size measured on up to 4 ranks per node")
    if nodes == 1 and nbytes >= SHM_MAX_BLOCK_BYTES * ranks_per_node:
        return Choice("ring", f"{ranks_per_node} ranks on one node and blocks of >= {SHM_MAX_BLOCK_BYTES} B "
                              "per rank: the pipelined ring streams what shm would copy in and out")
    if nodes == 1 and nbytes >= SHM_MIN_BYTES:
        return Choice("shm", f"{ranks_per_node} ranks on one node and >= {SHM_MIN_BYTES} B: "
                             "reduce through a shared-memory window, one pass per slice")
    least = HIERARCHICAL_MIN_BYTES if native_dtype else HIERARCHICAL_MIN_BYTES_NOT_NATIVE
    if nodes > 1 and nbytes >= least and native_dtype \
            and nbytes >= CASCADE_OVER_HIERARCHICAL_MIN_BLOCK_BYTES * p and available("cascade"):
        return Choice("cascade", f"{nodes} nodes of up to {ranks_per_node} ranks, >= {least} B and blocks of >= "
                                 f"{CASCADE_OVER_HIERARCHICAL_MIN_BLOCK_BYTES} B (simulated): the cascade, every rank of "
                                 "a node carrying its shard across nodes, beat hierarchical's copies into a shared "
                                 "window and out")
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
# shift exchange (1.7-2.4x at p=4, 1.0-1.2x at p=2) beat the native call. Bruck never
# did (0.03-0.7x: its per-round packing and messages cost more in Python
# than MPICH's Bruck in C), and linear/tree scatter and gather were
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
        return Choice("shift", f"default: >= {FAMILY_RING_MIN_BLOCK_BYTES} B per rank: the windowed shift "
                              "exchange beat MPI_Alltoall in the measurements")
    if nbytes < 0:
        return Choice("mpi", "the ranks know only their own counts, so the rule cannot depend on size: "
                             "the MPI library's own implementation")
    return Choice("mpi", "default: short messages (mpicoll's per-call cost dominates) or no algorithm "
                         "measured faster: the MPI library's own implementation")
