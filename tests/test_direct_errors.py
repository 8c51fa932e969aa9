"""The cached small all-reduce's direct MPI_Allreduce (mpicoll/_direct.py):
an error code the library returns is raised as that code, not a generic one.

Serial: the plan is real (COMM_SELF, the MPI library's algorithm); only the
bound function is replaced by one that fails with a chosen code, since a
correct call into the library cannot be made to fail on purpose.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpicoll import _direct, api
from mpicoll import plan as _plan


@pytest.mark.parametrize("code", [MPI.ERR_COUNT, MPI.ERR_TRUNCATE, MPI.ERR_OTHER])
def test_direct_call_raises_the_library_code(code):
    x = np.ones(4, np.float32)
    out = np.empty_like(x)
    plan = _plan.allreduce(x, "sum", comm=MPI.COMM_SELF, out=out, algorithm="mpi")
    c = api._Cached(plan, x, out, "sum", MPI.COMM_SELF, "mpi", api._env_raw(), {})
    c.fn, c.args = (lambda *args: code), ()
    with pytest.raises(MPI.Exception) as info:
        api.short(c, x, out, "sum", MPI.COMM_SELF, "mpi")
    assert info.value.Get_error_code() == code
    assert info.value.Get_error_class() == MPI.Get_error_class(code)


def test_check_passes_success_and_raises_the_code():
    _direct.check(MPI.SUCCESS)
    with pytest.raises(MPI.Exception) as info:
        _direct.check(MPI.ERR_ARG)
    assert info.value.Get_error_code() == MPI.ERR_ARG
