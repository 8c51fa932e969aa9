"""auto's regret before and after a change to mpicoll/select.py, from a study's JSON files.

    python sim/regret.py --platform platforms/cluster-128x8-fattree.xml --base 0500051 \\
        --mpicoll bench-out/sim2/mpicoll-fat.json --native bench-out/sim2/native-fat-mpich.json

For every simulated (p, size) of the files (one layout: their ppn), the best
of mpicoll's simulated algorithms and MPICH's call (priced as
``simulate.summarize`` does), then auto's choice and regret (its time / the
best - 1) with select.py at git revision ``--base`` and with the working
tree's, each twice: with every algorithm available, and without the
shared-memory ones (shm, hierarchical: what auto runs where MPI gives no
shared-memory window). hierarchical is priced from its plain row (its
cross algorithm decided as the working tree decides it; unknown where
that is MPI_Allreduce); ``--unpriced-before hierarchical`` leaves the
"before" column's hierarchical unpriced where its own code changed since
``--base`` (its cross choice did after e3a6111). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from auto_diff import _size, load_old  # noqa: E402
from report import load_rows  # noqa: E402

from mpicoll import select, simulate  # noqa: E402
from mpicoll.algorithms import has  # noqa: E402

SHARED = ("shm", "hierarchical")


def regrets(summary, ppn, modules, unpriced_before=()):
    """Per summary row: [(label, choice, seconds or None, regret or None)]
    for each (module label, module) and both availabilities; a "before"
    choice named in ``unpriced_before`` gets no time."""
    out = []
    for s in summary:
        cand = dict(s["times"])
        if s["mpi_priced"] is not None:
            cand["mpi"] = s["mpi_priced"]
        cells = []
        for label, mod in modules:
            for shared in (True, False):
                def avail(name, shared=shared):
                    return has("allreduce", name) and (shared or name not in SHARED)

                nodes = -(-s["p"] // ppn)
                c = mod.allreduce(s["p"], s["bytes"], "sum", "float32", ranks_per_node=min(ppn, s["p"]),
                                  nodes=nodes, available=avail)
                t = None if label == "before" and c.name in unpriced_before else cand.get(c.name)
                r = None if t is None or s["best_s"] is None else t / s["best_s"] - 1
                cells.append((label + ("" if shared else ", no shm window"), c.name, t, r))
        out.append((s, cells))
    return out


def _cell(name, t, r):
    if t is None:
        return f"{name} (not simulated)"
    return f"{name} {r:.0%}" + (" **>10 %**" if r > 0.10 else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", required=True)
    ap.add_argument("--mpicoll", required=True, nargs="+", help="python -m mpicoll.simulate --json outputs")
    ap.add_argument("--native", nargs="*", default=[], help="sim/run_anchor.py --json outputs (MPICH)")
    ap.add_argument("--base", default="0500051", help="git revision of the 'before' select.py")
    ap.add_argument("--unpriced-before", nargs="*", default=[],
                    help="algorithms whose 'before' runs are not the simulated ones (their code changed)")
    a = ap.parse_args(argv)
    rows, ppn = load_rows(a.mpicoll, ap.error)
    plat = simulate.load_platform(a.platform)
    summary = simulate.summarize(rows, plat, ppn, simulate.load_native(a.native))
    table = regrets(summary, ppn, [("before", load_old(a.base)), ("after", select)], a.unpriced_before)
    heads = [label for label, *_ in table[0][1]] if table else []
    print(f"{os.path.basename(a.platform)}, {ppn} per node; auto's choice and regret (time / best - 1)")
    print("| p | size | best (us) | " + " | ".join(heads) + " |")
    print("|---" * (3 + len(heads)) + "|")
    for s, cells in table:
        print(f"| {s['p']} | {_size(s['bytes'])} | {s['best']} {s['best_s'] * 1e6:.0f} | "
              + " | ".join(_cell(n, t, r) for _, n, t, r in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
