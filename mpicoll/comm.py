"""Per-communicator state, cached on the communicator itself.

The first mpicoll call on a communicator duplicates it (a collective call,
like every mpicoll call) and keeps the duplicate, together with scratch
buffers and anything else an algorithm wants to remember, in an MPI
attribute on the user's communicator. That is how MPI libraries cache their
own collective state:

* mpicoll's point-to-point messages travel on the duplicate, so they can
  never match the user's own sends and receives on the same communicator;
* the state lives exactly as long as the communicator: MPI calls the
  attribute's delete callback when the user frees it, and we free the
  duplicate there.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

_keyval = None
# Fast path in front of the attribute: communicator handle -> state. An
# MPI_Comm_get_attr through mpi4py costs about 1 us, a dict lookup a tenth of
# that, and small all-reduces are latency-bound. The entry is removed in the
# attribute's delete callback, so a handle the MPI library reuses for a new
# communicator can never find a stale state.
_by_handle = {}


def _delete_state(comm, keyval, state):
    _by_handle.pop(state.handle, None)
    state.free()


class CommState:
    """What mpicoll keeps per communicator.

    ``comm`` is the private duplicate; ``rank`` and ``size`` are cached
    because mpi4py's ``Get_rank()`` costs a call into MPI each time.
    """

    def __init__(self, user_comm: MPI.Intracomm):
        self.handle = user_comm.handle
        self.comm: MPI.Intracomm = user_comm.Dup()
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self._scratch = {}
        self.extra = {}  # per-algorithm cached state (e.g. node communicators)

    def scratch(self, name: str, nbytes: int) -> np.ndarray:
        """A reusable uint8 buffer of at least ``nbytes``, one per ``name``.

        Large temporaries are reused across calls because a fresh 16 MiB
        array costs about as much in page faults as reducing it. Blocking
        algorithms only: a buffer is valid until the next call with the
        same name.
        """
        buf = self._scratch.get(name)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 64), np.uint8)
            self._scratch[name] = buf
        return buf[:nbytes]

    def free(self) -> None:
        for v in self.extra.values():
            free = getattr(v, "free", None)
            if free is not None:
                free()
        self.extra.clear()
        self._scratch.clear()
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


def state(comm: MPI.Intracomm) -> CommState:
    """The cached state of ``comm``, created (collectively) on first use."""
    st = _by_handle.get(comm.handle)
    if st is not None:
        return st
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete_state)
    st = comm.Get_attr(_keyval)
    if st is None:
        st = CommState(comm)
        comm.Set_attr(_keyval, st)
    _by_handle[st.handle] = st
    return st


def check_intracomm(comm) -> MPI.Intracomm:
    """``comm`` if it is a usable intra-communicator, else a clear error."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"mpicoll: comm must be an mpi4py communicator, not {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("mpicoll: comm is MPI.COMM_NULL")
    if not isinstance(comm, MPI.Intracomm) or comm.Is_inter():
        raise TypeError("mpicoll: an intra-communicator is required (inter-communicators are not supported)")
    return comm
