"""Malformed tuning profiles warn once and are ignored: never an exception
on every call (a bad file may slow a program down, never stop it).

Each case is a mutation of a valid profile's JSON text: wrong types at
every level, deep nesting, huge values, missing fields. For each, the
profile is loaded the way "auto" loads it (``profile.current()``), and the
things that use a profile on every call run: the decision
(``select.allreduce``), the digest every rank compares when a
communicator's state is created, and ``mpicoll.explain``.
"""
from __future__ import annotations

import json
import warnings

import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import commstate as _comm
from mpicoll import profile, select
from test_tuning import example_profile


def _valid():
    return example_profile().to_json()


def _set(path, value):
    def mutate(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
        return json.dumps(d)
    return mutate


DEEP = 5000  # deeper than Python's recursion limit

MUTATIONS = {
    "top-level list": lambda d: "[1, 2]",
    "top-level deep nesting": lambda d: "[" * DEEP + "]" * DEEP,
    "meta deep nesting": lambda d: json.dumps(d)[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP + "}",
    "meta nested past the encoder": lambda d: json.dumps(dict(d, meta={"a": json.loads("[" * 900 + "]" * 900)})),
    "meta a list of ints": _set(["meta"], [1, 2]),
    "meta a number": _set(["meta"], 5),
    "meta a string": _set(["meta"], "host"),
    "measurements a number": _set(["measurements"], 7),
    "measurements an object": _set(["measurements"], {"p": 2}),
    "measurements true": _set(["measurements"], True),
    "rules an object": _set(["rules"], {"a": 1}),
    "rule a list": _set(["rules", 0], [1, 2]),
    "rule p_min a string": _set(["rules", 0, "p_min"], "2"),
    "rule p_max a float": _set(["rules", 0, "p_max"], 2.5),
    "rule bytes_max huge": _set(["rules", 0, "bytes_max"], 10 ** 400),
    "rule p_min huge": _set(["rules", 0, "p_min"], 10 ** 400),
    "rule algorithm a list": _set(["rules", 0, "algorithm"], ["ring"]),
    "rule algorithm an object": _set(["rules", 0, "algorithm"], {"name": "ring"}),
    "rule note a list": _set(["rules", 0, "note"], ["x"]),
    "rule note an object": _set(["rules", 0, "note"], {"x": 1}),
    "rule source a list": _set(["rules", 0, "source"], ["measured"]),
    "rule p_kind unknown": _set(["rules", 0, "p_kind"], "odd"),
    "rule p_kind a number": _set(["rules", 0, "p_kind"], 2),
    "rule p_kind null": _set(["rules", 0, "p_kind"], None),
    "rule p_kind a list": _set(["rules", 0, "p_kind"], ["any"]),
    "rule p_kind true": _set(["rules", 0, "p_kind"], True),
    "rule p_kind valid, other": _set(["rules", 0, "p_kind"], "other"),  # accepted: must be usable
    "rule native_dtype a string": _set(["rules", 0, "native_dtype"], "yes"),
    "rule segment_bytes a string": _set(["rules", 1, "segment_bytes"], "262144"),
    "rule segment_bytes on mpi": _set(["rules", 0, "segment_bytes"], 4096),
    "model a number": _set(["model"], 3),
    "model a list": _set(["model"], [1]),
    "model params a list": _set(["model", "params"], [1, 2]),
    "model params a string": _set(["model", "params"], "p2p"),
    "model param a string": _set(["model", "params", "p2p", "alpha"], "fast"),
    "model param null": _set(["model", "params", "p2p", "alpha"], None),
    "model param nested": _set(["model", "params", "p2p", "alpha"], [[1]]),
    "model params p2p a number": _set(["model", "params", "p2p"], 1),
    "model huge parameter": _set(["model", "params", "p2p", "alpha"], 10 ** 400),
    "model rms a list": _set(["model", "rms_rel_error"], [1]),
    "model rms a string value": _set(["model", "rms_rel_error", "p2p"], "x"),
    "model missing params": _set(["model"], {"rms_rel_error": {}}),
    "version a string": _set(["version"], "1"),
    "format missing": lambda d: json.dumps({k: v for k, v in d.items() if k != "format"}),
    "not utf-8": None,
}


def _exercise(prof):
    """What runs on every call with a profile loaded."""
    for p in (2, 3, 5, 64):
        for nbytes in (8, 4096, 1 << 20):
            for native in (True, False):
                select.allreduce(p, nbytes, "sum", "float32", native_dtype=native, profile=prof)
    _comm._digest(prof)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_malformed_profile_warns_once_and_is_ignored(tmp_path, monkeypatch, name):
    f = tmp_path / "tuning.json"
    mutate = MUTATIONS[name]
    if mutate is None:
        f.write_bytes(b'{"format": "mpicoll-tuning", "version": 1, "meta": {"host": "\xff\xfe"}, "rules": []}')
    else:
        f.write_text(mutate(_valid()))
    monkeypatch.setenv(profile.ENV_TUNING_FILE, str(f))
    profile.reload()
    select.allreduce.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                prof = profile.current()
                _exercise(prof)
                mpicoll.explain(1 << 20, comm=MPI.COMM_SELF)
        ours = [w for w in caught if "tuning profile" in str(w.message)]
        if prof is not None:
            # Accepted: it must be usable (exercised above) and not warned about.
            assert not ours, [str(w.message) for w in ours]
        else:
            assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning), \
                [str(w.message) for w in caught]
    finally:
        profile.reload()
        select.allreduce.cache_clear()
