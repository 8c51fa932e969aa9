"""Kept plans: one bounded cache per communicator, keyed by the call's signature.

Building a plan from a call's arguments costs 10-70 us of Python (argument
checks, the decision, the algorithm's set-up), several times what the MPI
library needs for a short message. Most programs make the same few calls
again and again - usually on *new* arrays of the same shape (a solver's dot
product, ``mpicoll.allreduce(np.full(n, v))``, a torch tensor's fresh numpy
view) - so each communicator's state (``commstate.CommState.plans``) keeps what
a call decided, keyed by everything the decision depends on: the
collective, shape, dtype, op, root, the counts vectors of the v-forms (as
tuples: a changed vector is another signature), algorithm asked for and
whether the call is in place. Never by the arrays' identity: a hit binds the call's own
buffers, so a cached entry keeps no user array alive or exported, and a new
array that happens to reuse a freed one's address can never be confused
with it.

An entry is a ``Kept`` object: called with the new buffers it checks the
few facts the key does not pin down (contiguity, alignment, writability,
overlap) and runs the call, or returns ``MISS`` when the full path must
decide (which also raises the usual errors). The kept calls are the MPI
library's own collectives (what ``auto`` picks for short messages), the
one-rank copies, and for all-reduce every other algorithm: a compilable one
runs its recorded program in the C executor (program.py, executor.py),
the others get their schedule bound to the call's arrays.

Entries are dropped least-recently-used first, ``SIZE`` per communicator,
and also depend on the ``MPICOLL_*`` environment: each remembers the raw
values it was decided under (``env_key``) and a change makes it miss (three
dictionary look-ups per call; the full path then validates the new values).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from . import _env

# Calls a program cycles through (layers of a model, fields of a solver):
# large enough for the common rotations, small enough that a lookup stays a
# dictionary hit. Evicted least-recently-used, never cleared wholesale.
SIZE = 128

# Marks a call the kept entry cannot serve (None is a valid result: a
# reduce's non-root ranks return None).
MISS = object()

_ENV_KEYS = ("MPICOLL_ALGORITHM", "MPICOLL_CHECK", "MPICOLL_TIMEOUT")


def env_key():
    """The raw values of the environment a decision depends on, compared by
    identity: ``os.environ`` stores a new object for every assignment."""
    data = _env._DATA
    if data is None:  # pragma: no cover - not CPython on POSIX: never equal, so never a hit
        return (object(),)
    keys = _env._keys
    out = []
    for name in _ENV_KEYS:
        k = keys.get(name)
        if k is None:
            _env.get(name)  # fills _env._keys
            k = keys[name]
        out.append(data.get(k))
    return tuple(out)


def env_unchanged(kept) -> bool:
    data = _env._DATA
    k1, k2, k3 = kept.env_keys
    e = kept.env
    return data is not None and data.get(k1) is e[0] and data.get(k2) is e[1] and data.get(k3) is e[2]


class PlanCache:
    """Least-recently-used map of signature -> Kept, bounded to ``size``.

    ``version`` changes with every change of the map or of its order (a
    hit, a new entry, clear): csrc/native.c's doors remember the entry of
    their last hit with the version after it, and while the version is
    unchanged that entry is still the most recently used - a repeated call
    skips the look-up and the move to the end (~0.15 us of a 2 us call).
    Whatever reorders ``_d`` outside these methods bumps it too (touch)."""

    __slots__ = ("_d", "size", "version")

    def __init__(self, size: int = SIZE):
        self._d = OrderedDict()
        self.size = size
        self.version = 0

    def get(self, key):
        e = self._d.get(key)
        if e is not None:
            self._d.move_to_end(key)
            self.version += 1
        return e

    def touch(self, key) -> None:
        """A hit found in ``_d`` directly: most recently used now."""
        self._d.move_to_end(key)
        self.version += 1

    def put(self, key, kept) -> None:
        d = self._d
        d[key] = kept
        d.move_to_end(key)
        while len(d) > self.size:
            d.popitem(last=False)
        self.version += 1

    def clear(self) -> None:
        self._d.clear()
        self.version += 1

    def __len__(self):
        return len(self._d)

    def __contains__(self, key):
        return key in self._d


class Kept:
    """What a hit needs: the communicator's state and the environment it
    was decided under. Subclasses (per collective, in plan.py) implement
    ``__call__(*buffers)`` returning the result or MISS."""

    __slots__ = ("st", "env", "env_keys")

    def __init__(self, st):
        self.st = st
        self.env = env_key()
        self.env_keys = tuple(_env._keys[n] for n in _ENV_KEYS) if _env._DATA is not None else (None,) * 3


def counts_key(counts):
    """Per-rank counts as part of a key: None stays None (no counts), a list,
    tuple or 1-D integer array becomes a tuple of ints; False for anything
    else (floats, bools, other sequences), which the full path validates.
    The whole vector is in the key, so a changed one never meets the entry
    of another."""
    if counts is None:
        return None
    t = type(counts)
    if t is list or t is tuple:
        for c in counts:
            if type(c) is not int:
                return False
        return tuple(counts)
    if t is np.ndarray and counts.ndim == 1 and counts.dtype.kind in "iu":
        return tuple(counts.tolist())
    return False
