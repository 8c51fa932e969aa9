"""The all-reduce bench and the tuner, in process on a tiny sweep (a few
sizes, few iterations): output schema, validation, files, and auto
following a profile. Nothing here checks a time. Run under mpiexec."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import profile
from mpicoll import tune as _tune
from mpicoll.bench import allreduce as bench

pytestmark = pytest.mark.mpi

TINY = dict(scale=1e-6, progress=False, stream_bytes=1 << 16)


@pytest.fixture
def no_profile(monkeypatch):
    monkeypatch.setenv(profile.ENV_TUNING_FILE, "none")
    profile.reload()
    yield
    profile.reload()


def test_bench_schema(tmp_path, no_profile):
    comm = MPI.COMM_WORLD
    p = comm.size
    sizes = [8, 3 * 4096 + 4]
    res = bench.run(comm, sizes, None, "sum", "float32", **TINY)
    algs = mpicoll.algorithms("allreduce") + [bench.NATIVE]
    assert res["meta"]["schema"] == bench.SCHEMA and res["meta"]["p"] == p
    assert res["meta"]["algorithms"] == algs and res["stream"]["node_gbs"] > 0
    rows = res["rows"]
    assert len(rows) == len(sizes) * len(algs) * 2
    assert {(r["bytes"], r["algorithm"], r["mode"]) for r in rows} == \
        {(s, a, m) for s in sizes for a in algs for m in ("out", "in")}
    for r in rows:
        assert set(bench.ROW_FIELDS) <= set(r)
        assert r["count"] * 4 == r["bytes"] and r["iters"] == 5
        assert 0 < r["min_us"] <= r["median_us"] <= r["max_us"] and r["min_us"] <= r["avg_us"] <= r["max_us"]
        assert r["time_us"] == r["min_us"]  # the default statistic
        assert r["wrong"] == 0, r
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * (p - 1) / p)
        assert r["pct_of_bound"] == pytest.approx(100 * r["bound_us"] / r["time_us"])
        if r["algorithm"] == bench.NATIVE:
            assert r["t_over_native"] == 1.0
        if r["algorithm"] == "auto":
            assert r["chosen"] == mpicoll.explain(r["bytes"], comm=comm).name
    assert [e["bytes"] for e in res["explain"]] == sizes
    # Every rank holds the same result (the slowest rank's times).
    assert comm.allgather(json.dumps(res["rows"])) == [json.dumps(res["rows"])] * p
    text = bench.table(res, explain=True)
    assert "speed-up" in text and "auto's choices" in text and "summary" in text
    bench.write_json(res, str(tmp_path / "r.json"))
    bench.write_csv(res, str(tmp_path / "r.csv"))
    assert json.load(open(tmp_path / "r.json"))["rows"] == json.loads(json.dumps(rows))
    with open(tmp_path / "r.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)


def test_bench_other_dtypes_and_ops(no_profile):
    comm = MPI.COMM_WORLD
    for dtype, op in (("float16", "sum"), ("int32", "max"), ("float64", "avg"), ("int64", "prod")):
        res = bench.run(comm, [1002], ["auto", "ring"], op, dtype, modes=("in",), **TINY)
        assert {r["algorithm"] for r in res["rows"]} == {"auto", "ring", bench.NATIVE}
        assert all(r["wrong"] == 0 for r in res["rows"]), (dtype, op)


def test_bench_counts_wrong_elements():
    comm = MPI.COMM_WORLD
    dt = mpicoll.dtypes.BY_NAME["float32"]
    ref = np.arange(10, dtype=np.float32)
    got = ref.copy()
    got[[2, 7]] += 1
    abs_sum = np.abs(ref).astype(np.float64)
    assert bench.count_wrong(comm, dt, "sum", got, ref, abs_sum) == 2
    assert bench.count_wrong(comm, dt, "max", got, ref, abs_sum) == 2
    assert bench.count_wrong(comm, dt, "sum", ref, ref, abs_sum) == 0


def test_bench_rejects_bad_arguments():
    comm = MPI.COMM_WORLD
    with pytest.raises(ValueError, match="unknown algorithm"):
        bench.run(comm, [8], ["nope"], **TINY)
    with pytest.raises(ValueError, match="unknown dtype"):
        bench.run(comm, [8], dtype="complex", **TINY)
    with pytest.raises(TypeError):
        bench.run(comm, [8], op="band", dtype="float32", **TINY)
    with pytest.raises(ValueError, match="stat"):
        bench.run(comm, [8], stat="p99", **TINY)


def test_bench_main_writes_files(tmp_path, no_profile, capsys):
    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path), root=0)  # rank 0 writes, into its own directory
    rc = bench.main(["--sizes", "8,64", "--scale", "1e-6", "--algorithms", "auto,tree", "--mode", "out",
                     "--json", f"{d}/b.json", "--csv", f"{d}/b.csv", "--explain", "--no-progress", "--stream-mib", "0.0625"])
    assert rc == 0
    if comm.rank == 0:
        out = capsys.readouterr().out
        assert "auto (" in out and "MPI_Allreduce" in out
        assert json.load(open(f"{d}/b.json"))["meta"]["modes"] == ["out"]


def test_tune_and_auto_follows_the_profile(tmp_path, monkeypatch):
    comm = MPI.COMM_WORLD
    p = comm.size
    if p == 1:
        with pytest.raises(ValueError, match="at least 2 ranks"):
            _tune.tune(comm, [8])
        return
    prof = _tune.tune(comm, [8, 64 << 10], segments=[4096], repeat=1, scale=1e-6, progress=False,
                       stream_bytes=1 << 16)
    # every rank holds the same rules (the model's are worked out on rank 0 and sent)
    rules = [tuple(r) for r in prof.rules]
    assert comm.allgather(rules) == [rules] * p
    measured = [r for r in prof.rules if r.source == "measured"]
    assert measured and all(r.p_min == r.p_max == p for r in measured)
    assert measured[0].bytes_min == 0 and measured[-1].bytes_max is None
    assert prof.meta["measured_p"] == [p] and prof.model is not None
    assert any(r.source == "model" and r.p_max is None for r in prof.rules)
    assert {m["algorithm"] for m in prof.measurements} >= {"ring", "mpi", bench.NATIVE}
    # A profile that sends everything at this p to the ring with 4 KiB
    # segments: auto must follow it, say so, and still be right.
    forced = profile.Profile([profile.Rule(p, p, 0, None, "ring", 4096, True, "measured", "test")],
                             model=prof.model, meta=prof.meta, measurements=prof.measurements)
    # One file for every rank (pytest's tmp_path differs per process): the
    # ranks must read the same profile, or rank 0's is used by all.
    f = comm.bcast(str(tmp_path / "tuning.json"), root=0)
    if comm.rank == 0:
        profile.save(forced, f)
    comm.Barrier()
    monkeypatch.setenv(profile.ENV_TUNING_FILE, f)
    profile.reload()
    # A communicator's profile is settled when its state is created: a new
    # communicator sees the new profile, COMM_WORLD keeps the one it has.
    fresh = comm.Dup()
    try:
        c = mpicoll.explain(1 << 20, comm=fresh)
        assert c.name == "ring" and c.segment_bytes == 4096 and "profile entry" in c.reason and f in c.reason
        x = np.arange(50_001, dtype=np.float32) % 7 + comm.rank
        want = sum(np.arange(50_001, dtype=np.float32) % 7 + r for r in range(p))
        np.testing.assert_array_equal(mpicoll.allreduce(x, comm=fresh), want)
        # Merging: a second run at the same p replaces this p's measurements.
        again = _tune.tune(comm, [8], segments=[], repeat=1, scale=1e-6, progress=False, base=prof,
                           stream_bytes=1 << 16)
        assert {m["bytes"] for m in again.measurements} == {8}
    finally:
        fresh.Free()
        profile.reload()
