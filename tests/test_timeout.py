"""No hang, ever: with a deadline, every way of calling a collective wrongly
ends the job within the deadline plus a few seconds, on every rank.

Serial tests: each case is its own ``mpiexec -n P python -m mpi4py
tests/timeout_case.py CASE COLLECTIVE/ALGORITHM MODE TIMEOUT`` job (see
that script for the cases), watched from outside with a hard subprocess
timeout. The default suite runs a representative subset (p = 2 and 3, a few
algorithms); ``make test-timeout`` (``MPICOLL_TIMEOUT_MATRIX=full``) runs
every algorithm of every collective at p = 2..5.
"""
from __future__ import annotations

import os
import re
import sys
import time

import pytest

import mpicoll
from mpijob import run_job

# Each case waits for its deadline (conftest spreads such tests through the run).
pytestmark = pytest.mark.waits

HERE = os.path.dirname(os.path.abspath(__file__))
CASE_SCRIPT = os.path.join(HERE, "timeout_case.py")
BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
TIMEOUT_S = 1.0
# From the start of the measured part to the end of the job: the deadline,
# then mpi4py's abort and the launcher's teardown on a loaded 2-core machine.
SLACK_S = 6.0
# Hard limit per job, startup included: a hang runs into it and fails.
HARD_S = 90
# Algorithms whose waits are point-to-point, so the message can name the peer
# (mpi waits inside the MPI library, shm and hierarchical on shared memory).
P2P = ("ring", "tree", "rabenseifner", "recursive_doubling")
REDUCING = ("allreduce", "reduce_scatter", "reduce")
SKIPS = ("skip", "first", "check", "stall")


def _specs():
    return [f"{c}/{a}" for c in mpicoll.algorithms.COLLECTIVES for a in mpicoll.algorithms(c) if a != "auto"]


def _full_matrix():
    cases = []
    for p in (2, 3, 4, 5):
        for spec in _specs():
            coll = spec.split("/")[0]
            for mode in ("blocking", "nonblocking", "persistent"):
                cases.append(("skip", spec, mode, p))
            for case in ("count", "dtype", "order") + (("op",) if coll in REDUCING else ()) \
                    + (("root",) if coll in ("bcast", "reduce") else ()):
                cases.append((case, spec, "blocking", p))
        for coll in mpicoll.algorithms.COLLECTIVES:
            # State creation and the pre-flight do not depend on the algorithm.
            cases.append(("first", f"{coll}/mpi", "blocking", p))
            cases.append(("check", f"{coll}/mpi", "blocking", p))
    return cases


SUBSET = [
    ("skip", "allreduce/ring", "blocking", 2),
    ("skip", "allreduce/ring", "blocking", 3),
    ("skip", "allreduce/rabenseifner", "nonblocking", 3),
    ("skip", "allreduce/recursive_doubling", "persistent", 3),
    ("skip", "allreduce/mpi", "blocking", 2),
    ("skip", "allreduce/mpi", "persistent", 3),
    ("skip", "allreduce/shm", "blocking", 3),
    ("stall", "allreduce/shm", "blocking", 2),
    ("stall", "allreduce/ring", "nonblocking", 2),
    ("skip", "bcast/tree", "blocking", 3),
    ("skip", "reduce/ring", "nonblocking", 3),
    ("skip", "allgather/ring", "persistent", 2),
    ("skip", "reduce_scatter/ring", "blocking", 3),
    ("first", "allreduce/ring", "blocking", 3),
    ("first", "bcast/mpi", "blocking", 2),
    ("check", "allreduce/ring", "blocking", 3),
    ("count", "allreduce/tree", "blocking", 3),
    ("dtype", "allreduce/ring", "blocking", 3),
    ("op", "reduce/tree", "blocking", 2),
    ("root", "bcast/ring", "blocking", 3),
    ("order", "allreduce/ring", "blocking", 3),
    ("order", "allgather/mpi", "blocking", 2),
]

MATRIX = _full_matrix() if os.environ.get("MPICOLL_TIMEOUT_MATRIX") == "full" else SUBSET


