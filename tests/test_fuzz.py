"""Property tests (hypothesis) for every C kernel and for the argument
parsing of ``mpicoll.allreduce``, against numpy.

Kernels: every dtype and op, lengths 0 to 10^5, views offset by one element
(element-aligned: tests/test_kernels.py refuses byte-misaligned ones), dst separate from or aliasing either
operand, NaN, +-inf, -0.0 and the integer extremes (wraparound) planted at
random places; reduce_many with 1-5 sources; scale; the 16-bit casts on
random bit patterns. Results must match numpy bit for bit (NaN positions
only, for NaN payloads), and the kernels must not write outside dst.

Argument parsing: random shapes, dtypes (supported or not, byte-swapped),
buffer kinds (arrays, strided views, bytes, bytearray, array.array,
memoryview, scalars, lists, None), ops and ``out`` arguments, at p = 1
(COMM_SELF): the call either returns the right answer or raises TypeError
or ValueError - never anything else, never a crash.

``make test`` runs a modest number of examples; ``make fuzz`` sets
MPICOLL_FUZZ_EXAMPLES to run many more.
"""
from __future__ import annotations

import array
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpicoll
from conftest import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, NUMPY_OPS, np_dtype, ops_for
from mpicoll import kernels

EXAMPLES = int(os.environ.get("MPICOLL_FUZZ_EXAMPLES", "40"))
fuzz = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Lengths: mostly short (where the vector loops' tails and the scalar
# fallbacks live), sometimes long, up to 10^5.
lengths = st.one_of(st.integers(0, 70), st.integers(0, 10**5))


def values(name, n, rng):
    """Random values of ``name`` with the special cases planted at random."""
    dt = np_dtype(name)
    if name in INT_DTYPES:
        info = np.iinfo(dt)
        v = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
        specials = [info.min, info.max, 0, -1 if info.min < 0 else 1, 1]
    else:
        with np.errstate(over="ignore"):  # large magnitudes overflow to inf in 16-bit types: wanted
            v = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32).astype(dt)
        specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, 65504.0, -65504.0, 1e-8, 3e38]
    if n:
        k = rng.integers(0, n // 4 + 2)
        idx = rng.integers(0, n, k)
        with np.errstate(over="ignore"):
            v[idx] = np.asarray(rng.choice(np.asarray(specials, np.float64 if name not in INT_DTYPES else object),
                                           k)).astype(np.float32 if name in FLOAT_DTYPES else dt).astype(dt)
    return v


def offset_view(v, offset):
    """``v`` copied into a buffer ``offset`` elements in, with guard elements
    around it; returns (view, whole buffer)."""
    base = np.empty(v.size + offset + 4, v.dtype)
    base[...] = v[:1] if v.size else 0
    view = base[offset:offset + v.size]
    view[...] = v
    return view, base


def assert_bits(got, want, name, what):
    if name in INT_DTYPES:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    gn, wn = np.isnan(g), np.isnan(w)
    np.testing.assert_array_equal(gn, wn, err_msg=f"NaN positions: {what}")
    gb = np.ascontiguousarray(got).view(np.uint8).reshape(got.size, got.dtype.itemsize)[~gn]
    wb = np.ascontiguousarray(want).view(np.uint8).reshape(want.size, want.dtype.itemsize)[~wn]
    np.testing.assert_array_equal(gb, wb, err_msg=f"bits (signed zeros included): {what}")


def numpy_op(op, name, a, b):
    """numpy's answer, with the ties numpy leaves open settled as the kernels
    settle them (csrc/reduce.c): for min/max on floats a tie (a == b, only
    ambiguous for +0.0 vs -0.0) gives -0.0 for min and +0.0 for max,
    whatever the operand order. numpy 2.x returns ``b`` for float32/float64
    but ``a`` for float16 - found by this test. (Two NaNs: any NaN; the bits
    of NaNs are not compared.)"""
    with np.errstate(all="ignore"):
        want = NUMPY_OPS[op](a, b)
        if op in ("min", "max") and name in FLOAT_DTYPES:
            tie = a == b
            neg_a = np.signbit(np.asarray(a, np.float32))
            pick_a = neg_a if op == "min" else ~neg_a
            want[tie] = np.where(pick_a, a, b)[tie]
    return want


OP_DTYPE = st.sampled_from([(name, op) for name in ALL_DTYPES for op in ops_for(name) if op != "avg"])


@fuzz
@given(pair=OP_DTYPE, n=lengths, offset=st.integers(0, 1), alias=st.sampled_from(["none", "a", "b"]),
       seed=st.integers(0, 2**32 - 1))
def test_reduce_kernel(pair, n, offset, alias, seed):
    name, op = pair
    rng = np.random.default_rng(seed)
    a0, b0 = values(name, n, rng), values(name, n, rng)
    want = numpy_op(op, name, a0, b0)
    a, abase = offset_view(a0, offset)
    b, bbase = offset_view(b0, offset)
    if alias == "a":
        dst, dbase = a, abase
    elif alias == "b":
        dst, dbase = b, bbase
    else:
        dst, dbase = offset_view(np.zeros_like(a0), offset)
    guard = np.concatenate([dbase[:offset], dbase[offset + n:]]).copy()
    kernels.reduce(op, dst, a, b)
    assert_bits(dst, want, name, f"{op} {name} n={n} offset={offset} alias={alias}")
    np.testing.assert_array_equal(np.concatenate([dbase[:offset], dbase[offset + n:]]).view(np.uint8),
                                  guard.view(np.uint8), err_msg="wrote outside dst")


@fuzz
@given(pair=OP_DTYPE, n=st.integers(0, 5000), k=st.integers(1, 5), offset=st.integers(0, 1),
       in_place=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_reduce_many_kernel(pair, n, k, offset, in_place, seed):
    name, op = pair
    rng = np.random.default_rng(seed)
    srcs = [offset_view(values(name, n, rng), offset)[0] for _ in range(k)]
    want = srcs[0].copy()
    for s in srcs[1:]:
        want = numpy_op(op, name, want, s)
    dst = srcs[0] if in_place else offset_view(np.zeros_like(srcs[0]), offset)[0]
    kernels.reduce_many(op, dst, srcs)
    assert_bits(dst, want, name, f"reduce_many {op} {name} n={n} k={k}")


@fuzz
@given(name=st.sampled_from(FLOAT_DTYPES), n=lengths, offset=st.integers(0, 1),
       divisor=st.sampled_from([1, 2, 3, 5, 7, 8, 1000]), seed=st.integers(0, 2**32 - 1))
def test_scale_kernel(name, n, offset, divisor, seed):
    rng = np.random.default_rng(seed)
    x0 = values(name, n, rng)
    with np.errstate(all="ignore"):
        if name in ("float16", "bfloat16"):  # computed in float32, rounded once
            want = (x0.astype(np.float32) / np.float32(divisor)).astype(x0.dtype)
        else:
            want = x0 / x0.dtype.type(divisor)
    x, _ = offset_view(x0, offset)
    kernels.scale(x, divisor)
    assert_bits(x, want, name, f"scale {name} /{divisor}")


@fuzz
@given(n=lengths, offset=st.integers(0, 1), seed=st.integers(0, 2**32 - 1))
def test_casts(n, offset, seed):
    rng = np.random.default_rng(seed)
    f = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)  # every bit pattern, NaNs included
    f, _ = offset_view(f, offset)
    keep = ~np.isnan(f)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(kernels.f32_to_f16(f).view(np.uint16)[keep],
                                      f.astype(np.float16).view(np.uint16)[keep])
        bf = np_dtype("bfloat16")
        np.testing.assert_array_equal(kernels.f32_to_bf16(f)[keep], f.astype(bf).view(np.uint16)[keep])
    assert np.isnan(kernels.f32_to_f16(f).astype(np.float32)[~keep]).all()
    h, _ = offset_view(rng.integers(0, 2**16, n, dtype=np.uint16), offset)
    hf = h.view(np.float16).astype(np.float32)
    got = kernels.f16_to_f32(h)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(hf))
    np.testing.assert_array_equal(got[~np.isnan(hf)], hf[~np.isnan(hf)])
    np.testing.assert_array_equal(kernels.bf16_to_f32(h).view(np.uint32), h.astype(np.uint32) << 16)


