"""Deadlines cover the collective steps before an algorithm runs, for every
collective and every door: the creation of mpicoll's state on a
communicator's first call, and ``check=True``'s pre-flight. A rank that
skips the call must not leave the others waiting, and the first call's
timeout names the rank that did not arrive.

Each case is a ``tests/timeout_case.py`` job (see tests/test_timeout.py);
the last rank misbehaves.
"""
from __future__ import annotations

import os

import pytest

import mpicoll
from test_timeout import MPIEXEC, run_case, timeout_peers

# Each case waits for its deadline (conftest spreads such tests through the run).
pytestmark = pytest.mark.waits

TIMEOUT = 2.0
# The deadline, then the case script's 1 s pause and mpi4py's abort on a
# loaded 2-core machine.
SLACK_S = 8.0
COLLS = mpicoll.algorithms.COLLECTIVES
FAMILY = ("scatter", "gather", "allgatherv", "alltoall", "alltoallv")

CASES = (
    # The odd rank skips the communicator's first call: state creation waits.
    [("first", c, "blocking", 3, False) for c in COLLS]
    + [("first", c, ("nonblocking", "persistent")[i % 2], 3 + i % 2, True) for i, c in enumerate(COLLS)]
    # One call together, then the odd rank skips the next: check=True's
    # pre-flight waits.
    + [("check", c, "blocking", 3, True) for c in FAMILY]
    # mpicoll.Comm's methods, deadline from MPICOLL_TIMEOUT.
    + [("first", c, "dropin", 3, False) for c in ("allreduce", "bcast", "scatter", "alltoallv")]
    + [("check", c, "dropin", 3, True) for c in ("gather", "allgatherv")]
    # Scatterv's binomial tree broadcasts the root's counts first.
    + [("first", "scatterv/tree", "dropin", 3, False)]
)


@pytest.mark.parametrize("case,coll,mode,p,check", CASES, ids=lambda v: str(v))
def test_skipping_rank_times_out_the_others(case, coll, mode, p, check):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    env = {"MPICOLL_TIMEOUT": str(TIMEOUT), "MPICOLL_CHECK": "1" if check else "0"} if mode == "dropin" else None
    spec = coll if "/" in coll else f"{coll}/auto"
    rc, out, took, reports = run_case(case, spec, mode, p, timeout=TIMEOUT, check=check, env_extra=env)
    assert rc is not None, f"still running: hang\n{out[-8000:]}"
    odd = p - 1
    assert reports.get(odd, ("",))[0] == "skipped", out[-3000:]
    peers = timeout_peers(reports)
    # Every rank that made the call raised CollectiveTimeout, in time.
    assert sorted(peers) == list(range(p - 1)), f"{reports}\n{out[-3000:]}"
    assert took <= TIMEOUT + SLACK_S, f"job ended {took:.1f} s after the call\n{out[-3000:]}"
    for r in peers:
        seconds, _, message = reports[r][1].split(":", 2)
        assert float(seconds) <= TIMEOUT + 1.0, reports[r]
        if case == "first":
            # Exactly the rank that skipped, in the attribute and the message.
            assert peers[r] == [odd], (r, peers[r], message)
            assert f"not heard from rank(s) {odd}" in message, message
