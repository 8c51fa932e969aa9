"""Shared-memory safety cases, run by tests/test_shm_safety.py as

    mpiexec -n P python -m mpi4py tests/shm_case.py mismatch ALGORITHM NODE_SIZE
    mpiexec -n P python -m mpi4py tests/shm_case.py sigint FORM

mismatch: the ranks of every (possibly faked, MPICOLL_FAKE_NODE_SIZE) node
disagree on the message: the last rank of each node ("odd") passes another
count or dtype, blocking and nonblocking, including counts for which one
side would grow the shared window and the other not, and an empty message.
Every rank prints R<rank>:<case>:MISMATCH (or TIMEOUT / returned / ERROR),
then all make a matching call, whose result is checked, and print
R<rank>:<case>:recovered: the window is still usable after the error.

sigint: rank 1 stops taking part after a few calls. Rank 0 first waits
for it in a nonblocking call with a deadline (R0:TIMEOUT; FORM "schedule"
only), then in a call with none: it prints R0:pid:<pid> and R0:waiting,
and is sent SIGINT from outside: it must print R0:INTERRUPTED
(KeyboardInterrupt reached Python), then the uncaught exception ends the
job. FORM: "schedule" (the blocking call runs shm's schedule after the
timed-out one), or, after two calls that make each one-chunk path run in
C, "blocking" (the kept call gated in C), "persistent" (the C front's run)
or "nonblocking" (the engine's request over the program).
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import mpicoll

case = sys.argv[1]
rank, p = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def report(what):
    print(f"R{rank}:{what}", flush=True)


if case == "sigint":
    # Python's KeyboardInterrupt handler, as in a program started from a
    # terminal, even where this job was started in the background by a shell
    # without job control (its processes then inherit SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    form = sys.argv[2]
    comm = MPI.COMM_WORLD.Dup()
    x, y = np.ones(1000, np.float32), np.empty(1000, np.float32)
    pr = mpicoll.allreduce_init(x, out=y, comm=comm, algorithm="shm")
    calls = {"schedule": lambda: mpicoll.allreduce(x.copy(), comm=comm, algorithm="shm"),
             "blocking": lambda: mpicoll.allreduce(x, out=y, comm=comm, algorithm="shm"),
             "persistent": pr,
             "nonblocking": lambda: mpicoll.iallreduce(x, out=y, comm=comm, algorithm="shm").wait()}
    for _ in range(1 if form == "schedule" else 3):  # the window exists; from the second call on, C
        calls[form]()
    if rank == 1:
        time.sleep(120)  # never takes part again; the job ends when rank 0's exception aborts it
    else:
        if form == "schedule":
            try:
                mpicoll.iallreduce(np.ones(1000, np.float32), comm=comm, algorithm="shm", timeout=1.0).wait()
                report("returned")
            except mpicoll.CollectiveTimeout:
                report("TIMEOUT")
        report(f"pid:{os.getpid()}")
        report("waiting")
        try:
            calls[form]()
            report("returned")
        except KeyboardInterrupt:
            report("INTERRUPTED")
            raise
    sys.exit(0)

algorithm, node_size = sys.argv[2], int(sys.argv[3])
os.environ["MPICOLL_FAKE_NODE_SIZE"] = str(node_size)
odd = rank % node_size == node_size - 1
TIMEOUT = 30.0  # reached only by a regression (a hang), never on the way to the expected error
SMALL, BIG = 1000, 300000  # 1000 float32 fit the first window; 300000 need it grown

# (name, this rank's (count, dtype))
CASES = [
    ("count+1", (SMALL + 1, "float32") if odd else (SMALL, "float32")),
    ("odd-grows", (BIG, "float32") if odd else (SMALL, "float32")),
    ("others-grow", (SMALL, "float32") if odd else (BIG, "float32")),
    ("odd-empty", (0, "float32") if odd else (SMALL, "float32")),
    ("others-empty", (SMALL, "float32") if odd else (0, "float32")),
    ("dtype", (SMALL // 2, "float64") if odd else (SMALL, "float32")),  # same bytes, another dtype
]

for mode in ("blocking", "nonblocking"):
    for name, (n, dtype) in CASES:
        label = f"{name}:{mode}"
        comm = MPI.COMM_WORLD.Dup()  # a fresh window (first size) for each case
        x = np.full(n, rank + 1, dtype)
        try:
            if mode == "blocking":
                mpicoll.allreduce(x, comm=comm, algorithm=algorithm, timeout=TIMEOUT)
            else:
                mpicoll.iallreduce(x, comm=comm, algorithm=algorithm, timeout=TIMEOUT).wait()
            report(f"{label}:returned")
        except mpicoll.MismatchError as exc:
            report(f"{label}:MISMATCH:{exc.field}")
        except mpicoll.CollectiveTimeout:
            report(f"{label}:TIMEOUT")
            raise
        # A matching call (as big as the grown window) on the same window after the error.
        m = BIG if "grow" in name else SMALL
        got = mpicoll.allreduce(np.full(m, rank + 1, np.float32), comm=comm, algorithm=algorithm, timeout=TIMEOUT)
        assert (got == p * (p + 1) // 2).all(), (label, got[:4])
        report(f"{label}:recovered")
        comm.Free()
