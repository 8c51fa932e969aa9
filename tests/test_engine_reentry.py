"""The engine's lock is not reentrant, and steps and finishes run under it
(docs/architecture.md, "Threading contract"): a schedule step or a finish
that calls back into the engine is a clear error recorded on its request,
not a thread waiting for itself for ever.

Serial: the case runs as a one-rank job in a process of its own, so that a
regression (the hang) is ended by the time limit instead of taking the test
session down with it."""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

from mpijob import run_job

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
BOUND_S = 60

CASE = textwrap.dedent("""
    import sys
    import numpy as np
    from mpi4py import MPI
    from mpicoll import commstate as _comm, engine, schedule as _sched

    where = sys.argv[1]

    def context():
        st = _comm.state(MPI.COMM_SELF)
        _, tag = st.next_seq()
        return _sched.Context(st, tag, {}, ("test", "local", 8, 0))

    def fine():
        ctx = context()
        yield [ctx.send(np.ones(2), 0), ctx.recv(np.zeros(2), 0)]

    def calls_in(first):
        ctx = context()
        if first:  # the first step runs inside engine.start, under the lock
            engine.start(fine()).wait()
        yield [ctx.send(np.ones(2), 0), ctx.recv(np.zeros(2), 0)]
        engine.start(fine()).wait()  # a later step runs inside the engine's progress

    if where == "finish":
        req = engine.start(fine(), finish=lambda: engine.start(fine()).wait())
    else:
        req = engine.start(calls_in(where == "first step"))
    try:
        req.wait()
        print("no error", flush=True)
    except RuntimeError as exc:
        print("error:", exc, flush=True)
    # The engine is usable afterwards: the lock was released.
    engine.start(fine()).wait()
    print("engine still works", flush=True)
""")


@pytest.mark.parametrize("where", ["first step", "later step", "finish"])
def test_calling_the_engine_from_a_step_is_an_error_not_a_hang(tmp_path, where):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    script = tmp_path / "reentry.py"
    script.write_text(CASE)
    rc, out, _ = run_job([MPIEXEC, *MPIEXEC_FLAGS, "-n", "1", sys.executable, "-m", "mpi4py", str(script), where],
                         BOUND_S, merge=True)
    assert rc is not None, f"the job hung: a step waited for the engine's lock it holds\n{out[-8000:]}"
    assert rc == 0, out
    assert "error: mpicoll: a schedule step or a request's finishing work called into the progress engine" in out, out
    assert "engine still works" in out, out
