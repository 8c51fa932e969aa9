"""One deadline case, run by tests/test_timeout.py and tools/mismatch_matrix.py as

    mpiexec -n P python -m mpi4py tests/timeout_case.py CASE COLLECTIVE/ALGORITHM MODE TIMEOUT [CHECK]

The last rank ("odd") is the one that misbehaves:

    skip   every rank makes one call together, then odd skips the next one
           (for bcast odd is the root, so its partners need it) and
           lingers (LINGER_S) before it ends
    stall  as skip, but odd then stays busy for 60 s instead of ending:
           the others' uncaught timeout alone must end the job (nothing
           collective may run on their way out)
    first  odd skips the very first call on the communicator (mpicoll's state
           is created collectively there), and lingers as in skip
    check  as skip, with check=True (the pre-flight allgather is what waits)
    count / dtype / op / root   odd passes a different count (n - 1),
           dtype (float64), op (max) or root (1), without check
    order  odd calls another collective first, then this one; the others
           the other way round

MODE is blocking, nonblocking (i*(...).wait()), persistent (*_init) or
dropin (mpicoll.Comm's method, with MPICOLL_TIMEOUT=TIMEOUT and
MPICOLL_CHECK=CHECK, set by the caller: the methods take no timeout=).
Each rank prints "R<rank>:ready" after a barrier, then one line of what
happened: R<rank>:TIMEOUT:<seconds>:<peers>:<message>, R<rank>:MISMATCH,
R<rank>:ERROR:<type>, R<rank>:returned or R<rank>:skipped (and
R<rank>:t0:<epoch seconds> where the measured part starts); then an
exception is re-raised (after a short pause so that the other ranks can
report theirs) and mpi4py's abort-on-exception ends the job.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import mpicoll

case, spec, mode, tmo = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
check = len(sys.argv) > 5 and sys.argv[5] == "1"
coll, alg = spec.split("/")
comm = MPI.COMM_WORLD
rank, p = comm.rank, comm.size
odd = rank == p - 1
N = 1000
# How long a rank that skipped a call lingers before it ends normally; the
# others' timeouts abort the job well before that. Ending at once, it would
# wait in MPI_Finalize's PMI barrier (MPICH; seen with gdb) while the others
# call MPI_Abort: a CI job once stayed there until the hard limit after
# every other rank had reported its timeout. That is the launcher's
# teardown, not what these cases test (tests/mpijob.py reports where a hung
# job's processes wait, should it recur). ``stall`` lingers longer, to
# check that nothing collective runs on the others' way out.
LINGER_S = 5.0
REDUCING = ("allreduce", "reduce_scatter", "reduce")


def args_of(c, n, dtype, op, root):
    """Positional arguments and extra keywords of collective ``c``."""
    if c in REDUCING:
        return ((np.ones(n, dtype), op) if c != "reduce" else (np.ones(n, dtype), op, root)), {}
    if c == "bcast":
        return (np.ones(n, dtype), root), {}
    if c == "scatter":
        return (np.ones((p, n), dtype), root), {}
    if c == "gather":
        return (np.ones(n, dtype), root), {}
    if c == "allgatherv":
        return (np.ones(n, dtype), [n] * p), {}
    if c == "alltoall":
        return (np.ones((p, n), dtype),), {}
    if c == "alltoallv":
        return (np.ones(n * p, dtype), [n] * p, [n] * p), {}
    return (np.ones(n, dtype),), {}


# mpicoll.Comm's methods (the deadline comes from MPICOLL_TIMEOUT there):
# (blocking, nonblocking, persistent) names and the mpi4py buffer arguments.
def dropin_call(c, n, dtype, root):
    x = np.ones(n, dtype)
    big = np.ones(p * n, dtype)
    if c == "allreduce":
        return "Allreduce", (x, np.empty_like(x))
    if c == "reduce_scatter":
        return "Reduce_scatter_block", (big, np.empty_like(x))
    if c == "allgather":
        return "Allgather", (x, np.empty_like(big))
    if c == "bcast":
        return "Bcast", (x, root)
    if c == "reduce":
        return "Reduce", (x, np.empty_like(x), MPI.SUM, root)
    if c == "scatter":
        return "Scatter", (big, x, root)
    if c == "scatterv":
        return "Scatterv", ([big, [n] * p], x, root)
    if c == "gather":
        return "Gather", (x, np.empty_like(big), root)
    if c == "allgatherv":
        return "Allgatherv", (x, [np.empty_like(big), [n] * p])
    if c == "alltoall":
        return "Alltoall", (big, np.empty_like(big))
    return "Alltoallv", ([big, [n] * p], [np.empty_like(big), [n] * p])


def call(c, algorithm, n=N, dtype="float32", op="sum", root=0, chk=False, persistent=None):
    """One collective ``c`` in this MODE; returns the persistent request when
    ``persistent`` is None and MODE is persistent (to be started again)."""
    if mode == "dropin":
        name, args = dropin_call(c, n, dtype, root)
        return getattr(mpicoll.Comm(comm), name)(*args, algorithm=algorithm)
    args, extra = args_of(c, n, dtype, op, root)
    kw = dict(comm=comm, algorithm=algorithm, timeout=tmo, check=chk, **extra)
    if mode == "blocking":
        return getattr(mpicoll, c)(*args, **kw)
    if mode == "nonblocking":
        return getattr(mpicoll, "i" + c)(*args, **kw).wait()
    req = persistent if persistent is not None else getattr(mpicoll, c + "_init")(*args, **kw)
    req.start()
    req.wait()
    return req


def other_collective():
    return ("bcast", "auto") if coll != "bcast" else ("allreduce", "auto")


def report(kind, extra=""):
    print(f"R{rank}:{kind}{extra}", flush=True)


comm.Barrier()
report("ready")
t0 = time.monotonic()
report("t0", f":{time.time():.3f}")
try:
    skip_root = p - 1 if coll == "bcast" else 0
    if case in ("skip", "check", "stall"):
        req = call(coll, alg, root=skip_root, chk=case == "check")
        comm.Barrier()  # the warm-up is not part of the measured time
        t0 = time.monotonic()
        report("t0", f":{time.time():.3f}")
        if odd:
            report("skipped")
            time.sleep(60 if case == "stall" else tmo + LINGER_S)
        else:
            call(coll, alg, root=skip_root, chk=case == "check", persistent=req if mode == "persistent" else None)
    elif case == "first":
        if odd:
            report("skipped")
            time.sleep(tmo + LINGER_S)
        else:
            call(coll, alg, root=skip_root, chk=check)
    elif case == "order":
        first, second = ((coll, alg), other_collective())
        if odd:
            first, second = second, first
        call(*first, chk=check)
        call(*second, chk=check)
    else:
        n, dtype, op, root = N, "float32", "sum", 0
        if odd:
            if case == "count":
                n = N - 1
            elif case == "dtype":
                dtype = "float64"
            elif case == "op":
                op = "max"
            elif case == "root":
                root = 1
            else:
                raise SystemExit(f"unknown case {case!r}")
        call(coll, alg, n=n, dtype=dtype, op=op, root=root, chk=check)
    if not (odd and case in ("skip", "check", "first", "stall")):
        report("returned")
except mpicoll.CollectiveTimeout as exc:
    report("TIMEOUT", f":{time.monotonic() - t0:.2f}:{','.join(map(str, exc.peers))}:{exc}")
    time.sleep(1.0)  # let the other ranks that time out say so before the abort
    raise
except mpicoll.MismatchError:
    report("MISMATCH", f":{time.monotonic() - t0:.2f}")
    time.sleep(1.0)
    raise
except Exception as exc:
    report("ERROR", f":{type(exc).__name__}:{time.monotonic() - t0:.2f}:{str(exc)[:200]}")
    time.sleep(1.0)
    raise
