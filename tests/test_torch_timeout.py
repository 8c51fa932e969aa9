"""A process group's timeout is mpicoll's deadline: a collective that one rank
skips ends the job within the timeout instead of hanging (serial test: the
job runs under its own mpiexec, watched from outside with a hard limit, as
in tests/test_timeout.py)."""
from __future__ import annotations

import os
import re
import sys
import time

import pytest

from mpijob import run_job

pytest.importorskip("torch", reason="torch is not installed (make install adds the CPU build)")

# Each case waits for its deadline (conftest spreads such tests through the run).
pytestmark = pytest.mark.waits

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
HARD_S = 120

SCRIPT = """
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from mpi4py import MPI
import mpicoll, mpicoll.torch
dist.init_process_group("mpicoll", init_method="mpi://", timeout=timedelta(seconds=float(sys.argv[1])))
r = dist.get_rank()
t = torch.ones(1 << 16)
dist.all_reduce(t)          # every rank: the group works
dist.barrier()
print(f"R{r}:t0:{time.time():.3f}", flush=True)
if r == dist.get_world_size() - 1:
    print(f"R{r}:skipped", flush=True)
    time.sleep(60)          # never calls the second all-reduce
mode = sys.argv[2]
try:
    if mode == "barrier-future":
        dist.barrier(async_op=True).get_future().wait()
    elif mode.startswith("barrier"):
        work = dist.barrier(async_op=mode == "barrier-async")
        if work is not None:
            work.wait()
    else:
        dist.all_reduce(t, async_op=mode == "async").wait()
except mpicoll.CollectiveTimeout as exc:
    print(f"R{r}:TIMEOUT:{time.time():.3f}:{exc}", flush=True)
    raise
print(f"R{r}:returned", flush=True)
"""


# What rank 0's CollectiveTimeout says, per mode.
SAYS = {"sync": "allreduce timed out on rank 0", "async": "allreduce timed out on rank 0",
        "barrier": "barrier of 2 ranks timed out on rank 0", "barrier-async": "barrier of 2 ranks timed out on rank 0",
        "barrier-future": "barrier of 2 ranks timed out on rank 0"}


@pytest.mark.parametrize("mode", list(SAYS))
def test_skipped_collective_ends_within_the_group_timeout(tmp_path, mode):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    script = tmp_path / "skip.py"
    script.write_text(SCRIPT)
    timeout = 2.0
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", "2", sys.executable, "-m", "mpi4py", str(script), str(timeout), mode]
    env = {k: v for k, v in os.environ.items() if k != "MPICOLL_TIMEOUT"}
    rc, stdout, stderr = run_job(cmd, HARD_S, env=env)
    assert rc is not None, f"still running after {HARD_S} s: the collective hung\n{(stdout + stderr)[-8000:]}"
    end = time.time()
    out = stdout + stderr
    assert rc != 0, out  # rank 0's uncaught CollectiveTimeout aborts the job
    assert "R1:skipped" in out and "returned" not in out, out
    m = re.search(r"R0:TIMEOUT:(\d+\.\d+):", out)
    assert m, out[-3000:]
    t0 = float(re.search(r"R0:t0:(\d+\.\d+)", out).group(1))
    raised = float(m.group(1)) - t0
    assert timeout - 0.1 <= raised <= timeout + 2.0, (raised, out[-2000:])
    assert end - t0 < 60, "the job outlived the sleeping rank's 60 s: the abort did not end it"
    assert SAYS[mode] in out, out[-2000:]
