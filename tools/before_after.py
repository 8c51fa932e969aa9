"""Blocking all-reduce before and after a change, measured in one run.

    python tools/before_after.py OLD_TREE [--new NEW_TREE] [--np 2,4] [--rounds 3] [--sizes 8:64M] [--algorithms ...]

OLD_TREE is a checkout of the earlier commit with its kernels built in place
(``git worktree add /tmp/old REV && cd /tmp/old && python setup.py
build_ext --inplace``). The two versions alternate (old, new, old, new...)
``--rounds`` times per process count, each a full ``python -m mpicoll.bench``
sweep; each (algorithm, size) keeps its best time per version, and the
table prints the speed-up old time / new time (> 1: the new code is faster)
next to each version's speed-up over MPI_Allreduce measured in the same
sweep (native time / its time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sweep(tree, np_, sizes, algorithms, out):
    env = dict(os.environ, MPICOLL_TUNING_FILE="none")
    if tree is not None:
        env["PYTHONPATH"] = tree
    cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(np_), sys.executable, "-m", "mpi4py",
           "-m", "mpicoll.bench", "--sizes", sizes, "--mode", "out", "--no-progress", "--json", out]
    if algorithms:
        cmd += ["--algorithms", algorithms]
    subprocess.run(cmd, check=True, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def best(results):
    """{(algorithm, bytes): (time, time / native time)} over the sweeps."""
    out = {}
    for res in results:
        for row in res["rows"]:
            if row.get("mode", "out") != "out":
                continue
            key = (row["algorithm"].split(" ")[0], row["bytes"])
            t = row["time_us"] * 1e-6
            if key not in out or t < out[key][0]:
                out[key] = (t, 1 / row["t_over_native"] if row.get("t_over_native") else None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("--new", default=None, help="the new tree (default: the installed mpicoll)")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="8:64M")
    ap.add_argument("--algorithms", default="ring,rabenseifner,recursive_doubling,tree,shm,mpi")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        for np_ in (int(x) for x in args.np.split(",")):
            runs = {"old": [], "new": []}
            for r in range(args.rounds):
                new = os.path.abspath(args.new) if args.new else None
                for which, tree in (("old", os.path.abspath(args.old)), ("new", new)):
                    runs[which].append(sweep(tree, np_, args.sizes, args.algorithms, f"{d}/{which}{r}.json"))
            old, new = best(runs["old"]), best(runs["new"])
            print(f"\n## p={np_}: speed-up old/new time (> 1: new faster); each version's speed-up over MPI_Allreduce")
            print("| algorithm | bytes | old us | new us | speed-up | old vs native | new vs native |")
            print("|---|---|---|---|---|---|---|")
            for key in sorted(set(old) & set(new)):
                (to, ro), (tn, rn) = old[key], new[key]
                fmt = (lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-")
                print(f"| {key[0]} | {key[1]} | {to * 1e6:.1f} | {tn * 1e6:.1f} | {to / tn:.2f} | {fmt(ro)} | {fmt(rn)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
