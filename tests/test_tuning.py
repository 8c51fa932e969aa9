"""Tuning profiles, selection from a profile, the cost model's formulas and
fit, the tuner's range building: everything that needs no timing and no
mpiexec (the bench and tuner runs are in test_bench.py)."""
from __future__ import annotations

import json
import math

import pytest

from mpicoll import model, modelfit, profile, select
from mpicoll import tune as _tune
from mpicoll.bench import allreduce as bench

ALL = {"mpi", "ring", "tree", "recursive_doubling", "rabenseifner"}


def example_profile(path=None):
    rules = [
        profile.Rule(2, 2, 0, 4096, "mpi", None, True, "measured", "fastest at p=2"),
        profile.Rule(2, 2, 4096, None, "ring", 1 << 18, True, "measured"),
        profile.Rule(3, 7, 0, None, "rabenseifner", None, True, "model", "least predicted time at p=5"),
        profile.Rule(2, None, 0, None, "tree", None, False, "measured"),
    ]
    m = model.Model({"p2p": model.Params(1e-5, 2e-6, 1e-10, 2e-10), "mpi": model.Params(2e-6, 1e-6, 1e-10, 2e-10)},
                    {"p2p": 0.1, "mpi": 0.2})
    meas = [{"p": 2, "bytes": 8, "algorithm": "ring", "segment_bytes": None, "time_s": 1e-5, "itemsize": 4,
             "native_dtype": True}]
    return profile.Profile(rules, model=m, meta={"host": "h", "measured_p": [2]}, measurements=meas, path=path)


# ---- profiles -----------------------------------------------------------------

def test_profile_round_trip(tmp_path):
    f = str(tmp_path / "sub" / "tuning.json")
    prof = example_profile()
    profile.save(prof, f)
    back = profile.load(f)
    assert back.to_json() == prof.to_json() and back.path == f
    assert back.rules[1].segment_bytes == 1 << 18 and back.rules[2].p_max == 7 and back.rules[0].bytes_max == 4096
    assert back.model.params["p2p"] == prof.model.params["p2p"]
    assert json.load(open(f))["format"] == "mpicoll-tuning"


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(format="other"), "not an mpicoll tuning profile"),
    (lambda d: d.update(version=99), "unsupported profile version"),
    (lambda d: d.update(rules={}), "'rules' must be a list"),
    (lambda d: d["rules"][0].update(p_min=-1), "p_min"),
    (lambda d: d["rules"][0].update(algorithm="auto"), "algorithm"),
    (lambda d: d["rules"][0].update(bytes_max=0), "bytes_max|empty range"),
    (lambda d: d["rules"][0].update(source="guess"), "source"),
    (lambda d: d["rules"][0].update(p_kind="pow2"), "p_kind"),
    (lambda d: d["rules"][0].update(p_kind=None), "p_kind"),
    (lambda d: d["rules"][0].update(colour="red"), "unknown rule fields"),
    (lambda d: d["rules"][0].pop("algorithm"), "lacks algorithm"),
    (lambda d: d["model"]["params"]["p2p"].pop("beta"), "malformed model"),
])
def test_profile_validation(mutate, match):
    d = example_profile().to_json()
    mutate(d)
    with pytest.raises(ValueError, match=match):
        profile.Profile.from_json(json.loads(json.dumps(d)))