# ---- argument parsing of mpicoll.allreduce ------------------------------------

NUMPY_DTYPES = ALL_DTYPES + ["bool", "complex64", "float128" if hasattr(np, "float128") else "float64",
                             ">f4", ">i8", "<u2", "object", "U3", "datetime64[s]"]
OPS = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "land", "lor", "lxor", "SUM", "mean", "",
       MPI.SUM, MPI.MAX, MPI.MAXLOC, MPI.REPLACE, 3, None]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def make_input(kind, dtname, shape, rng):
    dt = np_dtype(dtname) if dtname in ALL_DTYPES else np.dtype(dtname)
    n = int(np.prod(shape))
    if dt.kind == "O":
        arr = np.array([object()] * n, dtype=object).reshape(shape)
    elif dt.kind in "UM":
        arr = np.zeros(shape, dt)
    else:
        arr = (rng.integers(0, 5, n)).astype(dt if dt.kind != "V" else np.uint8).reshape(shape)
    if kind == "array":
        return arr
    if kind == "strided":  # non-contiguous: every second element
        big = np.repeat(arr.reshape(-1), 2) if arr.size else arr.reshape(-1)
        return big[::2].reshape(shape) if arr.size else arr
    if kind == "readonly":
        arr.flags.writeable = False
        return arr
    if kind == "scalar":
        return arr.reshape(-1)[0] if arr.size else np.float32(1.5)
    if kind == "bytes":
        return arr.tobytes() if arr.dtype.kind not in "OUM" else b"abc"
    if kind == "bytearray":
        return bytearray(arr.tobytes()) if arr.dtype.kind not in "OUM" else bytearray(3)
    if kind == "array.array":
        return array.array("d", [1.0] * n)
    if kind == "memoryview":
        return memoryview(arr) if arr.dtype.kind not in "OM" and arr.dtype != np_dtype("bfloat16") else arr
    if kind == "list":
        return arr.tolist()
    return None


