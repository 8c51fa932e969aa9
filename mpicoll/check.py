"""Agreement checks: ranks that call a collective with different arguments.

Two tools, one always on and one optional:

* Receive-size checks (always on, in the schedule drivers,
  ``mpicoll/schedule.py``, the same for every algorithm): every point-to-point receive compares the bytes that arrived with
  the bytes the algorithm expected, and a message longer than the receive
  buffer (MPI_ERR_TRUNCATE) is caught too. Either raises ``MismatchError``
  on the rank that saw it. That costs nothing measurable, but only that
  rank knows: its partners may already be waiting for a message that will
  never come. Under ``python -m mpi4py`` (how the README and the tests
  launch programs) the uncaught exception aborts the whole job, so nothing
  hangs, but the other ranks do not get an exception of their own.

* Pre-flight agreement (``MPICOLL_CHECK=1`` or ``check=True``): before the
  algorithm runs, the ranks swap a signature of the call - collective,
  element count, dtype, op, algorithm name as requested, root, block
  counts - in one MPI_Allgather of a few int64 on mpicoll's private
  communicator. Every rank sees the same table, so every rank raises the
  same ``MismatchError``, naming what differs and on which ranks, before
  any data moves. It costs one small allgather per call (see
  docs/reliability.md for the measured latency), which is not free next to
  an 8-byte all-reduce, hence opt-in.

The switch must be the same on every rank: a rank that skips the
pre-flight while its partners run it is itself a mismatch no check can
see (the same holds for MPI's own collectives).
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from . import _env
from .errors import MismatchError

ENV_CHECK = "MPICOLL_CHECK"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

# Fields of the signature, in the order they are reported.
FIELDS = ("collective", "count", "dtype", "op", "algorithm", "root", "counts")


def enabled(check=None) -> bool:
    """Whether the pre-flight runs: ``check`` if given, else ``MPICOLL_CHECK``."""
    if check is None:
        env = (_env.get(ENV_CHECK) or "").strip().lower()
        if env in _TRUE:
            return True
        if env in _FALSE:
            return False
        raise ValueError(f"mpicoll: {ENV_CHECK}={env!r}; use 1 or 0")
    if not isinstance(check, bool):
        raise TypeError(f"mpicoll: check must be True, False or None, not {type(check).__name__}")
    return check


_codes = {}  # value -> crc32, memoised: the same few names recur on every call


def _code(value) -> int:
    """A stable int64 for one field: ints as they are, anything else hashed.
    (Python's hash() is salted per process, so it cannot be compared across
    ranks; crc32 can.)"""
    if type(value) is int:
        return value
    code = _codes.get(value)
    if code is None:
        code = zlib.crc32(repr(value).encode())
        if len(_codes) < 4096:
            _codes[value] = code
    return code


def preflight(st, collective: str, check=None, *, count, dtype, op=None, algorithm="auto",
              root=None, counts=None, timeout=None) -> None:
    """Raise the same MismatchError on every rank if the ranks' calls differ.

    Call it on every rank, after the arguments were validated and before
    the first message of the collective. A no-op on one rank or when the
    check is off. ``dtype`` and ``op`` are names; ``algorithm`` is the
    algorithm the call resolved to (the plan builders decide "auto" first:
    the ranks compare what they will run); ``counts`` the explicit block
    lengths, if any.
    With ``timeout`` (seconds) the allgather is polled and raises
    CollectiveTimeout when it has not completed by then: a rank that skipped
    the call altogether never joins it.
    """
    if not enabled(check) or st.size == 1:
        return
    sig = (collective, int(count), str(dtype), "" if op is None else str(op), str(algorithm),
           -1 if root is None else int(root), None if counts is None else tuple(int(c) for c in counts))
    mine = np.array([_code(v) for v in sig], np.int64)
    table = np.empty((st.size, mine.size), np.int64)
    if timeout is None:
        st.comm.Allgather(mine, table)
    else:
        from .commstate import wait_until

        wait_until(st.comm.Iallgather(mine, table), time.monotonic() + timeout, st.rank, collective,
                   "pre-flight agreement check (allgather of the call signatures)", st.seq, buffers=(mine, table))
    if table.tobytes() == mine.tobytes() * st.size:  # my row equals every row
        return
    # Every rank holds the same table, so every rank gets here together and
    # can afford one more (object) allgather to report readable values.
    sigs = st.comm.allgather(sig)
    raise mismatch_from(collective, sigs)


def _ranks(ranks) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"ranks {shown}{', ...' if len(ranks) > 8 else ''}"


def mismatch_from(collective: str, sigs) -> MismatchError:
    """The MismatchError for a list of per-rank signatures (rank order)."""
    parts = []
    first_field, first_values = "", {}
    for i, field in enumerate(FIELDS):
        groups = {}
        for rank, sig in enumerate(sigs):
            groups.setdefault(sig[i], []).append(rank)
        if len(groups) > 1:
            if not first_field:
                first_field, first_values = field, groups
            parts.append(f"{field} differs: " + "; ".join(f"{v!r} on {_ranks(rs)}" for v, rs in groups.items()))
    # The header must not depend on which rank builds it: name the
    # collectives every rank called, in rank order.
    called = "/".join(dict.fromkeys(sig[0] for sig in sigs))
    msg = (f"mpicoll: {called}: the ranks were called with different arguments - "
           + " | ".join(parts))
    return MismatchError(msg, first_field, first_values)
