"""``python -m mpicoll.bench overhead`` end to end, on a tiny run: every door
appears at the sizes it belongs to, next to its mpi4py reference, with a
positive finite ratio. Serial: the bench runs under its own ``mpiexec -n 2``
(watched with a timeout). Nothing here checks a time."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.bench import overhead

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
MPIEXEC_FLAGS = os.environ.get("MPIEXEC_FLAGS", "").split()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Written out here rather than read from the bench, so that a door the
# bench drops makes this test fail.
FUNCTIONS = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "scatter", "gather", "allgatherv",
             "alltoall", "alltoallv"]
COMM_METHODS = ["Allreduce", "Reduce", "Reduce_scatter_block", "Reduce_scatter", "Allgather", "Allgatherv", "Bcast",
                "Scatter", "Scatterv", "Gather", "Gatherv", "Alltoall", "Alltoallv"]
SIZES = [8, 5000]  # one at which the forced rows run (<= 4 KiB) and one at which they do not


def _library_has_persistent() -> bool:
    """Whether the MPI library makes persistent collectives (the init rows'
    references) - asked as the bench asks, since the version it reports does
    not say (Open MPI 5 reports MPI 3.1 and has them)."""
    import numpy as np

    try:
        req = MPI.COMM_SELF.Allreduce_init(np.zeros(1), np.zeros(1))
    except (AttributeError, NotImplementedError):
        return False
    req.Free()
    return True


def expected_names(nbytes: int, with_torch: bool) -> set:
    persistent = _library_has_persistent()
    names = {"allreduce/new", *FUNCTIONS, *("i" + f for f in FUNCTIONS)}
    names |= {f"Comm.{m}" for m in COMM_METHODS} | {f"Comm.I{m[0].lower()}{m[1:]}" for m in COMM_METHODS}
    if persistent:
        names |= {f + "_init" for f in FUNCTIONS} | {f"Comm.{m}_init" for m in COMM_METHODS}
    if nbytes <= 4096:
        algs = [a for a in mpicoll.algorithms("allreduce") if a != "auto"]
        names |= {f"forced/{a}" for a in algs}
        if persistent:
            names |= {f"forced_init/{a}" for a in algs}
    if with_torch:
        names.add("torch/all_reduce")
    return names


def test_overhead_every_door(tmp_path):
    if not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec next to sys.executable")
    with_torch = importlib.util.find_spec("torch") is not None
    out = tmp_path / "overhead.json"
    cmd = [MPIEXEC, *MPIEXEC_FLAGS, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "mpicoll.bench", "overhead",
           "--sizes", ",".join(map(str, SIZES)), "--rounds", "2", "--iters", "2", "--warmup", "3", "--json", str(out)]
    if with_torch:
        cmd.append("--torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for var in ("MPICOLL_ALGORITHM", "MPICOLL_TIMEOUT", "MPICOLL_CHECK"):  # the bench's own choices, not the caller's
        env.pop(var, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    meta = res["meta"]
    assert meta["schema"] == overhead.SCHEMA and meta["p"] == 2 and meta["sizes"] == SIZES
    assert meta["kernels_isa"] == mpicoll.kernels.isa() and meta["mpi_library"]
    assert len(meta["loadavg_before"]) == 3 and len(meta["loadavg_after"]) == 3
    for nbytes in SIZES:
        rows = [r for r in res["rows"] if r["bytes"] == nbytes]
        names = [r["name"] for r in rows]
        assert len(names) == len(set(names)), "a door measured twice at one size"
        assert set(names) == expected_names(nbytes, with_torch), nbytes
        for r in rows:
            assert r["ours_us"] > 0 and r["reference_us"] > 0, r
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
            assert r["ratio"] == pytest.approx(r["reference_us"] / r["ours_us"])
            assert r["calls_per_batch"] == 2, r  # --iters caps the batch
            assert len(r["ours_rounds_us"]) == len(r["reference_rounds_us"]) == 2
    # The printed table: a line per door, each naming its reference call.
    for r in res["rows"]:
        assert f"| `{r['door']}` | `{r['reference']}` |" in proc.stdout, r["door"]
    assert f"kernels: {mpicoll.kernels.isa()}" in proc.stdout and "load average" in proc.stdout


@pytest.mark.parametrize("argv, match", [
    (["--doors", "functions,nope"], "unknown door group"),
    (["--rounds", "0"], "rounds and iters"),
    (["--budget-ms", "0"], "budget"),
])
def test_overhead_rejects_bad_arguments_before_any_message(argv, match):
    # Raised before anything collective: serially, with no other rank, it
    # cannot hang.
    with pytest.raises(ValueError, match=match):
        overhead.main(argv)
