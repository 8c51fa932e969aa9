"""The ring's receive-size checks, through the public API: when one rank
passes a different element count (and no pre-flight check is asked for),
some rank raises MismatchError from the ring itself, instead of reducing
misaligned blocks or hanging; ``python -m mpi4py`` then ends the job.

Serial tests that launch ``mpiexec -n 3`` on a small script, as
test_failures.py does: the ranks that did not see the mismatch are left
waiting, so only the whole job can be watched. Written against
``mpicoll.allreduce``/``mpicoll.reduce`` with ``algorithm="ring"`` (not the
ring's internals) so that it holds whatever shape the ring's code takes.
"""
from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

from mpijob import run_job

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
# What the Makefile passes its own mpiexec (Open MPI: --allow-run-as-root --oversubscribe).
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
BOUND_S = 90

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mpi4py import MPI
    import mpicoll

    collective, n, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    comm = MPI.COMM_WORLD
    count = n + (extra if comm.rank == comm.size - 1 else 0)
    x = np.ones(count, np.float32)
    print(f"rank {comm.rank} calls {collective} with {count} elements", flush=True)
    try:
        if collective == "allreduce":
            mpicoll.allreduce(x, comm=comm, algorithm="ring")
        else:
            mpicoll.reduce(x, root=0, comm=comm, algorithm="ring")
    except mpicoll.MismatchError as err:
        print(f"rank {comm.rank} MismatchError: {err}", flush=True)
        raise
    print(f"rank {comm.rank} finished", flush=True)
""")


# (collective, count on most ranks, difference on the last rank): a long
# message (the pipelined ring, many segments) and a short one, one element
# more or fewer, and a count that changes every block.
CASES = [("allreduce", 1 << 20, 1), ("allreduce", 1 << 20, -1), ("allreduce", 1000, 7),
         ("allreduce", 30, -3), ("reduce", 1 << 20, 1), ("reduce", 1000, -5)]


@pytest.mark.parametrize("collective,n,extra", CASES)
def test_ring_count_mismatch_raises(tmp_path, collective, n, extra):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    script = tmp_path / "sizes.py"
    script.write_text(SCRIPT)
    rc, stdout, stderr = run_job([MPIEXEC, *MPIEXEC_FLAGS, "-n", "3", sys.executable, "-m", "mpi4py", str(script), collective,
                                 str(n), str(extra)], BOUND_S)
    assert rc is not None, f"mpiexec still running after {BOUND_S} s: a count mismatch hung the ring\n{(stdout + stderr)[-8000:]}"
    out = stdout + stderr
    for r in range(3):  # every rank got as far as the call (no import or set-up failure)
        assert re.search(rf"rank {r} calls {collective} with \d+ elements", stdout), out
    assert re.search(r"rank \d MismatchError: ", stdout), out
    assert "finished" not in stdout or stdout.count("finished") < 3, out
    assert rc != 0, out
