"""What this layer needs from mpicoll's nonblocking engine, whatever version it is.

The nonblocking forms of every collective (``ibcast``, ``iallgather``,
``ireduce``, ``ireduce_scatter``) and ``Request.add_done_callback`` are used
where mpicoll has them; elsewhere the blocking call runs at once (the work is
then complete when it is returned) and completion is noticed by a waiter
thread. Either way a ``torch.futures.Future`` is completed without anyone
calling ``wait()`` on the request - what DDP's reducer needs, since it waits
on the future in C++ and never comes back to Python to make progress.
"""
from __future__ import annotations

import queue
import threading

from mpi4py import MPI

import mpicoll
from mpicoll import nonblocking as _nb


def start(name: str, *args, **kwargs):
    """Start collective ``name`` ("allreduce", "bcast", ...): a request, or
    None when it ran blocking (and is complete)."""
    ifn = getattr(mpicoll, "i" + name, None)
    if ifn is not None:
        return ifn(*args, **kwargs)
    getattr(mpicoll, name)(*args, **kwargs)
    return None


def is_done(req) -> bool:
    if req is None:
        return True
    if isinstance(req, MPI.Request):
        return req.Test()
    return req.test()


def wait(req) -> None:
    if req is None:
        return
    if isinstance(req, MPI.Request):
        req.Wait()
    else:
        req.wait()


class _Waiter:
    """One daemon thread that waits for requests in the order they were
    handed over and then runs their callbacks. Its ``wait()`` advances the
    engine itself, so requests complete even without mpicoll's progress
    thread."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, req, fn) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpicoll-torch-waiter", daemon=True)
                self._thread.start()
        self._queue.put((req, fn))

    def _run(self) -> None:
        while True:
            req, fn = self._queue.get()
            try:
                wait(req)
                err = None
            except BaseException as exc:  # handed to the future, raised where it is waited for
                err = exc
            fn(err)


_waiter = _Waiter()


def when_done(req, fn) -> None:
    """Call ``fn(error_or_None)`` once ``req`` is complete, on some thread
    (at once if it already is). With mpicoll's progress thread and
    ``add_done_callback``, the progress thread calls it; otherwise the waiter
    thread does (a callback alone would wait for progress that nobody makes
    while the caller is blocked in C++)."""
    if req is None:
        fn(None)
        return
    if isinstance(req, _nb.Request) and hasattr(req, "add_done_callback") and _nb.progress_thread_active():
        def done(r):
            try:
                r.wait()  # complete already: only raises its error, if any
            except BaseException as exc:
                fn(exc)
                return
            fn(None)
        req.add_done_callback(done)
        if not req.done:
            # A short operation does not wake a sleeping progress thread by
            # itself (the engine expects its caller to wait() for it soon);
            # here nobody will, so wake it. set_progress_thread(True) is a
            # no-op apart from that wake-up when the thread is already on.
            _nb.set_progress_thread(True)
        return
    _waiter.submit(req, fn)
