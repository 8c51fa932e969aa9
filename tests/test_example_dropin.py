"""examples/mpi4py_dropin.py runs (small size) and both variants agree."""
from __future__ import annotations

import importlib.util
import os

import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "mpi4py_dropin.py")


def test_dropin_example_same_answer_both_ways(capsys):
    spec = importlib.util.spec_from_file_location("mpi4py_dropin", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = mod.main(["--n", "96", "--iters", "20", "--repeat", "1"])
    assert set(results) == {"mpi4py", "mpicoll"}
    (l1, t1), (l2, t2) = results["mpi4py"], results["mpicoll"]
    assert l1 == pytest.approx(l2, rel=1e-10) and l1 > 0 and t1 > 0 and t2 > 0
    if MPI.COMM_WORLD.rank == 0:
        out = capsys.readouterr().out
        assert "mpi4py" in out and "mpicoll" in out
