"""Cascade vs hierarchical: network messages and bytes per rank in the counting simulator.

``hierarchical`` cannot run in the simulator (its intra-node steps are a
shared-memory window), so its network part is simulated alone, as it runs:
on equal nodes every local rank's ring all-reduce of its n/L slice among
the N nodes, on uneven nodes local rank 0's ring all-reduce of all of n.
The cascade runs whole, with a ring across nodes. float32 sums.

    PYTHONPATH=. python scripts/cascade_traffic.py

(docs/algorithms.md, "cascade", has the table it prints.)
"""
from __future__ import annotations

import numpy as np

from mpicoll import dtypes, ops, schedule
from mpicoll.algorithms import get
from mpicoll.kernels import Reduction

RED = Reduction(ops.resolve("sum"), dtypes.BY_NAME["float32"])
MIB = 1 << 20
# (ranks on each node, message MiB)
LAYOUTS = [((8, 8), 16), ((8,) * 4, 16), ((8,) * 16, 16), ((4,) * 8, 1), ((8, 8, 5), 16), ((8, 8, 8, 2), 16)]


def simulate(name, p, count, **knobs):
    """(per-rank SimStats, [(source, dest, bytes)] of every message) of one all-reduce."""
    log = []

    class Recorder(schedule._Network):
        def post(self, op):
            if op.kind == schedule.SEND:
                log.append((op.ctx.rank, op.peer, op.buf.nbytes))
            super().post(op)

    bufs = [np.ones(count, np.float32) for _ in range(p)]
    sched = get("allreduce", name).schedule
    saved, schedule._Network = schedule._Network, Recorder
    try:
        stats = schedule.simulate(p, lambda ctx, s: sched(ctx, bufs[ctx.rank], schedule.CountingReduction(RED, s),
                                                           None, **knobs))
    finally:
        schedule._Network = saved
    assert all((b == p).all() for b in bufs)
    return stats, log


def per_rank(log, node_of, p, across):
    """[messages, bytes] each rank sends to other nodes (across) or its own."""
    out = [[0, 0] for _ in range(p)]
    for src, dst, n in log:
        if (node_of[src] != node_of[dst]) == across:
            out[src][0] += 1
            out[src][1] += n
    return out


def main():
    print(f"{'layout':<10} {'MiB':>4} | cascade: {'inter msgs':>10} {'MiB/rank':>9} {'MiB/node':>9} "
          f"{'intra msgs':>10} {'intra MiB':>9} | hierarchical: {'inter msgs':>10} {'MiB/rank':>9} {'MiB/node':>9}")
    for sizes, mib in LAYOUTS:
        p, count, nodes = sum(sizes), mib * MIB // 4, len(sizes)
        node_of = [m for m, size in enumerate(sizes) for _ in range(size)]
        _, log = simulate("cascade", p, count, ppn=sizes[0], cross="ring")  # ppn nodes: the sizes above
        inter, intra = per_rank(log, node_of, p, True), per_rank(log, node_of, p, False)
        node_bytes = max(sum(b for (_, b), m in zip(inter, node_of) if m == k) for k in range(nodes))
        uniform = len(set(sizes)) == 1
        stats, _ = simulate("ring", nodes, count // sizes[0] if uniform else count)
        h_msgs, h_bytes = max(s.messages for s in stats), max(s.bytes_sent for s in stats)
        h_node = h_bytes * (sizes[0] if uniform else 1)
        name = f"{nodes}x{sizes[0]}" if uniform else "+".join(map(str, sizes))
        print(f"{name:<10} {mib:>4} | cascade: {max(m for m, _ in inter):>10} {max(b for _, b in inter) / MIB:>9.2f} "
              f"{node_bytes / MIB:>9.2f} {max(m for m, _ in intra):>10} {max(b for _, b in intra) / MIB:>9.2f} | "
              f"hierarchical: {h_msgs:>10} {h_bytes / MIB:>9.2f} {h_node / MIB:>9.2f}")


if __name__ == "__main__":
    main()
