"""The ``Work`` handles the backend returns: ``wait()``, ``is_completed()``,
``get_future()`` over mpicoll's (or MPI's) requests; the future is
completed from the engine's thread (_completion.py).
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll
from mpicoll import engine as _engine
from mpicoll.poll import poll

from . import _completion


class Work(dist._Work):
    """One collective's handle: ``wait()``, ``is_completed()``, ``get_future()``.

    ``reqs`` are mpicoll or MPI requests (None: already complete);
    ``finish()`` runs once after they complete (copy-backs of
    non-contiguous tensors, the list forms' copies) on whichever thread sees
    completion first. ``deadline`` (seconds from now, None: none) bounds
    ``wait()`` for work whose requests are MPI's own (mpicoll's requests
    carry their deadline themselves); ``what`` names the work in the
    ``CollectiveTimeout`` raised when it passes."""

    def __init__(self, result, reqs=(), finish=None, deadline=None, what="torch work"):
        super().__init__()
        self._deadline = None if deadline is None else time.monotonic() + deadline
        self._deadline_s = deadline
        self._what = what
        self._result = result
        # MPI requests are handed to the engine here: only it tests them from now on.
        self._reqs = [_completion.adopt(r) for r in reqs if r is not None]
        self._finish = finish
        self._lock = threading.Lock()
        self._done = not self._reqs
        self._error = None
        self._future = None
        if self._done and finish is not None:
            finish()

    def _settle(self, error=None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            self._reqs = []
            if error is None and self._finish is not None:
                try:
                    self._finish()
                except BaseException as exc:
                    error = exc
            self._error = error
        fut = self._future
        if fut is not None:
            if error is None:
                fut.set_result(self._result)
            else:
                fut.set_exception(error)

    def wait(self, timeout=None) -> bool:
        """Wait for completion; ``timeout`` (a timedelta, as torch passes it;
        zero means none) raises ``mpicoll.CollectiveTimeout`` if the work has
        not completed by then. The collective then stays outstanding: as with
        torch's own backends, the group is broken (end the job)."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else (timeout or 0)
        own = self._deadline is not None and (seconds <= 0 or self._deadline <= time.monotonic() + seconds)
        if not self._done and (seconds > 0 or own):
            deadline = self._deadline if own else time.monotonic() + seconds

            def expired():
                if own:
                    return self._expired()
                return mpicoll.CollectiveTimeout(
                    f"mpicoll backend: work not completed within Work.wait(timeout={seconds:g} s); "
                    "the collective is still outstanding", collective="torch work")

            # mpicoll's operations advance while this work is waited for
            poll(self.is_completed, deadline, expired, advance=_engine.progress, max_pause=0.0)
        if not self._done:
            try:
                for r in list(self._reqs):
                    _completion.wait(r)
            except BaseException as exc:
                self._settle(exc)
            else:
                self._settle()
        if self._error is not None:
            raise self._error
        return True

    def _expired(self) -> mpicoll.CollectiveTimeout:
        rank = MPI.COMM_WORLD.Get_rank()
        return mpicoll.CollectiveTimeout(
            f"mpicoll backend: {self._what} timed out on rank {rank}: it passed its timeout of "
            f"{self._deadline_s:g} s and is still outstanding", collective=self._what, rank=rank)

    def is_completed(self) -> bool:
        if not self._done and all(_completion.is_done(r) for r in list(self._reqs)):
            self._settle()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._result

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    if self._error is None:
                        self._future.set_result(self._result)
                    else:
                        self._future.set_exception(self._error)
                    return self._future
                pending = list(self._reqs)
            else:
                return self._future
        remaining = [len(pending)]
        count_lock = threading.Lock()

        def one_done(err):
            if err is not None:
                self._settle(err)
                return
            with count_lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._settle()

        for r in pending:
            _completion.when_done(r, one_done)
        if self._deadline is not None:  # nobody may call wait(): the future fails at the deadline itself
            timer = threading.Timer(max(0.0, self._deadline - time.monotonic()),
                                    lambda: self._done or self._settle(self._expired()))
            timer.daemon = True
            timer.start()
        return self._future


class _RecvAny(Work):
    """A receive from any source: ``_source_rank()`` (what ``dist.recv``
    asks once the work is complete) is the sender's rank in the group."""

    def __init__(self, result, req, finish):
        super().__init__(result, [req], finish)
        self._req = req

    def _source_rank(self) -> int:
        return self._req.status.Get_source()


class _Joined(Work):
    """Several works completed as one (the coalesced forms)."""

    def __init__(self, result, works):
        dist._Work.__init__(self)
        self._result = result
        self._works = works
        self._future = None

    def wait(self, timeout=None) -> bool:
        for w in self._works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def get_future(self):
        if self._future is None:
            futs = [w.get_future() for w in self._works]
            self._future = torch.futures.collect_all(futs).then(lambda _: self._result)
        return self._future


class _StatusRequest(MPI.Request):
    """An MPI request that keeps its completion's status (``status``: the
    sender of a receive from any source), whichever thread completes it and
    however (``Test``/``Wait``, as _completion calls them)."""

    def __new__(cls, req: MPI.Request):
        self = super().__new__(cls, req)
        self.status = MPI.Status()
        return self

    def Test(self, status=None):  # noqa: N802 (mpi4py's spelling)
        return super().Test(self.status)

    def Wait(self, status=None):  # noqa: N802
        return super().Wait(self.status)
