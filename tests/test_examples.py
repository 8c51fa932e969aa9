"""The examples run (small sizes) and report what they claim."""
from __future__ import annotations

import importlib.util
import os

import pytest
from mpi4py import MPI

import mpicoll

pytestmark = pytest.mark.mpi

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_demo_runs_every_algorithm_and_validates(capsys):
    rows = load("demo").main(["--sizes", "8,40000", "--max-iters", "3"])
    assert {alg for _, alg, _, _ in rows} == set(mpicoll.algorithms("allreduce"))
    assert all(wrong == 0 for *_, wrong in rows)
    if MPI.COMM_WORLD.rank == 0:
        assert "MPI_Allreduce" in capsys.readouterr().out
