"""Exceptions mpicoll raises beyond the built-in TypeError/ValueError.

``MismatchError``: the ranks of a communicator called the same collective
with arguments that do not agree (element count, dtype, op, algorithm,
root, block counts, or a different collective altogether). It is a
``ValueError`` because, like any bad argument, it is the caller's input
that is wrong - only the evidence is spread over several ranks.

``PeerFailure``: the MPI library reported an error other than a truncated
message for one of the collective's point-to-point messages (a process
that died, a broken connection): not the caller's arguments, so not a
``MismatchError``.
"""
from __future__ import annotations


class MismatchError(ValueError):
    """Ranks disagree on a collective's arguments.

    ``field`` names the first argument found to differ ("count", "dtype",
    ...), ``values`` maps each value seen to the ranks that passed it (a
    dict ``{value: [ranks]}``), empty when only one rank could see the
    disagreement (a receive-size check; see ``mpicoll.check``).
    """

    def __init__(self, message: str, field: str = "", values=None):
        super().__init__(message)
        self.field = field
        self.values = dict(values or {})


class CollectiveTimeout(TimeoutError):
    """A collective passed its deadline (``timeout=`` or ``MPICOLL_TIMEOUT``).

    Raised on the rank whose wait ran out. The message and the attributes
    say what it was waiting for, like a flight recorder: ``collective``,
    ``algorithm``, ``step``, ``peers`` (the ranks whose messages had not
    completed; empty inside the MPI library's own collectives), ``nbytes``,
    ``seq`` (the call's sequence number on the communicator) and ``rank``.
    The other ranks are not told; under ``python -m mpi4py`` the uncaught
    exception ends the job, or the program may catch it and call
    ``comm.Abort()``.
    """

    def __init__(self, message: str, *, collective="", algorithm="", step="", peers=(), nbytes=-1, seq=-1,
                 rank=-1):
        super().__init__(message)
        self.collective = collective
        self.algorithm = algorithm
        self.step = step
        self.peers = list(peers)
        self.nbytes = nbytes
        self.seq = seq
        self.rank = rank


class PeerFailure(RuntimeError):
    """The MPI library failed a message of the collective with an error
    other than MPI_ERR_TRUNCATE (with a fault-tolerant MPI: a peer process
    failed).

    ``peers`` are the ranks whose messages failed, ``error_class`` the MPI
    error class (``MPI.ERR_PROC_FAILED`` for a dead peer where the library
    defines it), ``rank`` the rank that saw it. The ``MPI.Exception`` is
    chained as ``__cause__``.
    """

    def __init__(self, message: str, *, peers=(), error_class=-1, rank=-1):
        super().__init__(message)
        self.peers = list(peers)
        self.error_class = error_class
        self.rank = rank
