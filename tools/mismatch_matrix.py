"""Try every kind of cross-rank mismatch on every all-reduce algorithm,
with and without the pre-flight check, and print what happened as a
markdown table (docs/reliability.md).

    .venv/bin/python tools/mismatch_matrix.py [--np 3] [--timeout 20] [--deadline 2]

Each case is its own ``mpiexec -n NP python -m mpi4py`` job in which the
last rank passes a different argument. Nothing is caught: the program
behaves like a user's program would (a rank that raises MismatchError
prints a line and re-raises 2 s later, so that the table can show which
ranks raised before the first abort ends the job); "aborted" means mpi4py's
abort-on-exception ended the job, and "HANG" means the job was still
running at the timeout and was killed. The last two columns run the same
cases with a deadline (``timeout=DEADLINE`` on every call), check off and
on: "CollectiveTimeout on rank(s) ..." names the ranks whose deadline
passed before the job ended. The summary counts hangs, errors and
silently wrong results per column.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time

BIN = os.path.dirname(sys.executable)

SCRIPT = textwrap.dedent("""
    import sys, hashlib, time
    import numpy as np
    from mpi4py import MPI
    import mpicoll
    case, algorithm, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    deadline = float(sys.argv[4]) if len(sys.argv) > 4 else None
    comm = MPI.COMM_WORLD
    odd = comm.rank == comm.size - 1
    n, dtype, op, root = 1000, "float32", "sum", 0
    if case == "count-short" and odd: n = 999
    if case == "count-long" and odd: n = 1001
    if case == "dtype-size" and odd: dtype = "float64"
    if case == "dtype-same-size" and odd: dtype = "int32"
    if case == "op" and odd: op = "max"
    if case == "algorithm" and odd: algorithm = "tree" if algorithm != "tree" else "ring"
    x = np.ones(n, dtype)
    try:
        y = mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm, check=check, timeout=deadline)
    except mpicoll.MismatchError as exc:
        print(f"R{comm.rank}:Mismatch", flush=True)
        time.sleep(2)  # let every other rank that raises say so before the abort
        raise
    except mpicoll.CollectiveTimeout as exc:
        print(f"R{comm.rank}:Timeout", flush=True)
        time.sleep(2)
        raise
    print(f"R{comm.rank}:returned:{hashlib.md5(y.tobytes()).hexdigest()[:8]}", flush=True)
""")

CASES = ["count-short", "count-long", "dtype-size", "dtype-same-size", "op", "algorithm"]


def run(path, nprocs, case, algorithm, check, timeout, deadline=None):
    cmd = [os.path.join(BIN, "mpiexec"), "-n", str(nprocs), sys.executable, "-m", "mpi4py", path, case,
           algorithm, "1" if check else "0"] + ([] if deadline is None else [str(deadline)])
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = None
    dt = time.monotonic() - t0
    # mpiexec forwards each rank's output separately: lines may run together.
    mism = sorted({int(r) for r in re.findall(r"R(\d+):Mismatch", out)})
    tmo = sorted({int(r) for r in re.findall(r"R(\d+):Timeout", out)})
    also = f"; CollectiveTimeout on rank(s) {tmo}" if tmo else ""
    returned = re.findall(r"R(\d+):returned:([0-9a-f]{8})", out)
    rets = {digest for _, digest in returned}
    nret = len({r for r, _ in returned})
    if rc is None:
        what = f"HANG (killed at {timeout:.0f} s)"
        if mism:
            what += f"; MismatchError on rank(s) {mism}"
    elif len(mism) == nprocs:
        what = f"MismatchError on every rank ({dt:.1f} s)"
    elif mism:
        what = f"MismatchError on rank(s) {mism}{also}, job aborted rc={rc} ({dt:.1f} s)"
    elif tmo:
        what = f"CollectiveTimeout on rank(s) {tmo}, job aborted rc={rc} ({dt:.1f} s)"
    elif nret == nprocs and rc == 0:
        # No error at all: whatever came back is not a meaningful reduction.
        what = ("no error: returned (same bytes on every rank)" if len(rets) == 1
                else "no error: returned DIFFERENT bytes on different ranks")
    else:
        what = f"aborted rc={rc} without MismatchError ({dt:.1f} s)"
    return what


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--algorithms", default="auto,ring,tree,recursive_doubling,rabenseifner,mpi")
    ap.add_argument("--deadline-only", action="store_true", help="only the deadline columns")
    ap.add_argument("--deadline", type=float, default=2.0,
                    help="timeout= (seconds) of the calls in the deadline columns; 0: leave them out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        columns = [] if args.deadline_only else [("check off", False, None), ("check on", True, None)]
        if args.deadline:
            columns += [(f"timeout={args.deadline:g}, check off", False, args.deadline),
                        (f"timeout={args.deadline:g}, check on", True, args.deadline)]
        print(f"p = {args.np}; the last rank differs\n")
        print("| case | algorithm | " + " | ".join(c[0] for c in columns) + " |")
        print("|---|---|" + "---|" * len(columns))
        counts = [dict(hangs=0, errors=0, wrong=0, ok=0) for _ in columns]
        for case in CASES:
            for algorithm in args.algorithms.split(","):
                cells = []
                for i, (_, check, deadline) in enumerate(columns):
                    what = run(path, args.np, case, algorithm, check, args.timeout, deadline)
                    cells.append(what)
                    kind = ("hangs" if what.startswith("HANG") else "wrong" if "DIFFERENT" in what
                            else "ok" if what.startswith("no error") else "errors")
                    counts[i][kind] += 1
                print(f"| {case} | {algorithm} | " + " | ".join(cells) + " |", flush=True)
        print("\n| column | hangs | ended with an error | silently wrong: same bytes everywhere | silently wrong: different bytes |")
        print("|---|---|---|---|---|")
        for (name, _, _), c in zip(columns, counts):
            print(f"| {name} | {c['hangs']} | {c['errors']} | {c['ok']} | {c['wrong']} |")


if __name__ == "__main__":
    main()
