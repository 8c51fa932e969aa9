"""Shared memory, no wrong answer and no hang: ranks of a node that disagree
on the message raise MismatchError everywhere (tests/shm_case.py, in its own
mpiexec jobs), and a rank waiting in shared memory for a peer that never
comes returns to Python (deadline, Ctrl-C). The flag primitives of
csrc/shmsync.c are tested here with threads, without MPI."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from mpicoll._kernels import ffi, lib
from mpicoll import shmwindow
from mpijob import run_job

HERE = os.path.dirname(os.path.abspath(__file__))
CASE_SCRIPT = os.path.join(HERE, "shm_case.py")
BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
HARD_S = 120  # per job, startup included: a hang runs into it and fails
CASES = ("count+1", "odd-grows", "others-grow", "odd-empty", "others-empty", "dtype")

needs_mpiexec = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec next to sys.executable")


def _env():
    env = dict(os.environ)
    for var in ("MPICOLL_TIMEOUT", "MPICOLL_CHECK", "MPICOLL_ALGORITHM", "MPICOLL_FAKE_NODE_SIZE"):
        env.pop(var, None)
    return env


# ids: a test whose keywords include "mpi" is taken for an MPI test by pytest-mpi
@needs_mpiexec
@pytest.mark.parametrize("algorithm,p,node_size", [("shm", 3, 3), ("hierarchical", 4, 2)],
                         ids=["shm-p3", "hierarchical-2x2"])
def test_mismatched_messages_raise_on_every_rank(algorithm, p, node_size):
    """Every case of tests/shm_case.py: MismatchError on every rank, then a
    correct call on the same communicator. (tests/test_shm.py runs the cases
    that need no grown window at every p, in process.) Two ranks per node
    under hierarchical: the node's check decides, no cross-node message."""
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", str(p), sys.executable, "-m", "mpi4py", CASE_SCRIPT, "mismatch",
           algorithm, str(node_size)]
    rc, stdout, stderr = run_job(cmd, HARD_S, env=_env())
    assert rc is not None, f"hung: still running after {HARD_S} s\n{(stdout + stderr)[-8000:]}"
    out = stdout + stderr
    assert rc == 0, out
    for mode in ("blocking", "nonblocking"):
        for case in CASES:
            for r in range(p):
                field = "dtype" if case == "dtype" else "count"
                assert f"R{r}:{case}:{mode}:MISMATCH:{field}" in out, (r, case, mode, out)
                assert f"R{r}:{case}:{mode}:recovered" in out, (r, case, mode, out)


