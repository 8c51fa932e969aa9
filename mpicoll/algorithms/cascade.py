"""Cascade all-reduce: every rank of a node carries its share of the inter-node traffic.

Function:     allreduce(ctx, buf, red, src=None, *, ppn=None, cross=None)
Description:  The vector is cut into K shards (K = ranks on the largest
              node; np.array_split convention). On a node of L ranks, shard
              j belongs to local rank j mod L (one shard each when L = K,
              several on a smaller node). Three phases, all point-to-point
              on the one communicator:

              1. intra-node reduce-scatter: every rank sends each shard it
                 does not own to the node's owner of that shard, all at
                 once; the owner combines its own copy and the others (in
                 local rank order) into ``buf``: the node-partial shard;
              2. across nodes: for each shard j it owns, in increasing j,
                 a rank all-reduces the node-partial shard in place with the
                 owners of shard j on every other node (one rank per node,
                 ordered by node): K all-reduces run at once, each of n/K
                 bytes, by ring or recursive doubling (``cross``);
              3. intra-node allgather: every owner sends its finished shards
                 to the other ranks of its node.

                  2 nodes x 3 ranks {0,1,2} {3,4,5}, shards s0 s1 s2
                  1.  0,1,2 -> owners of s0 s1 s2 (ranks 0 1 2); same on 3,4,5
                  2.  0 <-> 3 all-reduce s0   1 <-> 4 s1   2 <-> 5 s2
                  3.  0 -> 1,2: s0   1 -> 0,2: s1   2 -> 0,1: s2; same on 3,4,5

              The layout: ``ppn=k`` takes nodes of k consecutive ranks (the
              last one may be smaller), a pure function of (rank, size, ppn)
              so that it can be simulated and used on a test bed; by default
              it is the communicator's real node layout (``mpicoll.node``,
              which ``MPICOLL_FAKE_NODE_SIZE`` can fake on one machine),
              found by the ``prepare`` hook at call time.
Cost:         With N nodes of L ranks (p = N L), per rank: intra-node
              2 (L-1) messages of n/L bytes ((L-1)/L n reduced); across
              nodes the cross all-reduce of n/L bytes among N ranks, with a
              ring 2 (N-1) alpha + 2 (N-1)/N n/L beta + (N-1)/N n/L gamma,
              all L rings of a node at once. Each node's network link thus
              carries 2 (N-1)/N n in total, shared by its L ranks (a flat
              ring sends 2 (p-1)/p n through the one rank at the node's
              boundary), in 2 (N-1) + 2 (L-1) latency steps instead of
              2 (p-1), and without the leader bottleneck of a two-level
              algorithm where one rank per node sends all 2 (N-1)/N n
              bytes (``hierarchical`` with uneven nodes).
Limitations:  Intra-node messages go through MPI (the ``hierarchical``
              algorithm uses a shared-memory window instead): this one is
              for when the network, not the node's memory, is the
              bottleneck, or shared memory is unavailable. On a smaller
              node a rank owns several shards and carries several cross
              all-reduces one after the other (the slowest node sets the
              pace). Each shard is reduced once per node and once across
              nodes and then copied, so every rank ends with the same bits;
              the order of operations differs from the serial rank order.
"""
from __future__ import annotations

from ..registry import get as _get, register
from .common import block_bounds
from ..node import node_info

# Below this many bytes per shard the cross all-reduce is latency-bound:
# recursive doubling's log2(N) steps beat the ring's 2 (N-1) (select.py
# makes the same trade for flat all-reduces at larger sizes, where each
# step also pays Python's per-message cost).
CROSS_RING_MIN_BYTES = 64 << 10
# Point-to-point all-reduce schedules that can run on a group of ranks.
CROSS = ("ring", "recursive_doubling", "rabenseifner", "tree", "knomial")


def layout(size: int, ppn: int) -> list:
    """Nodes of ``ppn`` consecutive ranks (the last one may be smaller)."""
    if isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1:
        raise ValueError(f"mpicoll: cascade ppn must be an integer >= 1, got {ppn!r}")
    return [list(range(a, min(a + ppn, size))) for a in range(0, size, ppn)]


