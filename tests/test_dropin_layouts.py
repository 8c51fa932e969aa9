"""mpicoll.Comm never lets the ranks take different paths: a buffer layout
that only one rank uses (v-form displacements that are not the packed
prefix sums, a derived datatype with the same type signature as the other
ranks' predefined one) is packed locally on that rank, and the call still
runs on mpicoll everywhere, with mpi4py's bits.

Serial tests: the cases run in one ``mpiexec -n P python -m mpi4py
tests/dropin_layout_case.py CASE...`` job under a hard timeout, so that a
regression (the ranks in different collectives) fails, naming the cases
that did not finish, instead of hanging.
"""
from __future__ import annotations

import os
import sys

import pytest

from mpijob import run_job

from dropin_layout_case import CASES

HERE = os.path.dirname(os.path.abspath(__file__))
CASE_SCRIPT = os.path.join(HERE, "dropin_layout_case.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
# Startup of 2-3 ranks and three small calls per case: seconds, even on a loaded machine.
HARD_S = 120


def run_cases(cases, p: int):
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", str(p), sys.executable, "-m", "mpi4py", CASE_SCRIPT, *cases]
    rc, out, where = run_job(cmd, HARD_S, merge=True)
    return rc, out + where


@pytest.mark.parametrize("p", [2, 3])
def test_rank_local_layouts_run_on_mpicoll_everywhere(p):
    cases = sorted(CASES)
    rc, out = run_cases(cases, p)
    unfinished = [c for c in cases if f"{c}: OK at p={p}" not in out]
    assert rc is not None, f"hung at p={p} (killed after {HARD_S} s) in {unfinished[0]}:\n{out[-8000:]}"
    assert rc == 0 and not unfinished, f"failed at p={p}: {unfinished}\n{out[-3000:]}"
