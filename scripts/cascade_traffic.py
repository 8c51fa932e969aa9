"""Cascade vs hierarchical: network messages and bytes per rank in the counting simulator (float32 sum).

hierarchical cannot run in the simulator (its intra-node steps are a shared-memory window), so its
network part is simulated alone, as it runs: the ring all-reduce of an n/L slice among the N nodes
on every local rank (equal nodes), or of the whole n among the nodes' local rank 0 (uneven nodes).
Usage: PYTHONPATH=. python scripts/cascade_traffic.py
"""
import numpy as np
from mpicoll import dtypes, ops, schedule
from mpicoll.algorithms import get
from mpicoll.kernels import Reduction

dt = dtypes.BY_NAME["float32"]
red = Reduction(ops.resolve("sum"), dt)

def sim(name, p, count, log, **knobs):
    bufs = [np.ones(count, np.float32) for _ in range(p)]
    class Rec(schedule._Network):
        def post(self, op):
            if op.kind == schedule.SEND:
                log.append((op.ctx.rank, op.peer, op.buf.nbytes))
            super().post(op)
    old = schedule._Network
    schedule._Network = Rec
    try:
        st = schedule.simulate(p, lambda ctx, s: get("allreduce", name).schedule(ctx, bufs[ctx.rank], schedule.CountingReduction(red, s), None, **knobs))
    finally:
        schedule._Network = old
    assert all((b == p).all() for b in bufs)
    return st

def split(log, node_of, p):
    inter = [[0, 0] for _ in range(p)]; intra = [[0, 0] for _ in range(p)]
    for s, d, n in log:
        t = inter if node_of[s] != node_of[d] else intra
        t[s][0] += 1; t[s][1] += n
    return inter, intra

print(f"{'layout':<16} {'MiB':>4} | {'cascade: inter msgs/rank max':>28} {'inter MiB/rank max':>18} {'node total MiB':>14} {'intra msgs':>10} {'intra MiB':>9} | {'hier. inter msgs max':>20} {'MiB/rank max':>12} {'node total':>10}")
for sizes, mib in [((8, 8), 16), ((8,) * 4, 16), ((8,) * 16, 16), ((4,) * 8, 1), ((8, 8, 5), 16), ((8,) * 3 + (2,), 16)]:
    p = sum(sizes); count = mib * (1 << 20) // 4
    nodes = []; a = 0
    for L in sizes:
        nodes.append(list(range(a, a + L))); a += L
    node_of = {r: m for m, ns in enumerate(nodes) for r in ns}
    ppn = sizes[0]
    log = []
    sim("cascade", p, count, log, ppn=ppn, cross="ring")
    inter, intra = split(log, node_of, p)
    N = len(sizes)
    # hierarchical: uniform -> every local rank j rings its n/L slice among N nodes; uneven -> local rank 0 rings all n
    hlog = []
    if len(set(sizes)) == 1:
        L = ppn
        st = sim("ring", N, count // L, hlog)
        hm = max(s.messages for s in st); hb = max(s.bytes_sent for s in st); htot = hb * L
    else:
        st = sim("ring", N, count, hlog)
        hm = max(s.messages for s in st); hb = max(s.bytes_sent for s in st); htot = hb
    node_tot = max(sum(inter[r][1] for r in ns) for ns in nodes)
    lay = "x".join(map(str, sizes)) if len(set(sizes)) > 1 else f"{N}x{sizes[0]}"
    M = 1 << 20
    print(f"{lay:<16} {mib:>4} | {max(x[0] for x in inter):>28} {max(x[1] for x in inter)/M:>18.2f} {node_tot/M:>14.2f} {max(x[0] for x in intra):>10} {max(x[1] for x in intra)/M:>9.2f} | {hm:>20} {hb/M:>12.2f} {htot/M:>10.2f}")