@needs_mpiexec
@pytest.mark.parametrize("form", ["schedule", "blocking", "persistent", "nonblocking"])
def test_ctrl_c_reaches_a_rank_waiting_in_shared_memory(form):
    """The peer never comes: with a deadline, CollectiveTimeout; with none,
    SIGINT still raises KeyboardInterrupt, in the schedule's wait and in
    the executor's (the one-chunk program, gated, persistent or a request):
    each C wait returns to Python between bounded rounds."""
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", "2", sys.executable, "-m", "mpi4py", CASE_SCRIPT, "sigint", form]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines = []
    try:
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        end = time.monotonic() + HARD_S
        while not any("R0:waiting" in ln for ln in lines):
            assert time.monotonic() < end and proc.poll() is None, "".join(lines)
            time.sleep(0.05)
        pid = int(re.search(r"R0:pid:(\d+)", "".join(lines)).group(1))
        time.sleep(0.5)  # into the wait (if not yet, the signal is seen when it starts)
        os.kill(pid, signal.SIGINT)
        try:
            proc.wait(timeout=HARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not end after SIGINT: the rank is stuck in C\n" + "".join(lines))
        reader.join(10)
        out = "".join(lines)
        assert "R0:TIMEOUT" in out or form != "schedule", out
        assert "R0:INTERRUPTED" in out, out
        assert "R0:returned" not in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- the flag primitives, without MPI -----------------------------------------------

SLOT_WORDS = shmwindow.FLAG_STRIDE // 8


class FlagArea:
    """k flag slots in ordinary memory, laid out as in a window's header."""

    def __init__(self, k):
        self.k = k
        self.words = np.zeros(k * SLOT_WORDS, np.int64)
        self.base = ffi.from_buffer(self.words)

    def counter(self, r):
        return ffi.cast("int64_t *", ffi.from_buffer(self.words[r * SLOT_WORDS:]))

    def set(self, r, value):
        lib.mpicoll_flag_set(self.counter(r), value)


def test_wait_for_a_peer_that_never_writes_returns_at_the_deadline():
    area = FlagArea(3)
    area.set(0, 1)
    area.set(1, 1)  # rank 2 never comes
    assert not lib.mpicoll_flag_test(area.base, shmwindow.FLAG_STRIDE, 3, 1)
    # One bounded C round: "not yet" after its budget, whatever the stage it reached.
    for spins, yield_ns in ((200, 10**9), (0, 10**6), (0, 0)):
        assert lib.mpicoll_flag_wait(area.base, shmwindow.FLAG_STRIDE, 3, 1, spins, yield_ns, 20 * 10**6) == 0
    assert not shmwindow.wait_flags(area.base, 3, 1, time.monotonic() + 0.2)
    assert shmwindow.wait_flags(area.base, 2, 1, time.monotonic() + 0.2), "ranks 0 and 1 are there"
    assert area.words[2 * SLOT_WORDS] == 0


def test_sigint_interrupts_a_wait_without_deadline():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    area = FlagArea(2)
    area.set(0, 1)  # the peer (slot 1) never comes
    # Python's own handler (KeyboardInterrupt), as in a program started from
    # a terminal: a process started in the background by a shell without job
    # control inherits SIGINT ignored, and the wait would then never end.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    # Should the signal not end the wait, the peer comes after 20 s: the
    # test then fails (no KeyboardInterrupt) instead of hanging.
    late_peer = threading.Timer(20.0, area.set, (1, 1))
    timer.start()
    late_peer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            shmwindow.wait_flags(area.base, 2, 1, None)
    finally:
        timer.cancel()
        late_peer.cancel()
        signal.signal(signal.SIGINT, old)


def test_flag_set_by_another_thread_publishes_its_data():
    """The waiter sees the flag only once another thread has set it, and then
    sees the data that thread wrote before it (release/acquire): a ping-pong
    of counters between two threads, with the data checked on each side."""
    area = FlagArea(2)
    n = 4096
    # data[r][e % 2]: written by r in round e, read by the other. Two buffers:
    # a thread past round e writes round e+1's into the other one, and cannot
    # write e+2's before its peer, done reading e's, has set its counter to e+1.
    data = [[np.zeros(n, np.int64) for _ in (0, 1)] for _ in (0, 1)]
    rounds = 300
    go = threading.Event()
    errors = []

    def peer():
        go.wait()
        for e in range(1, rounds + 1):
            data[1][e % 2][:] = e  # write, then publish
            area.set(1, e)
            if not shmwindow.wait_flags(area.base, 2, e, time.monotonic() + 60):
                errors.append(f"peer: timed out at {e}")
                return
            if not (data[0][e % 2] == e).all():
                errors.append(f"peer: stale data at {e}")
                return

    t = threading.Thread(target=peer)
    t.start()
    try:
        data[0][1][:] = 1
        area.set(0, 1)
        assert not lib.mpicoll_flag_test(area.base, shmwindow.FLAG_STRIDE, 2, 1), "the peer has not set its flag"
        assert not shmwindow.wait_flags(area.base, 2, 1, time.monotonic() + 0.05)
        go.set()
        for e in range(1, rounds + 1):
            if e > 1:
                data[0][e % 2][:] = e
                area.set(0, e)
            assert shmwindow.wait_flags(area.base, 2, e, time.monotonic() + 60), f"round {e}"
            assert lib.mpicoll_flag_test(area.base, shmwindow.FLAG_STRIDE, 2, e)
            assert (data[1][e % 2] == e).all(), f"stale data from the peer at round {e}"
    finally:
        go.set()
        t.join(60)
    assert not errors, errors


SETUP_SCRIPT = """
import sys, time, numpy as np, mpicoll
from mpi4py import MPI
w = MPI.COMM_WORLD
c = w.Dup()
mpicoll.allreduce(np.ones(1), comm=c)   # the communicator's state exists; no shm set-up yet
door = sys.argv[1]
if w.rank == w.size - 1:
    print(f"R{w.rank}:skipped", flush=True)
    time.sleep(60)                        # never calls the shm all-reduce
x = np.ones(4096, np.float32)
t0 = time.monotonic()
try:
    if door == "blocking":
        mpicoll.allreduce(x, comm=c, algorithm="shm", timeout=2)
    else:
        mpicoll.iallreduce(x, comm=c, algorithm="shm", timeout=2).wait()
    print(f"R{w.rank}:returned", flush=True)
except mpicoll.CollectiveTimeout as exc:
    print(f"R{w.rank}:TIMEOUT:{time.monotonic() - t0:.1f}:{exc}", flush=True)
    raise
"""


@needs_mpiexec
@pytest.mark.waits
@pytest.mark.parametrize("door", ["blocking", "nonblocking"])
def test_a_rank_missing_from_the_first_shm_call_times_out(tmp_path, door):
    """shm's first call on a communicator sets up the node communicator and
    the window collectively, MPI calls with no deadline: with timeout= the
    ranks first meet under the deadline (plan._meet_before_setup), so a
    rank that skips the call gives the others CollectiveTimeout, not a hang."""
    script = tmp_path / "setup.py"
    script.write_text(SETUP_SCRIPT)
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", "2", sys.executable, "-m", "mpi4py", str(script), door]
    rc, stdout, stderr = run_job(cmd, HARD_S, env=_env())
    out = stdout + stderr
    assert rc is not None, f"hung: still running after {HARD_S} s\n{out[-8000:]}"
    m = re.search(r"R0:TIMEOUT:(\d+\.\d+):(.*)", out)
    assert m, out[-3000:]
    assert float(m.group(1)) < 30 and "first set-up" in m.group(2), out[-3000:]
    assert "R0:returned" not in out
