"""Tuning profiles: measured decisions for ``algorithm="auto"``, on disk as JSON.

``python -m mpicoll.tune`` writes one; every process reads it once, on the
first "auto" all-reduce, from ``$MPICOLL_TUNING_FILE`` or else from the
per-user default ``$XDG_CACHE_HOME/mpicoll/tuning.json``
(``~/.cache/mpicoll/tuning.json``). ``MPICOLL_TUNING_FILE=none`` (or empty)
disables profiles. Without a profile, select.py's fixed defaults decide.

The file::

    {"format": "mpicoll-tuning", "version": 1,
     "meta": {"host": ..., "mpi": ..., "created": ..., "measured_p": [2, 4], ...},
     "rules": [
        {"p_min": 2, "p_max": 2, "bytes_min": 0, "bytes_max": 4096,
         "native_dtype": true, "algorithm": "mpi", "segment_bytes": null,
         "source": "measured", "note": "..."},
        ...],
     "model": {"params": {"p2p": {"o": ..., "alpha": ..., "beta": ..., "gamma": ...}, ...},
               "rms_rel_error": {...}},
     "measurements": [{"p": 2, "algorithm": "ring", "bytes": 65536, "time_s": ...}, ...]}

A rule covers ``p_min <= p <= p_max`` and ``bytes_min <= nbytes < bytes_max``
(``null`` bounds are open) for dtypes MPI can reduce natively or not
(``native_dtype``), and, within its p range, only the process counts of
its ``p_kind``: ``"any"`` (the default; a rule without the field means
this, and "any" is written by leaving the field out), ``"power_of_two"``
or ``"other"``. The kind exists because on some networks the winner
depends on whether p is a power of two (Rabenseifner's fold costs it
1.8-1.9x at other p on 1 Gbit/s, docs/scale.md), so a rule drawn from
p = 64 must not decide p = 56. The first matching rule wins; the tuner
writes the measured rules before the model's, so a measured process
count is decided by measurement and other counts by the model.

``source`` says where a rule came from: ``"measured"`` (``mpicoll.tune``
timed it on this machine), ``"model"`` (the tuner's fitted cost model
predicted it) or ``"simulated"`` (``python -m mpicoll.simulate
--profile-out`` simulated it on a SimGrid platform). ``auto`` says which
in its reason.

select.py stays a pure function: the caller loads the profile here and
passes it in.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from typing import List, NamedTuple, Optional

from . import _env
from . import registry as _alg
from .model import Model

ENV_TUNING_FILE = "MPICOLL_TUNING_FILE"
FORMAT = "mpicoll-tuning"
VERSION = 1
SOURCES = ("measured", "model", "simulated")
# Which process counts a rule covers within its [p_min, p_max].
P_KINDS = ("any", "power_of_two", "other")


def is_power_of_two(p: int) -> bool:
    return p > 0 and p & (p - 1) == 0


class Rule(NamedTuple):
    p_min: int
    p_max: Optional[int]
    bytes_min: int
    bytes_max: Optional[int]
    algorithm: str
    segment_bytes: Optional[int] = None
    native_dtype: bool = True
    source: str = "measured"
    note: str = ""
    # Last, so that the positional Rule(...) calls written before it still
    # mean what they meant ("any": every p in the range).
    p_kind: str = "any"

    def matches(self, p: int, nbytes: int, native_dtype: bool) -> bool:
        return (self.native_dtype == native_dtype and self.p_min <= p and (self.p_max is None or p <= self.p_max)
                and self.bytes_min <= nbytes and (self.bytes_max is None or nbytes < self.bytes_max)
                and (self.p_kind == "any" or (self.p_kind == "power_of_two") == is_power_of_two(p)))

    def describe(self) -> str:
        ps = f"p={self.p_min}" if self.p_max == self.p_min else \
            f"p in [{self.p_min}, {'inf' if self.p_max is None else self.p_max}]"
        kind = {"any": "", "power_of_two": " (powers of two only)", "other": " (not powers of two)"}.get(
            self.p_kind, f" (p_kind {self.p_kind!r})")
        bs = f"[{self.bytes_min}, {'inf' if self.bytes_max is None else self.bytes_max}) B"
        seg = f", segments of {self.segment_bytes} B" if self.segment_bytes else ""
        return f"{ps}{kind}, {bs}{seg}"

    def to_json(self) -> dict:
        d = self._asdict()
        # "any" is what a rule without the field means: left out, a profile
        # that needs no kind stays readable by versions that predate it
        # (they reject unknown fields).
        if d["p_kind"] == "any":
            del d["p_kind"]
        return d


def _rule_from_json(d: dict) -> Rule:
    if not isinstance(d, dict):
        raise ValueError(f"a rule must be an object, got {d!r}")
    unknown = set(d) - set(Rule._fields)
    if unknown:
        raise ValueError(f"unknown rule fields {sorted(unknown)}")

    def opt_int(key, lo):
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"rule field {key} must be an integer >= {lo} or null, got {v!r}")
        return v

    for key in ("p_min", "bytes_min", "algorithm"):
        if key not in d:
            raise ValueError(f"rule lacks {key}: {d!r}")
    r = Rule(p_min=opt_int("p_min", 1), p_max=opt_int("p_max", 1), bytes_min=opt_int("bytes_min", 0),
             bytes_max=opt_int("bytes_max", 0), algorithm=d["algorithm"],
             segment_bytes=opt_int("segment_bytes", 1), native_dtype=d.get("native_dtype", True),
             source=d.get("source", "measured"), note=d.get("note", ""), p_kind=d.get("p_kind", "any"))
    if not isinstance(r.algorithm, str) or not r.algorithm or r.algorithm == "auto":
        raise ValueError(f"rule algorithm must be an algorithm name, got {r.algorithm!r}")
    if not isinstance(r.native_dtype, bool):
        raise ValueError(f"rule native_dtype must be true or false, got {r.native_dtype!r}")
    if not isinstance(r.note, str):
        raise ValueError(f"rule note must be a string, got {r.note!r}")
    if not isinstance(r.source, str) or r.source not in SOURCES:
        raise ValueError(f"rule source must be one of {SOURCES}, got {r.source!r}")
    if not isinstance(r.p_kind, str) or r.p_kind not in P_KINDS:
        raise ValueError(f"rule p_kind must be one of {P_KINDS}, got {r.p_kind!r}")
    if r.p_max is not None and r.p_max < r.p_min or r.bytes_max is not None and r.bytes_max <= r.bytes_min:
        raise ValueError(f"empty range in rule {d!r}")
    if r.segment_bytes is not None:
        # Knobs are declared per algorithm in the registry: a knob the
        # algorithm does not have is one clear error when the profile is
        # loaded, not a TypeError on every call the rule covers. (An
        # algorithm this installation lacks is passed over at lookup.)
        if _alg.has("allreduce", r.algorithm):
            _alg.get("allreduce", r.algorithm).check_knobs({"segment_bytes": r.segment_bytes}, "rule: ")
    return r


class Profile:
    """A loaded tuning profile (rules, fitted model, raw measurements).

    Treated as immutable once built, and hashed by identity: select.py
    memoises decisions per profile object."""

    def __init__(self, rules: List[Rule], *, model=None, meta: Optional[dict] = None,
                 measurements: Optional[list] = None, path: Optional[str] = None):
        self.rules = list(rules)
        self.model = model
        self.meta = dict(meta or {})
        self.measurements = list(measurements or [])
        self.path = path

    def lookup(self, p: int, nbytes: int, native_dtype: bool = True, available=None) -> Optional[Rule]:
        """The first rule covering (p, nbytes) whose algorithm ``available(name)``
        accepts (a profile may name an algorithm this installation lacks)."""
        for r in self.rules:
            if r.matches(p, nbytes, native_dtype) and (available is None or available(r.algorithm)):
                return r
        return None

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": self.meta,
                "rules": [r.to_json() for r in self.rules],
                "model": None if self.model is None else self.model.to_json(),
                "measurements": self.measurements}

    @classmethod
    def from_json(cls, d, path: Optional[str] = None) -> "Profile":
        where = path or "tuning profile"
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{where}: not an mpicoll tuning profile (format must be {FORMAT!r})")
        if d.get("version") != VERSION:
            raise ValueError(f"{where}: unsupported profile version {d.get('version')!r} (expected {VERSION})")
        rules = d.get("rules")
        if not isinstance(rules, list):
            raise ValueError(f"{where}: 'rules' must be a list")
        try:
            parsed = [_rule_from_json(r) for r in rules]
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

        meta = d.get("meta") or {}
        measurements = d.get("measurements") or []
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: 'meta' must be an object, not {type(meta).__name__}")
        if not isinstance(measurements, list):
            raise ValueError(f"{where}: 'measurements' must be a list, not {type(measurements).__name__}")
        # The profile travels whole: hashed with json.dumps on every rank
        # and pickled to the others when the ranks' profiles differ, both
        # recursive; a file nested deeper than any profile the tuner writes
        # would fail there (RecursionError) on every new communicator.
        if _depth(d) > MAX_DEPTH:
            raise ValueError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        try:
            model = None if d.get("model") is None else Model.from_json(d["model"])
            if model is not None:
                numbers = [v for prm in model.params.values() for v in prm] + list(model.rms_rel_error.values())
                if not all(math.isfinite(v) for v in numbers):
                    raise ValueError("model: parameters must be finite numbers")
        except (TypeError, AttributeError, KeyError, OverflowError) as e:
            raise ValueError(f"{where}: model: malformed model parameters: {e!r}") from None
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return cls(parsed, model=model, meta=meta, measurements=measurements, path=path)

    def __repr__(self):
        return f"Profile({len(self.rules)} rules, path={self.path!r})"


# Deeper than any profile the tuner writes (its deepest value is 4 levels
# down), far from Python's recursion limit.
MAX_DEPTH = 32


def _depth(obj) -> int:
    """How deeply ``obj`` (parsed JSON) nests lists and objects; iterative,
    so that a deep one cannot exhaust the stack here."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, level = todo.pop()
        if isinstance(o, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                todo.extend((v, level + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


def default_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpicoll", "tuning.json")


def path() -> Optional[str]:
    """Where auto looks for its profile (None: profiles disabled)."""
    env = os.environ.get(ENV_TUNING_FILE)
    if env is None:
        return default_path()
    if env.strip().lower() in ("", "none", "off"):
        return None
    return env


def load(file: str) -> Profile:
    """Read and validate a profile; ValueError on a malformed one."""
    with open(file) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: not valid JSON: {e}") from None
        except RecursionError:  # the parser recurses per nesting level
            raise ValueError(f"{file}: nested more than {MAX_DEPTH} levels deep") from None
    return Profile.from_json(d, path=file)


def save(profile: Profile, file: str) -> None:
    """Write atomically (a concurrent reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
    tmp = f"{file}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(profile.to_json(), f, indent=1)
        f.write("\n")
    os.replace(tmp, file)


# path -> Profile or None; read once per process, since auto runs on every
# call and a profile changes only when someone re-tunes.
_cache = {}
_last = (object(), None)  # (environment value, profile): the per-call fast path


def current() -> Optional[Profile]:
    """The profile auto uses now, or None. A missing default file is the
    normal case (silently no profile); an unreadable or malformed one warns
    once and is ignored, so a bad file can slow a program down but never
    stop it."""
    global _last
    env = _env.get(ENV_TUNING_FILE)
    if env == _last[0]:
        return _last[1]
    prof = _current()
    _last = (env, prof)
    return prof


def _current() -> Optional[Profile]:
    p = path()
    if p is None:
        return None
    try:
        return _cache[p]
    except KeyError:
        pass
    prof = None
    if os.path.exists(p) or os.environ.get(ENV_TUNING_FILE):
        try:
            prof = load(p)
        except (OSError, ValueError) as e:
            warnings.warn(f"mpicoll: ignoring tuning profile: {e}", RuntimeWarning, stacklevel=3)
        except Exception as e:  # noqa: BLE001 - whatever a malformed file provokes: never on every call
            warnings.warn(f"mpicoll: ignoring tuning profile {p}: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=3)
    _cache[p] = prof
    return prof


def reload() -> None:
    """Forget cached profiles (after re-tuning in the same process)."""
    global _last
    _cache.clear()
    _last = (object(), None)