def test_profile_path_and_current(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(profile.ENV_TUNING_FILE, raising=False)
    profile.reload()
    assert profile.path() == str(tmp_path / "cache" / "mpicoll" / "tuning.json")
    assert profile.current() is None  # no file at the default location: silently none
    f = str(tmp_path / "p.json")
    profile.save(example_profile(), f)
    monkeypatch.setenv(profile.ENV_TUNING_FILE, f)
    assert profile.current().path == f
    for off in ("", "none", "off"):
        monkeypatch.setenv(profile.ENV_TUNING_FILE, off)
        assert profile.path() is None and profile.current() is None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv(profile.ENV_TUNING_FILE, str(bad))
    with pytest.warns(RuntimeWarning, match="ignoring tuning profile"):
        assert profile.current() is None
    monkeypatch.setenv(profile.ENV_TUNING_FILE, str(tmp_path / "missing.json"))
    with pytest.warns(RuntimeWarning):  # named explicitly but absent: say so
        assert profile.current() is None
    profile.reload()


# ---- selection ----------------------------------------------------------------

def test_selection_from_profile():
    prof = example_profile("/x/tuning.json")
    avail = ALL.__contains__
    c = select.allreduce(2, 100, "sum", "float32", profile=prof, available=avail)
    assert c.name == "mpi" and "profile entry" in c.reason and "measured" in c.reason and "/x/tuning.json" in c.reason
    c = select.allreduce(2, 4096, "sum", "float32", profile=prof, available=avail)
    assert (c.name, c.segment_bytes) == ("ring", 1 << 18)
    c = select.allreduce(6, 1 << 20, "sum", "float64", profile=prof, available=avail)
    assert c.name == "rabenseifner" and "cost model" in c.reason
    c = select.allreduce(6, 1 << 20, "sum", "float16", native_dtype=False, profile=prof, available=avail)
    assert c.name == "tree"  # the non-native rule
    # No rule for p=9: the profile's fitted model decides.
    c = select.allreduce(9, 1 << 20, "sum", "float32", profile=prof, available=avail)
    assert c.reason.startswith("model fitted in /x/tuning.json") and c.name in ALL
    want = min((prof.model.predict(a, 9, 1 << 20), a) for a in ALL)[1]
    assert c.name == want
    # One rank: nothing to choose, whatever the profile says.
    assert select.allreduce(1, 100, "sum", "float32", profile=prof).name == "mpi"


def test_selection_skips_unregistered_algorithms():
    prof = profile.Profile([profile.Rule(2, 2, 0, None, "shm", None, True, "measured"),
                            profile.Rule(2, 2, 0, None, "ring", None, True, "measured")])
    assert select.allreduce(2, 64, "sum", "float32", profile=prof, available=ALL.__contains__).name == "ring"
    assert select.allreduce(2, 64, "sum", "float32", profile=prof,
                            available=(ALL | {"shm"}).__contains__).name == "shm"
    # Default availability is the real registry, which has no "nonexistent".
    prof = profile.Profile([profile.Rule(2, 2, 0, None, "nonexistent", None, True, "measured")])
    c = select.allreduce(2, 64, "sum", "float32", profile=prof)
    assert c.name != "nonexistent" and c.reason.startswith("default")


def test_default_selection_explains_itself():
    for p in (2, 3, 4, 5, 8, 4096):
        for nb in (0, 8, 4096, 1 << 20, 4 << 20, 1 << 30):
            for native in (True, False):
                c = select.allreduce(p, nb, "sum", "float32" if native else "float16", native_dtype=native)
                assert c.name in ALL and c.reason.startswith("default") and c.segment_bytes is None


# ---- the cost model -----------------------------------------------------------

def test_model_terms_hand_computed():
    n = 1 << 20
    # ring, p=4, one segment per block (256 KiB < 1 MiB): 2(p-1)=6 messages,
    # 2*3/4 n on the wire, 3/4 n combined.
    assert model.terms("ring", 4, n) == (6, 1.5 * n, 0.75 * n)
    # ring with 64 KiB segments: 4 segments per 256 KiB block, (p-1)(segs+1) = 15.
    assert model.terms("ring", 4, n, segment_bytes=64 << 10).messages == 15
    # The busiest rank's counts (what it sends and combines).
    # recursive doubling, p=4: 2 rounds of the whole vector; p=6: a fold
    # survivor also combines the fold-in and sends the fold-out.
    assert model.terms("recursive_doubling", 4, n) == (2, 2 * n, 2 * n)
    assert model.terms("recursive_doubling", 6, n) == (3, 3 * n, 3 * n)
    # Rabenseifner, p=8: 2*3 messages, 2*(7/8) n, 7/8 n; p=5 (pof2=4): +1, +n, +n.
    assert model.terms("rabenseifner", 8, n) == (6, 1.75 * n, 0.875 * n)
    assert model.terms("rabenseifner", 5, n) == (5, 1.5 * n + n, 0.75 * n + n)
    # tree, p=5: the root combines its 3 children's vectors and sends to 3 in the bcast.
    assert model.terms("tree", 5, n) == (3, 3 * n, 3 * n)
    # Fewer elements than ranks: ring and Rabenseifner run recursive doubling.
    assert model.terms("ring", 8, 16) == model.terms("recursive_doubling", 8, 16)
    assert model.terms("rabenseifner", 8, 16) == model.terms("recursive_doubling", 8, 16)
    # MPICH: recursive doubling up to 2 KiB, Rabenseifner above.
    assert model.mpich_choice(4, 2048) == "recursive_doubling" and model.mpich_choice(4, 2052) == "rabenseifner"
    assert model.terms("mpi", 4, n) == model.terms("rabenseifner", 4, n)
    assert model.terms("ring", 1, n) == (0, 0, 0)
    with pytest.raises(ValueError, match="no cost formula"):
        model.terms("shm", 4, n)


def test_model_time_formula():
    prm = model.Params(o=1e-5, alpha=2e-6, beta=1e-9, gamma=5e-10)
    n = 1 << 20
    # Ring on p=4: o + 6 alpha + 1.5 n beta + 0.75 n gamma.
    want = 1e-5 + 6 * 2e-6 + 1.5 * n * 1e-9 + 0.75 * n * 5e-10
    assert math.isclose(prm.time(model.terms("ring", 4, n)), want)
    m = model.Model({"p2p": prm}, {})
    assert math.isclose(m.predict("ring", 4, n), want)
    with pytest.raises(ValueError, match="no fitted parameters"):
        m.predict("mpi", 4, n)


def test_model_fit_recovers_parameters():
    true = {"p2p": model.Params(8e-6, 3e-6, 4e-10, 2e-10), "mpi": model.Params(5e-6, 1e-6, 3e-10, 3e-10),
            "native": model.Params(1e-6, 1e-6, 2e-10, 3e-10)}
    rows = []
    for p in (2, 3, 4, 5):
        for nb in (8, 512, 32768, 1 << 20, 16 << 20):
            for alg in ("ring", "tree", "recursive_doubling", "rabenseifner", "mpi", "MPI_Allreduce", "auto"):
                fam = model.family(alg)
                t = true[fam].time(model.terms(alg, p, nb)) if alg != "auto" else 1.0
                rows.append({"p": p, "bytes": nb, "algorithm": alg, "time_s": t})
    fitted = modelfit.fit(rows)
    for fam, prm in true.items():
        for a, b in zip(fitted.params[fam], prm):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15), (fam, fitted.params[fam], prm)
        assert fitted.rms_rel_error[fam] < 1e-9
    assert model.Model.from_json(json.loads(json.dumps(fitted.to_json()))) == fitted


