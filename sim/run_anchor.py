"""Build sim/anchor.c with smpicc and run it under smpirun: the MPI library's
own collectives (SMPI's copies of MPICH's and Open MPI's algorithms and
selectors) on the same SimGrid platform as mpicoll's schedules.

    python sim/run_anchor.py --platform platforms/cluster-128x8-fattree.xml --ppn 8 \\
        --p 64,256,1024 --sizes 8,1K,64K,1M,16M,64M --selector mpich \\
        --json bench-out/native-cluster-mpich.json

Writes {"selector", "platform", "ppn", "rows": [{"collective", "p", "bytes",
"time_s"}], "wall_s"}, the input of ``python -m mpicoll.simulate --native``.

Each (p, collective) is one smpirun (SMPI 3.32 deadlocked here when one run
switched from a large MPI_Allreduce to another collective). The runs use
SimGrid's CM02 network model (the platform files' <config> asks for it, but
smpirun's own default overrides a platform's, so it is passed again) and
``smpi/simulate-computation:no``: the program computes nothing between
calls. ``-no-privatize``: the anchor has no global variables to keep per
rank, and privatization copies the binary once per rank (slow at p = 1024,
and the copy fails outright from some file systems). SMPI does not price the reductions inside its collectives (checked:
a 64 MiB MPI_Allreduce at p = 2 takes exactly its transfer time), which
mpicoll.simulate's --native comparison adds back (docs/scale.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "anchor.c")


def build(out_dir: str) -> str:
    """smpicc the anchor into ``out_dir`` (when older than its source)."""
    os.makedirs(out_dir, exist_ok=True)
    exe = os.path.abspath(os.path.join(out_dir, "anchor"))
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(SOURCE):
        subprocess.run(["smpicc", "-O2", "-o", exe, SOURCE], check=True)
    return exe


def hostfile(path: str, p: int, ppn: int) -> None:
    """Ranks r*ppn .. r*ppn+ppn-1 on node r, as mpicoll.simulate places them."""
    nodes = -(-p // ppn)
    with open(path, "w") as f:
        for n in range(nodes):
            f.write(f"node{n}:{min(ppn, p - n * ppn)}\n")


def run_one(exe, platform, p, ppn, selector, collective, sizes, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hosts")
        hostfile(hf, p, ppn)
        cmd = ["smpirun", "-np", str(p), "-platform", os.path.abspath(platform), "-hostfile", hf, "-no-privatize",
               f"--cfg=smpi/coll-selector:{selector}", "--cfg=smpi/simulate-computation:no",
               "--cfg=network/model:CM02", "--log=root.thresh:critical",
               exe, collective, ",".join(map(str, sizes)), str(ppn)]  # ppn: cross_allreduce's split
        # smpirun's -tmpdir option misparses here; TMPDIR does the same. In
        # tmp also because smpirun leaves its unrolled hostfile in the
        # current directory when a run fails.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp,
                              env=dict(os.environ, TMPDIR=tmp))
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == collective:
            rows.append({"collective": collective, "p": int(parts[1]), "bytes": int(parts[2]),
                         "time_s": float(parts[3])})
    if len(rows) < len(sizes):
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        print(f"  smpirun p={p} {collective}: {len(rows)}/{len(sizes)} sizes (rc {proc.returncode}): "
              f"{' | '.join(tail)}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(HERE))
    from mpicoll.bench.timing import parse_sizes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", required=True)
    ap.add_argument("--ppn", type=int, default=8)
    ap.add_argument("--p", default="64,256,1024")
    ap.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    ap.add_argument("--large-p-sizes", default=None,
                    help="sizes for p >= --large-p (default: the same as --sizes)")
    ap.add_argument("--large-p", type=int, default=1024)
    ap.add_argument("--collectives", default="allreduce,bcast,reduce_scatter,allgather",
                    help="also cross_allreduce: hierarchical's step across nodes (one MPI_Allreduce of the "
                         "size on each of the --ppn communicators of one rank per node, at once)")
    ap.add_argument("--selector", default="mpich", help="SMPI's coll-selector: mpich, ompi, ...")
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(HERE), "build", "sim"))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per smpirun")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)

    exe = build(a.build_dir)
    t0 = time.perf_counter()
    rows = []
    for p in (int(x) for x in a.p.split(",")):
        sizes = parse_sizes(a.large_p_sizes if a.large_p_sizes and p >= a.large_p else a.sizes)
        for coll in a.collectives.split(","):
            t = time.perf_counter()
            got = run_one(exe, a.platform, p, a.ppn, a.selector, coll, sizes, a.timeout)
            rows += got
            print(f"  {a.selector} p={p} {coll}: " + ", ".join(f"{r['bytes']} B {r['time_s'] * 1e6:.1f} us"
                                                             for r in got)
                  + f"  (wall {time.perf_counter() - t:.1f} s)", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"selector": a.selector, "platform": a.platform, "ppn": a.ppn, "rows": rows, "wall_s": wall},
                  f, indent=1)
    print(f"{a.selector}: {len(rows)} rows in {wall:.1f} s -> {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
