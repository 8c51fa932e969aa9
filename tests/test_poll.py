"""poll.py, the one wait policy every polling wait of mpicoll uses."""
import time

import pytest

from mpicoll.poll import poll


def test_returns_once_the_test_holds_advancing_before_each_test():
    seen = []
    assert poll(lambda: len(seen) >= 5, advance=lambda: seen.append(1)) is True
    assert len(seen) == 5  # advanced before every test, the last one included


def test_deadline_raises_the_callers_error_or_returns_false():
    t = time.monotonic()
    with pytest.raises(TimeoutError, match="late"):
        poll(lambda: False, t + 0.05, lambda: TimeoutError("late"), spin_s=0.01)
    assert 0.05 <= time.monotonic() - t < 2
    assert poll(lambda: False, time.monotonic() + 0.02) is False


def test_spins_then_backs_off():
    """Spinning tests back to back; after spin_s the tests come at most
    every max_pause (a sleeping wait tests far fewer times)."""
    def count(spin_s, max_pause):
        n = [0]

        def test():
            n[0] += 1
            return False
        poll(test, time.monotonic() + 0.1, spin_s=spin_s, max_pause=max_pause)
        return n[0]

    spinning = count(1.0, 1e-3)
    sleeping = count(0.0, 10e-3)
    assert sleeping <= 0.1 / 10e-3 + 10 < spinning