def test_model_fit_is_non_negative():
    # Times that fall with size would need a negative beta: clamp it to 0.
    rows = [{"p": 2, "bytes": nb, "algorithm": "ring", "time_s": 1e-3 / (1 + nb / 1e6)} for nb in (8, 1 << 20, 1 << 24)]
    prm = modelfit.fit(rows).params["p2p"]
    assert all(v >= 0 for v in prm)


# ---- the tuner's range building and the bench's helpers -------------------------

def test_ranges_from_winners():
    sizes = [8, 32, 128, 512]
    w = [("mpi", None), ("mpi", None), ("ring", 1024), ("ring", 1024)]
    assert _tune.ranges_from_winners(sizes, w) == [(0, 64, ("mpi", None)), (64, None, ("ring", 1024))]
    assert _tune.ranges_from_winners([8], [("tree", None)]) == [(0, None, ("tree", None))]


def test_p_ranges_cover_every_count():
    rs = _tune.p_ranges(64)
    assert rs[0] == (2, 2, 2) and rs[1] == (3, 3, 3) and rs[-1][1] is None
    for p in range(2, 300):
        hits = [r for r in rs if r[0] <= p and (r[1] is None or p <= r[1])]
        assert len(hits) == 1, p
        assert hits[0][0] <= hits[0][2] and (hits[0][1] is None or hits[0][2] <= hits[0][1])


def test_smooth_removes_lone_flips():
    a, b = ("mpi", None), ("ring", None)
    assert _tune.smooth([a, b, a, a, b, b]) == [a, a, a, a, b, b]
    assert _tune.smooth([b, a]) == [b, a] and _tune.smooth([]) == []


def test_choose_prefers_native_on_a_near_tie():
    t = {("mpi", None): 1.0, ("ring", None): 0.97, ("tree", None): 1.2}
    assert _tune.choose(t, 0.05) == ("mpi", None)
    assert _tune.choose(t, 0.0) == ("ring", None)
    t[("ring", 1 << 18)] = 0.5
    assert _tune.choose(t, 0.05) == ("ring", 1 << 18)


def test_bench_sizes_and_iterations():
    s = bench.default_sizes()
    assert s[0] == 8 and s[-1] == 256 << 20 and s[-2] == 128 << 20 and all(b == 4 * a for a, b in zip(s, s[1:-1]))
    assert bench.parse_sizes("8,4K,1M,4k") == [8, 4096, 4096 * 256]
    assert bench.parse_sizes("8:512") == [8, 32, 128, 512]
    assert bench.parse_sizes("1K:8K:2") == [1024, 2048, 4096, 8192]
    for bad in ("0", "x", "8:4", "1:8:1"):
        with pytest.raises(ValueError):
            bench.parse_sizes(bad)
    for nb in (8, 1 << 20, 1 << 28):
        warm, it = bench.iterations(nb)
        assert 5 <= it <= 1000 and 1 <= warm <= it
    assert bench.iterations(8)[1] > bench.iterations(1 << 28)[1]
    # 2 p n bytes at B: 4 ranks, 1 GB at 8 GB/s -> 1 s.
    assert math.isclose(bench.lower_bound(4, 10 ** 9, 8.0), 1.0)