def make_out(kind, x, rng):
    try:
        a = np.asarray(x)
    except Exception:
        a = np.zeros(3)
    if kind == "none":
        return None
    if kind == "same":
        return x
    if kind == "fresh":
        return np.empty_like(a)
    if kind == "wrong_shape":
        return np.empty(a.size + 1, a.dtype)
    if kind == "wrong_dtype":
        return np.empty(a.shape, np.int16 if a.dtype != np.int16 else np.int32)
    if kind == "strided":
        return np.empty(a.shape + (2,), a.dtype)[..., 0]
    if kind == "overlap":
        return a.reshape(-1)[1:] if a.size > 1 else a.reshape(-1)
    return "not a buffer"


@fuzz
@given(kind=st.sampled_from(["array", "strided", "readonly", "scalar", "bytes", "bytearray", "array.array",
                             "memoryview", "list", "none"]),
       dtname=st.sampled_from(NUMPY_DTYPES), shape=shapes, op=st.sampled_from(OPS),
       out_kind=st.sampled_from(["none", "same", "fresh", "wrong_shape", "wrong_dtype", "strided", "overlap",
                                 "junk"]),
       dtype=st.sampled_from([None, None, None, "bfloat16", "float16", "uint16", "float32", "nonsense", 7]),
       algorithm=st.sampled_from(["auto", "ring", "tree", "mpi", "nope", 3]),
       check=st.sampled_from([None, True, False]), seed=st.integers(0, 2**16))
def test_allreduce_arguments(kind, dtname, shape, op, out_kind, dtype, algorithm, check, seed):
    rng = np.random.default_rng(seed)
    x = make_input(kind, dtname, shape, rng)
    out = make_out(out_kind, x, rng)
    before = np.array(x, copy=True) if isinstance(x, np.ndarray) and x.dtype.kind not in "OUM" else None
    try:
        got = mpicoll.allreduce(x, op=op, comm=MPI.COMM_SELF, out=out, algorithm=algorithm, dtype=dtype,
                                check=check)
    except (TypeError, ValueError) as exc:
        event(f"rejected: {type(exc).__name__}")
        return
    event("accepted")
    # Accepted: at p = 1 every op leaves the values as they were (avg divides by 1).
    ref = np.asarray(memoryview(x)) if not isinstance(x, (np.ndarray, np.generic)) else np.asarray(x)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                  np.ascontiguousarray(ref).view(np.uint8))
    if out is not None and got.size:  # the result is written into out
        assert got is out or np.shares_memory(got, out)
    if before is not None and out is not x:  # the input is left alone
        assert np.asarray(x).tobytes() == before.tobytes()
