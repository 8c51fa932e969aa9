"""Which of auto's all-reduce choices a change to mpicoll/select.py moved.

    python sim/auto_diff.py [--base 0500051] [--p 2,3,4,5,8,16,64,256,1024]

loads select.py as it was at git revision ``--base`` beside the working
tree's, asks both the same questions (select.allreduce is a pure function
of its arguments) over process counts, sizes 8 B..256 MiB in powers of 4,
three layouts (one rank per node; every rank on one node; 8 ranks per
node, also without shm/hierarchical) and two dtypes (float32, native to
MPI; float16, not), and prints
every cell where the answers differ, then a count per layout. No profile:
the fixed defaults only (a profile decides first, unchanged).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import mpicoll  # noqa: E402,F401  (the package the old module's relative imports resolve in)
from mpicoll import select  # noqa: E402


def load_old(rev: str):
    """select.py at ``rev``, as module ``mpicoll._select_at_<rev>``."""
    src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:mpicoll/select.py"], check=True,
                         capture_output=True, text=True).stdout
    name = f"mpicoll._select_at_{rev.replace('-', '_').replace('~', '_')}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "mpicoll"
    exec(compile(src, f"{rev}:mpicoll/select.py", "exec"), mod.__dict__)
    return mod


def layouts(p: int):
    """(label, ranks_per_node, nodes) for p ranks."""
    out = [("1 per node", 1, p), ("one node", p, 1)]
    if p > 8:
        out.append(("8 per node", 8, -(-p // 8)))
    return out


def _no_shared(name):
    from mpicoll.algorithms import has

    return has("allreduce", name) and name not in ("shm", "hierarchical")


def diff(old, new, ps, sizes):
    """[(p, nbytes, layout, dtype, old name, new name, new reason)] where they
    differ; layouts of several nodes with several ranks each also asked
    without the shared-memory algorithms (no shared-memory window)."""
    rows = []
    for p in ps:
        for label, rpn, nodes in layouts(p):
            avails = [(label, None)] + ([(label + ", no shm window", _no_shared)] if rpn > 1 and nodes > 1 else [])
            for lab, avail in avails:
                for dtype, native in (("float32", True), ("float16", False)):
                    for n in sizes:
                        kw = dict(native_dtype=native, ranks_per_node=rpn, nodes=nodes, available=avail)
                        a = old.allreduce(p, n, "sum", dtype, **kw)
                        b = new.allreduce(p, n, "sum", dtype, **kw)
                        if a.name != b.name:
                            rows.append((p, n, lab, dtype, a.name, b.name, b.reason))
    return rows


def _size(n):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="0500051", help="git revision of the old select.py")
    ap.add_argument("--p", default="2,3,4,5,8,16,64,256,1024")
    ap.add_argument("--reasons", action="store_true", help="print the new choice's reason too")
    a = ap.parse_args(argv)
    ps = [int(x) for x in a.p.split(",")]
    sizes = [8 << (2 * k) for k in range(13)] + [1 << 20, 16 << 20]  # 8 B .. 128 MiB, and 1 / 16 MiB
    sizes = sorted(set(sizes))
    rows = diff(load_old(a.base), select, ps, sizes)
    print(f"auto's all-reduce choices that differ from {a.base}'s select.py (no profile):")
    print("| p | size | layout | dtype | before | after |")
    print("|---|---|---|---|---|---|")
    for p, n, label, dtype, x, y, why in rows:
        print(f"| {p} | {_size(n)} | {label} | {dtype} | {x} | {y} |" + (f" {why}" if a.reasons else ""))
    counted = {}
    for r in rows:
        counted[r[2]] = counted.get(r[2], 0) + 1
    print(f"{len(rows)} cells changed: " + (", ".join(f"{k}: {v}" for k, v in sorted(counted.items())) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
