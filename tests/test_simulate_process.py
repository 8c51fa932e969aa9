"""The simulation's process (mpicoll.simulate._in_child): a new interpreter,
not a fork of the caller, with a deadline and the child's errors brought back.

Needs no SimGrid: the functions run here are plain Python.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

from mpicoll import simulate

# Held by a thread of the caller during a run. A forked child inherits it
# held, with no thread left to release it: the shape of the hang that a
# fork from an MPI program showed (UCX's lock, held by another thread).
_HELD = threading.Lock()


def _take_held():
    got = _HELD.acquire(timeout=5)
    return got


def _environment():
    from mpi4py import MPI

    return {k: v for k, v in os.environ.items() if k.startswith(("PMI_", "OMPI_", "MPICOLL_TEST_"))}, \
        MPI.Is_initialized(), os.getpid()


def _raise(text):
    raise ValueError(text)


def test_a_lock_another_thread_holds_does_not_reach_the_child():
    taken, release = threading.Event(), threading.Event()

    def hold():
        with _HELD:
            taken.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert taken.wait(10)
        assert simulate._in_child(_take_held, timeout_s=60) is True
    finally:
        release.set()
        t.join()


def test_the_child_is_a_new_process_without_the_launchers_environment(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("MPICOLL_TEST_KEPT", "yes")
    env, initialized, pid = simulate._in_child(_environment, timeout_s=60)
    assert env == {"MPICOLL_TEST_KEPT": "yes"}
    assert initialized is False
    assert pid != os.getpid()


def test_the_childs_exception_is_raised_here():
    with pytest.raises(ValueError, match="from the child"):
        simulate._in_child(_raise, "from the child", timeout_s=60)


def test_a_child_that_dies_is_a_clear_error():
    with pytest.raises(RuntimeError, match="died \\(exit status 3\\)"):
        simulate._in_child(os._exit, 3, timeout_s=60)


def test_a_child_past_its_deadline_is_killed():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish in 1.0 s"):
        simulate._in_child(time.sleep, 60, timeout_s=1.0)
    assert time.monotonic() - t0 < 30
