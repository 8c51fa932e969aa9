"""Stage 1 of every plan: the local checks, made before any message is sent.

The arguments, the environment (``MPICOLL_ALGORITHM``, ``MPICOLL_CHECK``,
``MPICOLL_TIMEOUT``), the ``check`` flag, op and dtype, the algorithm's
name and knobs, a root. A mistake raises TypeError/ValueError on the rank
that made it, before anything collective happens, so the others are not
left waiting inside a collective that one rank never entered. Used by the
builders (mpicoll/plan.py) and the kept plans (mpicoll/kept.py).
"""
from __future__ import annotations

import numpy as np

from . import _env
from . import algorithms as _alg
from . import check as _check
from . import ops as _ops
from .kernels import Reduction

ENV_ALGORITHM = "MPICOLL_ALGORITHM"
ENV_TIMEOUT = "MPICOLL_TIMEOUT"

_reductions = {}


def reduction(op, dt) -> Reduction:
    """The validated Reduction for (op, dtype), cached: small all-reduces are
    latency-bound and building one costs about a microsecond."""
    key = (op, dt.code) if isinstance(op, str) else None
    red = _reductions.get(key) if key else None
    if red is None:
        red = Reduction(_ops.resolve(op), dt)  # raises if op is not defined for dt
        if key:
            _reductions[key] = red
    return red


_settings = {}


def env_settings():
    """(forced algorithm or None, check from env, timeout from env), validated;
    memoised on the raw values (read on every call)."""
    raw = (_env.get(ENV_ALGORITHM), _env.get(_check.ENV_CHECK), _env.get(ENV_TIMEOUT))
    got = _settings.get(raw)
    if got is None:
        forced, chk, tmo = raw
        forced = forced.strip() if forced else None
        if forced and forced != "auto" and not any(_alg.has(c, forced) for c in _alg.COLLECTIVES):
            raise ValueError(f"mpicoll: {ENV_ALGORITHM}={forced!r} is not a known algorithm; "
                             f"all-reduce algorithms: {', '.join(_alg.names('allreduce'))}")
        env_check = _check.enabled(None)  # raises on a bad MPICOLL_CHECK
        timeout = None
        if tmo is not None and tmo.strip().lower() not in ("", "0", "none", "off"):
            try:
                timeout = float(tmo)
            except ValueError:
                raise ValueError(f"mpicoll: {ENV_TIMEOUT}={tmo!r}; use a number of seconds (0 or unset: no "
                                 "timeout)") from None
            if not timeout > 0:
                raise ValueError(f"mpicoll: {ENV_TIMEOUT}={tmo!r}; use a positive number of seconds")
        got = _settings[raw] = (forced or None, env_check, timeout)
        if len(_settings) > 64:
            _settings.clear()
            _settings[raw] = got
    return got


def requested(collective: str, algorithm, forced) -> str:
    """The algorithm name asked for, validated (no MPI calls). The environment's
    forced name applies to every collective that has an algorithm of that name."""
    if not isinstance(algorithm, str):
        raise TypeError(f"mpicoll: algorithm must be a name, not {type(algorithm).__name__}")
    if forced and (forced == "auto" or _alg.has(collective, forced)):
        return forced if forced == "auto" else _alg.canonical(collective, forced)
    if algorithm != "auto":
        algorithm = _alg.canonical(collective, algorithm)  # (renamed ones: today's name)
        _alg.get(collective, algorithm)  # ValueError if unknown
    return algorithm


def check_flag(check, env_check) -> bool:
    if check is None:
        return env_check
    if not isinstance(check, bool):
        raise TypeError(f"mpicoll: check must be True, False or None, not {type(check).__name__}")
    return check


def timeout_of(timeout, env_timeout):
    if timeout is None:
        return env_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise TypeError(f"mpicoll: timeout must be a number of seconds or None, not {type(timeout).__name__}")
    timeout = float(timeout)
    if not timeout > 0:
        raise ValueError(f"mpicoll: timeout must be positive (seconds), not {timeout}")
    return timeout


def root_of(root, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
        raise TypeError(f"mpicoll: root must be an int, not {type(root).__name__}")
    if not 0 <= root < size:
        raise ValueError(f"mpicoll: root {root} out of range for a communicator of size {size}")
    return int(root)


def knobs_of(entry, knobs) -> dict:
    if knobs:
        entry.check_knobs(knobs)
    return knobs or {}
