"""Shared by the tests of mpicoll.torch: the skip rules and the process-group fixture."""
from __future__ import annotations

import pytest
from mpi4py import MPI

# The torch tests import torch (~1 s of CPU per rank) and start gloo next to
# mpicoll; at 5 and 8 ranks on CI's 2 cores that would cost minutes for no
# coverage that p = 1..4 (odd, even, one rank, a power of two) lacks.
MAX_RANKS = 4

if MPI.COMM_WORLD.Get_size() > MAX_RANKS:  # before importing torch, which is most of the cost
    pytest.skip(f"torch tests run at p <= {MAX_RANKS} (at more ranks than 2 CI cores they only add time)",
                allow_module_level=True)

torch = pytest.importorskip("torch", reason="torch is not installed (make install adds the CPU build)")


def skip_if_too_many_ranks():
    if MPI.COMM_WORLD.Get_size() > MAX_RANKS:
        pytest.skip(f"torch tests run at p <= {MAX_RANKS} (at more ranks than 2 CI cores they only add time)")


def sha(t) -> str:
    import hashlib

    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()