class GroupContext:
    """A schedule context for a group of ranks of ``ctx``'s communicator:
    rank and size within ``members`` (a list of communicator ranks), peers
    translated on the way out. Same call, tag and scratch pool as ``ctx``,
    so a group's messages are the call's messages (distinct groups that
    share a pair of ranks run one after the other on both of them, and MPI
    matches a pair's messages in posting order)."""

    __slots__ = ("base", "members", "rank", "size")

    def __init__(self, base, members, rank):
        self.base, self.members, self.rank, self.size = base, members, rank, len(members)

    @property
    def phase(self):
        return self.base.phase

    @phase.setter
    def phase(self, value):
        self.base.phase = value

    def send(self, buf, peer):
        return self.base.send(buf, self.members[peer])

    def recv(self, buf, peer):
        return self.base.recv(buf, self.members[peer])

    def start(self, *ops):
        return self.base.start(*ops)

    def scratch(self, name, n, dtype):
        return self.base.scratch(name, n, dtype)

    def copy(self, dst, src):
        return self.base.copy(dst, src)


def prepare(st, buf, red=None, **knobs) -> None:
    """Call-time set-up (collective): the node layout, unless ``ppn`` gives it."""
    if knobs.get("ppn") is None:
        node_info(st)


def _check_cross(cross):
    if cross is not None and cross not in CROSS:
        raise ValueError(f"mpicoll: cascade cross must be one of {', '.join(CROSS)} (or None), got {cross!r}")


# compilable: the messages depend on the layout, fixed per communicator,
# never on the data; copies go through ctx.copy (program.py's contract).
@register("allreduce", "cascade", knobs=("ppn", "cross"), prepare=prepare,
          check_values=lambda knobs: _check_cross(knobs.get("cross")), compilable=True)
def allreduce(ctx, buf, red, src=None, *, ppn=None, cross=None):
    _check_cross(cross)
    p, rank = ctx.size, ctx.rank
    if ppn is not None:
        nodes = layout(p, ppn)  # checks ppn before anything else
    if p == 1:
        if src is not None:
            ctx.copy(buf, src)
        return
    if ppn is None:
        nodes = node_info(ctx.st).node_ranks
    mine = next(m for m in nodes if rank in m)
    node = nodes.index(mine)
    L, me = len(mine), mine.index(rank)
    k = max(len(m) for m in nodes)
    shards = block_bounds(buf.size, k)
    owned = [j for j in range(me, k, L) if shards[j][1] > shards[j][0]]
    own = buf if src is None else src

    # 1. intra-node reduce-scatter, straight to each shard's owner.
    ctx.phase = "cascade: intra-node reduce-scatter"
    others = [q for q in range(L) if q != me]
    width = sum(shards[j][1] - shards[j][0] for j in owned)
    tmp = ctx.scratch("cascade", (L - 1) * width, buf.dtype)
    parts, ops, at = {}, [], 0
    for j in owned:
        a, b = shards[j]
        parts[j] = []
        for q in others:
            part = tmp[at:at + b - a]
            at += b - a
            parts[j].append(part)
            ops.append(ctx.recv(part, mine[q]))
    for j, (a, b) in enumerate(shards):
        if b > a and j % L != me:
            ops.append(ctx.send(own[a:b], mine[j % L]))
    if ops:
        yield ops
    for j in owned:
        a, b = shards[j]
        if parts[j]:
            red.combine_many(buf[a:b], [own[a:b]] + parts[j])  # ours first, then local rank order
        elif src is not None:
            ctx.copy(buf[a:b], src[a:b])

    # 2. across nodes: shard j among its owners on every node, in increasing j
    # on every rank (a rank owning several shards takes part in several groups).
    if len(nodes) > 1:
        for j in owned:
            a, b = shards[j]
            group = [m[j % len(m)] for m in nodes]
            view = buf[a:b]
            name = cross or ("ring" if view.nbytes >= CROSS_RING_MIN_BYTES else "recursive_doubling")
            ctx.phase = ("cascade: across nodes, shard", j)
            yield from _get("allreduce", name).schedule(GroupContext(ctx, group, node), view, red, None)

    # 3. intra-node allgather from each shard's owner.
    ctx.phase = "cascade: intra-node allgather"
    ops = []
    for j, (a, b) in enumerate(shards):
        if b == a:
            continue
        if j % L == me:
            ops += [ctx.send(buf[a:b], mine[q]) for q in others]
        else:
            ops.append(ctx.recv(buf[a:b], mine[j % L]))
    if ops:
        yield ops
