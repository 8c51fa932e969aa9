"""Profile rules by kind of process count (``p_kind``), and the rules
``python -m mpicoll.simulate --profile-out`` writes (``profile_from``).

On 1 Gbit/s the best all-reduce depends on whether p is a power of two
(Rabenseifner's fold costs it 1.8-1.9x at other p, docs/scale.md), so a
simulated profile keeps powers of two and other counts in separate rule
series. Pure logic: no SimGrid runs, no mpiexec.
"""
from __future__ import annotations

import json
import os
import types

import pytest

from mpicoll import profile, select, simulate  # simulate's import needs no SimGrid

ALL = {"mpi", "ring", "tree", "recursive_doubling", "rabenseifner"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pick(prof, p, nbytes=1 << 20):
    return select.allreduce(p, nbytes, "sum", "float32", profile=prof, available=ALL.__contains__)


def by_kind():
    """Powers of two take Rabenseifner, the others the ring, all p from 2."""
    return profile.Profile([
        profile.Rule(2, None, 0, None, "rabenseifner", None, True, "simulated", "pow2", "power_of_two"),
        profile.Rule(2, None, 0, None, "ring", None, True, "simulated", "other", "other"),
    ], path="/x/kinds.json")


def test_a_profile_with_both_kinds_picks_per_kind():
    prof = by_kind()
    for p in (2, 4, 32, 64, 128, 1024):
        assert pick(prof, p).name == "rabenseifner", p
    for p in (3, 5, 24, 40, 48, 56, 96):
        assert pick(prof, p).name == "ring", p
    c = pick(prof, 48)
    assert "simulated" in c.reason and "cost model" not in c.reason, c.reason
    assert "not powers of two" in c.reason and "/x/kinds.json" in c.reason, c.reason
    assert "powers of two only" in pick(prof, 64).reason


def test_a_kind_does_not_widen_the_p_range():
    # A power-of-two rule for p in [2, 32] says nothing about p = 64.
    prof = profile.Profile([profile.Rule(2, 32, 0, None, "tree", None, True, "measured", "", "power_of_two")])
    assert pick(prof, 16).name == "tree"
    assert pick(prof, 64).reason.startswith("default") and pick(prof, 24).reason.startswith("default")


def test_old_profile_without_the_field_behaves_as_before(tmp_path):
    # A rule as profiles were written before p_kind: every p in its range.
    old = {"format": "mpicoll-tuning", "version": 1, "meta": {},
           "rules": [{"p_min": 2, "p_max": 63, "bytes_min": 0, "bytes_max": None, "native_dtype": True,
                      "algorithm": "ring", "segment_bytes": None, "source": "model", "note": "old"}]}
    f = tmp_path / "old.json"
    f.write_text(json.dumps(old))
    prof = profile.load(str(f))
    assert prof.rules[0].p_kind == "any"
    for p in (2, 32, 48, 63):
        c = pick(prof, p)
        assert c.name == "ring" and "predicted by the fitted cost model" in c.reason, (p, c.reason)
    assert "powers of two" not in pick(prof, 48).reason  # "any" is not mentioned
    assert pick(prof, 64).reason.startswith("default")
    # Written back, the rule is as it was: no p_kind for "any", so older
    # versions (which reject unknown fields) still read it.
    assert prof.to_json()["rules"] == old["rules"]


def test_the_kind_round_trips_and_is_validated(tmp_path):
    f = str(tmp_path / "k.json")
    profile.save(by_kind(), f)
    back = profile.load(f)
    assert [r.p_kind for r in back.rules] == ["power_of_two", "other"]
    assert [r.source for r in back.rules] == ["simulated", "simulated"]
    for bad in ("pow2", "", "ANY", 2, None, ["any"], {"any": 1}, True):
        d = by_kind().to_json()
        d["rules"][0]["p_kind"] = bad
        with pytest.raises(ValueError, match="p_kind"):
            profile.Profile.from_json(json.loads(json.dumps(d)))
    d = by_kind().to_json()
    d["rules"][0]["source"] = "simulation"
    with pytest.raises(ValueError, match="source"):
        profile.Profile.from_json(d)


# ---- profile_from -------------------------------------------------------------

def summary_row(p, nbytes, times, mpi_priced=None):
    """One summary entry as simulate.summarize makes it (the fields
    profile_from reads, and the others for realism)."""
    best = min(times, key=times.get)
    return {"p": p, "bytes": nbytes, "times": dict(times), "native": {"mpich": None, "ompi": None},
            "mpi_priced": mpi_priced, "best": best, "best_s": times[best]}


# The shape of this-machine.xml (1 Gbit/s): Rabenseifner best at powers of
# two, the ring at the others (seconds at p = 64 and p = 48, 1 MiB, in
# sim/results/profile-grid-this-machine-ppn1.json).
RABEN, RING = {"ring": 31.3e-3, "rabenseifner": 18.9e-3}, {"ring": 27.7e-3, "rabenseifner": 35.7e-3}


def grid_summary(ps=(32, 48, 64), sizes=(1 << 20, 4 << 20)):
    return [summary_row(p, n, RABEN if profile.is_power_of_two(p) else RING) for p in ps for n in sizes]


def fake_platform():
    return types.SimpleNamespace(path=os.path.join(ROOT, "platforms", "this-machine.xml"))


def test_profile_from_writes_powers_of_two_and_others_apart(tmp_path):
    prof = simulate.profile_from(grid_summary(), fake_platform(), 1)
    f = str(tmp_path / "sim.json")
    profile.save(prof, f)
    prof = profile.load(f)
    assert {r.source for r in prof.rules} == {"simulated"}
    assert {r.p_kind for r in prof.rules} == {"power_of_two", "other"}
    # Each series from p = 2, each simulated p reaching down to the previous
    # p of its own series, the last open-ended.
    spans = sorted({(r.p_kind, r.p_min, r.p_max) for r in prof.rules}, key=str)
    assert spans == sorted({("power_of_two", 2, 32), ("power_of_two", 33, None), ("other", 2, None)}, key=str)
    for nbytes in (8, 1 << 10, (1 << 20) - 1):  # below the grid's smallest size: not the profile's to decide
        for p in (24, 40, 48, 64, 128):
            assert "profile entry" not in pick(prof, p, nbytes).reason, (p, nbytes)
    for nbytes in (1 << 20, 2 << 20, 16 << 20):
        for p in (40, 56, 24, 80, 96):  # held out, not powers of two: p = 48's pick
            c = pick(prof, p, nbytes)
            assert c.name == "ring" and "simulated" in c.reason and "at p=48" in c.reason, (p, nbytes, c.reason)
        for p in (16, 32, 128, 256):  # powers of two: p = 32's or 64's pick
            c = pick(prof, p, nbytes)
            assert c.name == "rabenseifner", (p, nbytes, c.reason)
        assert "at p=64" in pick(prof, 128, nbytes).reason


def test_profile_from_one_kind_writes_kind_any_as_before():
    for ps in ((32, 64), (24, 48)):
        prof = simulate.profile_from(grid_summary(ps), fake_platform(), 1)
        assert {r.p_kind for r in prof.rules} == {"any"}
        assert sorted({(r.p_min, r.p_max) for r in prof.rules}, key=str) == \
            sorted({(2, ps[0]), (ps[0] + 1, None)}, key=str)
        assert all("p_kind" not in r for r in prof.to_json()["rules"])
        # Kind "any": p = 40 takes the rule of the next simulated p, whatever its kind.
        assert pick(prof, 40).name == ("rabenseifner" if ps == (32, 64) else "ring")
