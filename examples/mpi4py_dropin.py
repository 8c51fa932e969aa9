"""An ordinary mpi4py program - distributed power iteration - switched to
mpicoll by one line.

The matrix A (n x n, symmetric) is split by columns: rank r holds
A[:, cols_r] and x[cols_r]. Each step computes its partial product
A[:, cols_r] @ x[cols_r] and sums the partials with ``comm.Allreduce``
(an n-vector every step), then normalises. ``power_iteration`` is plain
mpi4py code; the only mpicoll line is

    comm = mpicoll.Comm(MPI.COMM_WORLD)

Run:   mpiexec -n 4 python -m mpi4py examples/mpi4py_dropin.py [--n 4096] [--iters 100]
       (--comm mpi4py | mpicoll | both; default both: the same solve twice, timed)
       MPICOLL_ALGORITHM=ring mpiexec ...   forces one mpicoll algorithm, no code change
"""
from __future__ import annotations

import argparse
import os
import time

# One rank per core: BLAS threads of several ranks would fight over the cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402


def power_iteration(comm, n, iters, seed=0):
    """Largest eigenvalue of a random symmetric n x n matrix, by power iteration.
    Plain mpi4py: comm.Allreduce every step. Returns (eigenvalue, seconds)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = rank * n // size, (rank + 1) * n // size
    rng = np.random.default_rng(seed)
    full = rng.standard_normal((n, n))  # every rank builds the same matrix, keeps its columns
    a_cols = np.ascontiguousarray((full + full.T)[:, lo:hi])
    del full
    x = np.ones(n) / np.sqrt(n)
    y = np.empty(n)
    lam = 0.0
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        part = a_cols @ x[lo:hi]
        comm.Allreduce(part, y, op=MPI.SUM)
        lam = float(x @ y)  # Rayleigh quotient (x has unit norm)
        norm = np.sqrt(y @ y)
        np.divide(y, norm, out=x)
    comm.Barrier()
    return lam, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many timed runs")
    ap.add_argument("--comm", choices=("mpi4py", "mpicoll", "both"), default="both")
    args = ap.parse_args(argv)

    variants = ["mpi4py", "mpicoll"] if args.comm == "both" else [args.comm]
    comms = {}
    for variant in variants:
        if variant == "mpi4py":
            comms[variant] = MPI.COMM_WORLD
        else:
            import mpicoll

            comms[variant] = mpicoll.Comm(MPI.COMM_WORLD)  # <- the one line that switches to mpicoll
    # The variants take turns, so that both see the same background load.
    runs = {v: [] for v in variants}
    for _ in range(args.repeat):
        for variant in variants:
            runs[variant].append(power_iteration(comms[variant], args.n, args.iters))
    results = {v: (r[0][0], min(t for _, t in r)) for v, r in runs.items()}

    if MPI.COMM_WORLD.rank == 0:
        print(f"power iteration: n={args.n}, {args.iters} steps, p={MPI.COMM_WORLD.size}, "
              f"one Allreduce of {args.n * 8} bytes per step (best of {args.repeat})")
        for variant, (lam, secs) in results.items():
            print(f"  {variant:8s} lambda_max = {lam:.10g}   {secs * 1e3:9.2f} ms   "
                  f"{secs / args.iters * 1e6:8.1f} us/step")
        if len(results) == 2:
            (l1, t1), (l2, t2) = results["mpi4py"], results["mpicoll"]
            print(f"  mpicoll / mpi4py time: {t2 / t1:.2f}; |lambda difference| = {abs(l1 - l2):.3g}")
    if len(results) == 2:
        (l1, _), (l2, _) = results["mpi4py"], results["mpicoll"]
        assert abs(l1 - l2) <= 1e-8 * abs(l1), "the two runs disagree"
    return results


if __name__ == "__main__":
    main()
