"""A rank that dies or raises in the middle of a collective ends the whole
job, non-zero, within a bound - instead of leaving the other ranks blocked.

Serial tests: each one launches ``mpiexec -n 3 python -m mpi4py`` on a small
script (mpiexec comes from the same environment as sys.executable) and
watches it from outside. The failing rank's reduction kernel is replaced so
that it fails on its third call: a point where the other ranks are certainly
inside the same all-reduce, waiting for its messages.
"""
from __future__ import annotations

import os
import re
import sys
import textwrap
import time

import pytest

from mpijob import run_job

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
# What the Makefile passes its own mpiexec (Open MPI: --allow-run-as-root --oversubscribe).
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
# Generous: startup of 3 Python processes on a loaded 2-core machine takes
# a few seconds; a hang would run into it and fail the test.
BOUND_S = 60

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from mpi4py import MPI
    import mpicoll
    import mpicoll.executor
    from mpicoll import kernels

    how, algorithm = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    current = [0]  # which all-reduce the loop below is in
    if how == "timer":
        # Rank 1 dies from a timer thread while every rank loops over a
        # compilable all-reduce: the later calls run in the C executor
        # (kept plan), so the death lands inside its MPI_Waitall.
        import threading
        if comm.rank == 1:
            threading.Timer(2.0, lambda: (print("rank 1 killed by its timer", flush=True),
                                          os.kill(os.getpid(), signal.SIGKILL))).start()
        x = np.ones(1 << 10, np.float32)
        for i in range(10 ** 7):
            mpicoll.allreduce(x, comm=comm, algorithm=algorithm)
        print("survived", flush=True)
        sys.exit(0)
    # The failure below is injected through Python's Reduction.combine, which
    # the C executor does not call: keep every call on the generators.
    mpicoll.executor.set_enabled(False)
    if comm.rank == 1:
        calls = [0]
        combine = kernels.Reduction.combine

        def failing(self, dst, a, b):
            calls[0] += 1
            if calls[0] == 3:
                print(f"rank 1 fails at combine 3 in allreduce {current[0]} ({how})", flush=True)
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("rank 1 fails mid-collective")
            return combine(self, dst, a, b)

        kernels.Reduction.combine = failing
    x = np.ones(1 << 22, np.float32)  # 16 MiB: many segments, many combines
    for i in range(3):
        current[0] = i
        print(f"rank {comm.rank} enters allreduce {i}", flush=True)
        mpicoll.allreduce(x, comm=comm, algorithm=algorithm)
        print(f"rank {comm.rank} left allreduce {i}", flush=True)
    print("survived", flush=True)
""")


@pytest.mark.parametrize("how,algorithm", [("raise", "ring"), ("kill", "rabenseifner")])
def test_failing_rank_ends_job(tmp_path, how, algorithm):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    script = tmp_path / "fail.py"
    script.write_text(SCRIPT)
    t0 = time.monotonic()
    rc, stdout, stderr = run_job([MPIEXEC, *MPIEXEC_FLAGS, "-n", "3", sys.executable, "-m", "mpi4py", str(script), how,
                                 algorithm], BOUND_S)
    assert rc is not None, f"mpiexec still running after {BOUND_S} s: the job hung\n{(stdout + stderr)[-8000:]}"
    elapsed = time.monotonic() - t0
    out = stdout + stderr
    assert rc != 0, out
    assert "survived" not in stdout
    # Evidence that the job ended for the intended reason, not for any
    # failure at all (an import error exits non-zero too): rank 1 failed
    # inside an all-reduce, every rank had entered that all-reduce and none
    # left it, and the failure reported is rank 1's.
    m = re.search(rf"rank 1 fails at combine 3 in allreduce (\d) \({how}\)", stdout)
    assert m, out
    for r in range(3):
        assert f"rank {r} enters allreduce {m[1]}" in stdout, out
        assert f"rank {r} left allreduce {m[1]}" not in stdout, out
    if how == "raise":
        assert "RuntimeError: rank 1 fails mid-collective" in stderr, out
    else:
        assert "signal 9" in out.lower() or "killed" in out.lower(), out
    print(f"{how}/{algorithm}: exit {rc} after {elapsed:.1f} s")


def test_rank_killed_inside_the_executor_ends_job(tmp_path):
    from mpicoll import executor
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    if not executor.available():
        pytest.skip(executor.why_not())
    script = tmp_path / "fail.py"
    script.write_text(SCRIPT)
    rc, stdout, stderr = run_job([MPIEXEC, *MPIEXEC_FLAGS, "-n", "3", sys.executable, "-m", "mpi4py", str(script),
                                 "timer", "recursive_doubling"], BOUND_S)
    assert rc is not None, f"mpiexec still running after {BOUND_S} s: the job hung\n{(stdout + stderr)[-8000:]}"
    out = stdout + stderr
    assert rc != 0, out
    assert "rank 1 killed by its timer" in stdout, out
    assert "survived" not in stdout, out
