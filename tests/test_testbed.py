"""The multi-host test bed (scripts/testbed.sh): MPI across network
namespaces on this machine. Runs tests/testbed_check.py on 2 hosts x 2
ranks and on uneven hosts (2 + 1 ranks).

Skips where namespaces cannot be made (not root, no `ip netns`; the script
exits 77). Takes ~15 s on an idle 2-core machine, so it is opt-in:
``make test-testbed`` (MPICOLL_TESTBED=1)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "testbed.sh"

pytestmark = pytest.mark.skipif(os.environ.get("MPICOLL_TESTBED") != "1",
                                reason="multi-host test bed: run with `make test-testbed`")


@pytest.mark.parametrize("ppn", ["2,2", "2,1"])
def test_across_hosts(ppn):
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec next to this Python (make install)")
    proc = subprocess.run([str(SCRIPT), "--hosts", "2", "--ppn", ppn, "--mpiexec", str(mpiexec), "--",
                           sys.executable, "-m", "mpi4py", str(ROOT / "tests" / "testbed_check.py"), ppn],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "TESTBED OK" in proc.stdout
