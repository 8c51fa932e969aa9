"""The drop-in's shortcut for plain numpy arrays (specs._parse_plain and
_parse_plain_v) gives exactly what the general parsing gives for the same
spec given in a form that takes the general path, and leaves every other
spec to it."""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll import specs


def _same(a, b):
    # (the general path gives an empty message a fresh empty array)
    assert a.raw.size == b.raw.size and a.raw.dtype == np.uint8
    assert a.raw.size == 0 or a.raw.ctypes.data == b.raw.ctypes.data
    assert (a.count, a.datatype, a.itemsize, a.dtype, a.counts, a.per) == \
        (b.count, b.datatype, b.itemsize, b.dtype, b.counts, b.per)
    assert a.pack is None and a.unpack is None and b.pack is None


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint64, np.float32, np.float64, np.complex128,
                                   np.bool_])
@pytest.mark.parametrize("shape", [(0,), (1,), (6,), (2, 3), ()])
def test_plain_array_parses_as_the_general_path(dtype, shape):
    arr = np.zeros(shape, dtype)
    for blocks in (0, 1, 2, 3):
        if blocks >= 2 and arr.size % blocks:
            continue
        fast = specs._parse_plain(arr, True, blocks)
        assert fast is not None
        _same(fast, specs.parse([arr, None], True, blocks))  # the general path, no datatype given
        _same(specs.parse(arr, True, blocks), fast)
    for counts in ([0] * 3, [1, 0, 2], [arr.size, 0, 0]):
        if sum(counts) > arr.size:
            continue
        flat = arr.reshape(-1)
        fast = specs._parse_plain_v(flat, counts, False, 3)
        assert fast is not None
        _same(fast, specs.parse_v([flat, counts, None], False, 3))
        _same(specs.parse_v([flat, counts], False, 3), fast)


def test_other_specs_take_the_general_path():
    a = np.zeros(6, np.float32)
    ro = a.copy()
    ro.flags.writeable = False
    assert specs._parse_plain(ro, True, 0) is None                 # mpi4py's own writable error
    assert specs._parse_plain(a[::2], False, 0) is None            # not contiguous
    assert specs._parse_plain(a, False, 4) is None                 # not p blocks: mpi4py's error
    assert specs._parse_plain(a.astype(">f4"), False, 0) is None   # non-native byte order
    assert specs._parse_plain(np.zeros(2, "U3"), False, 0) is None
    assert specs._parse_plain_v(a, [1, 2], False, 3) is None       # wrong number of counts
    assert specs._parse_plain_v(a, [1, 2, 9], False, 3) is None    # past the buffer
    assert specs._parse_plain_v(a, [1, -1, 2], False, 3) is None
    assert specs._parse_plain_v(a, [1, np.int64(1), 2], False, 3) is None
    with pytest.raises(ValueError):
        specs.parse(a, False, 4)
    with pytest.raises(ValueError):
        specs.parse_v([a, [1, 2, 9]], False, 3)
