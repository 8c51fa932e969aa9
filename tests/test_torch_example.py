"""examples/train_ddp.py runs on both backends (few epochs) and keeps the ranks' weights identical."""
from __future__ import annotations

import importlib.util
import os

import pytest
from mpi4py import MPI

from torch_helpers import skip_if_too_many_ranks, torch  # noqa: F401  (skips without torch)

pytestmark = pytest.mark.mpi

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "train_ddp.py")


def load():
    pytest.importorskip("sklearn", reason="scikit-learn (the digits) is not installed: pip install mpicoll[examples]")
    spec = importlib.util.spec_from_file_location("train_ddp", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("backend,hook", [("gloo", "none"), ("mpicoll", "none"), ("mpicoll", "fp16")])
def test_train_ddp(capsys, backend, hook):
    skip_if_too_many_ranks()
    mod = load()
    args = ["--backend", backend, "--hook", hook, "--epochs", "3", "--no-single"]
    assert mod.main(args) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "weights identical on all ranks: yes" in out
        acc = float(out.split("test accuracy: p=")[1].split()[1])
        assert acc > 0.7, out
