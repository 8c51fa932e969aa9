"""Try every kind of cross-rank mismatch on every all-reduce algorithm,
with and without the pre-flight check, and print what happened as a
markdown table (docs/reliability.md).

    .venv/bin/python tools/mismatch_matrix.py [--np 3] [--timeout 20]

Each case is its own ``mpiexec -n NP python -m mpi4py`` job in which the
last rank passes a different argument. Nothing is caught: the program
behaves like a user's program would (a rank that raises MismatchError
prints a line and re-raises 2 s later, so that the table can show which
ranks raised before the first abort ends the job); "aborted" means mpi4py's
abort-on-exception ended the job, and "HANG" means the job was still
running at the timeout and was killed.
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
        y = mpicoll.allreduce(x, op=op, comm=comm, algorithm=algorithm, check=check)
    except mpicoll.MismatchError as exc:
        print(f"R{comm.rank}:Mismatch", flush=True)
        time.sleep(2)  # let every other rank that raises say so before the abort
        raise
    print(f"R{comm.rank}:returned:{hashlib.md5(y.tobytes()).hexdigest()[:8]}", flush=True)
""")

CASES = ["count-short", "count-long", "dtype-size", "dtype-same-size", "op", "algorithm"]


def run(path, nprocs, case, algorithm, check, timeout):
    cmd = [os.path.join(BIN, "mpiexec"), "-n", str(nprocs), sys.executable, "-m", "mpi4py", path, case,
           algorithm, "1" if check else "0"]
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
        what = f"MismatchError on rank(s) {mism}, job aborted rc={rc} ({dt:.1f} s)"
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        print(f"p = {args.np}; the last rank differs\n")
        print("| case | algorithm | check off | check on |")
        print("|---|---|---|---|")
        for case in CASES:
            for algorithm in args.algorithms.split(","):
                off = run(path, args.np, case, algorithm, False, args.timeout)
                on = run(path, args.np, case, algorithm, True, args.timeout)
                print(f"| {case} | {algorithm} | {off} | {on} |", flush=True)


if __name__ == "__main__":
    main()