def run_case(case, spec, mode, p, timeout=TIMEOUT_S, check=False, hard=HARD_S, env_extra=None):
    """Run one case; returns (returncode or None if killed, output, seconds from
    the measured part's start to the job's end, per-rank reports).
    ``env_extra``: more environment variables for the job."""
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", str(p), sys.executable, "-m", "mpi4py", CASE_SCRIPT, case, spec, mode,
           str(timeout), "1" if check else "0"]
    env = dict(os.environ)
    env.pop("MPICOLL_TIMEOUT", None)
    env.pop("MPICOLL_CHECK", None)
    env.update(env_extra or {})
    rc, stdout, stderr = run_job(cmd, hard, env=env)
    out = stdout + stderr
    end = time.time()
    starts = [float(t) for t in re.findall(r"R\d+:t0:(\d+\.\d+)", out)]
    took = end - max(starts) if starts else float("nan")
    reports = {}
    # mpiexec forwards each rank's output separately: lines may run together.
    for m in re.finditer(r"R(\d+):(TIMEOUT|MISMATCH|ERROR|returned|skipped)(?::(.*?))?(?=R\d+:|\n|$)", out):
        reports.setdefault(int(m.group(1)), (m.group(2), m.group(3) or ""))
    return rc, out, took, reports


def timeout_peers(reports):
    """{rank: [peers]} of the ranks that reported a CollectiveTimeout."""
    got = {}
    for r, (kind, rest) in reports.items():
        if kind == "TIMEOUT":
            peers = rest.split(":")[1]
            got[r] = [int(x) for x in peers.split(",") if x]
    return got


@pytest.mark.parametrize("case,spec,mode,p", MATRIX, ids=lambda v: str(v))
def test_ends_within_deadline(case, spec, mode, p):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    rc, out, took, reports = run_case(case, spec, mode, p)
    if rc is None:
        pytest.fail(f"{case} {spec} {mode} p={p}: still running after {HARD_S} s: hang\n{out[-8000:]}")
    calls = 2 if case == "order" else 1
    assert took <= calls * TIMEOUT_S + SLACK_S, f"job ended {took:.1f} s after the call\n{out[-3000:]}"
    for r, (kind, rest) in reports.items():
        if kind == "TIMEOUT":
            # The line is printed from an ``except CollectiveTimeout``.
            assert float(rest.split(":")[0]) <= calls * TIMEOUT_S + 1.0, rest
    if case in SKIPS:
        peers = timeout_peers(reports)
        odd = p - 1
        assert reports.get(odd, ("",))[0] == "skipped", out[-3000:]
        assert peers, f"nobody reported a CollectiveTimeout\n{out[-3000:]}"
        assert odd not in peers
        alg = spec.split("/")[1]
        for r, ps in peers.items():
            assert r not in ps and all(0 <= x < p for x in ps), (r, ps)
        if case == "skip" and alg in P2P:
            # Someone waited for the rank that skipped, by name.
            assert any(odd in ps for ps in peers.values()), f"rank {odd} not named\n{out[-3000:]}"
    else:
        # A call with mismatched arguments may even return (silently wrong:
        # only check=True catches that); it must not hang.
        assert rc is not None
    print(f"{case} {spec} {mode} p={p}: rc={rc} ended {took:.1f} s after the call; "
          f"{ {r: k for r, (k, _) in sorted(reports.items())} }")


KILL_SCRIPT = """
import os, signal, sys, time
import numpy as np
from mpi4py import MPI
import mpicoll
comm = MPI.COMM_WORLD
x = np.ones(1 << 16, np.float32)
mpicoll.allreduce(x, comm=comm, algorithm=sys.argv[1], timeout=2)
comm.Barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
try:
    mpicoll.allreduce(x, comm=comm, algorithm=sys.argv[1], timeout=2)
except Exception as exc:
    print(f"R{comm.rank}:raised:{type(exc).__name__}:{time.monotonic() - t0:.2f}", flush=True)
    raise
print(f"R{comm.rank}:returned", flush=True)
"""


# ids: a test whose keywords include "mpi" is taken for an MPI test by pytest-mpi
@pytest.mark.parametrize("algorithm", ["ring", "mpi"], ids=["ring", "native"])
def test_killed_rank_survivors_raise(tmp_path, algorithm):
    """A rank killed between two calls: with a timeout the survivors raise
    (CollectiveTimeout, or an MPI error where the library notices the dead
    peer) rather than spin. MPICH's launcher is told not to clean up after
    the death, so the survivors must end on their own."""
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    flags = MPIEXEC_FLAGS or (["-disable-auto-cleanup"] if os.environ.get("MPICOLL_EXPECT_MPI", "mpich") == "mpich"
                              else [])
    cmd = [MPIEXEC, *flags, "-n", "3", sys.executable, "-m", "mpi4py", str(script), algorithm]
    rc, stdout, stderr = run_job(cmd, HARD_S)
    out = stdout + stderr
    assert rc is not None, f"still running after {HARD_S} s: the survivors hung\n{out[-8000:]}"
    assert rc != 0, out
    assert "R0:returned" not in out and "R2:returned" not in out, out
    print(f"killed rank, {algorithm}: rc={rc}; " + " ".join(re.findall(r"R\d:raised:\S+", out)))
