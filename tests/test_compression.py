"""Compression without MPI messages: the compress.c kernels against numpy,
top-k selection and error feedback, argument checks, and the bucketer's
layout (on COMM_SELF)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import compression as C
from mpicoll.commstate import state

ml_dtypes = pytest.importorskip("ml_dtypes")
WIDE = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
LENGTHS = [0, 1, 7, 8, 15, 16, 17, 1023, 1024, 1025, 5000]


def bits(x, fmt):
    return np.asarray(x, np.float32).astype(WIDE[fmt]).view(np.uint16)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("n", LENGTHS)
def test_accumulate_round_matches_numpy(fmt, n):
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * 100).astype(np.float32)
    b16 = bits(rng.standard_normal(n) * 100, fmt)
    b32 = b16.view(WIDE[fmt]).astype(np.float32)
    w = C.WIRE_FORMATS[fmt]
    for divisor in (1.0, 3.0):
        dst = np.empty(n, np.uint16)
        w.accumulate_round(dst, a, divisor, b16)
        want = bits(a / np.float32(divisor) + b32, fmt)  # float32 sum, one rounding
        np.testing.assert_array_equal(dst, want)
        w.accumulate_round(dst, a, divisor, None)
        np.testing.assert_array_equal(dst, bits(a / np.float32(divisor), fmt))


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("n", LENGTHS)
def test_accumulate_is_float32(fmt, n):
    rng = np.random.default_rng(n + 1)
    acc = rng.standard_normal(n).astype(np.float32)
    b16 = bits(rng.standard_normal(n), fmt)
    want = acc + b16.view(WIDE[fmt]).astype(np.float32)
    C.WIRE_FORMATS[fmt].accumulate(acc, b16)
    np.testing.assert_array_equal(acc, want)


def test_accumulation_keeps_small_terms():
    # 2048 + 1 + 1 + ... : a float16 accumulator would stay at 2048 (ulp 2 there),
    # the float32 one gets 2048 + 64 exactly.
    w = C.WIRE_FORMATS["fp16"]
    acc = np.array([2048.0], np.float32)
    one = bits([1.0], "fp16")
    for _ in range(64):
        w.accumulate(acc, one)
    assert acc[0] == 2112.0


def test_kernel_length_checks():
    w = C.WIRE_FORMATS["fp16"]
    with pytest.raises(ValueError):
        w.accumulate_round(np.empty(3, np.uint16), np.empty(4, np.float32), 1.0, None)
    with pytest.raises(ValueError):
        w.accumulate(np.empty(3, np.float32), np.empty(2, np.uint16))


def test_kernel_type_and_alignment_checks():
    """Like kernels.py's reductions: the wire kernels get aligned typed
    buffers of the right element size, or refuse them before touching them."""
    w = C.WIRE_FORMATS["bf16"]
    raw = np.zeros(4 * 9 + 8, np.uint8)
    odd32 = raw[1:33].view(np.float32)  # 8 float32 starting one byte in
    odd16 = raw[1:17].view(np.uint16)
    f32, u16 = np.ones(8, np.float32), np.ones(8, np.uint16)
    for call in (lambda: w.accumulate_round(u16, odd32, 1.0, None), lambda: w.accumulate_round(odd16, f32, 2.0, u16),
                 lambda: w.accumulate_round(u16, f32, 2.0, odd16), lambda: w.accumulate(odd32, u16),
                 lambda: w.accumulate(f32, odd16), lambda: w.widen(odd32, u16), lambda: w.narrow(u16, odd32)):
        with pytest.raises(ValueError, match="aligned"):
            call()
    with pytest.raises(TypeError, match="4"):
        w.accumulate(np.ones(8, np.float64), u16)  # same length, other element size: not reinterpreted
    with pytest.raises(TypeError, match="2"):
        w.widen(f32, np.ones(8, np.float32))


@pytest.mark.parametrize("offset", [1, 2])
@pytest.mark.parametrize("spec", ["fp16", C.HalfPrecision("bf16", prescale=True)])
def test_one_rank_misaligned_views(offset, spec):
    """A float32 view at a byte offset, as input and as output, gives the
    bits of an aligned copy."""
    x = np.random.default_rng(offset).standard_normal(1001).astype(np.float32)
    raw = np.zeros(x.nbytes + 8, np.uint8)
    mis = np.frombuffer(raw, np.float32, count=x.size, offset=offset)
    mis[...] = x
    want = mpicoll.allreduce(x, op="avg", compression=spec, comm=MPI.COMM_SELF)
    assert mpicoll.allreduce(mis, op="avg", compression=spec, comm=MPI.COMM_SELF).tobytes() == want.tobytes()
    mpicoll.allreduce(mis, op="avg", compression=spec, comm=MPI.COMM_SELF, out=mis)
    assert mis.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_selects_largest_and_conserves(dtype):
    rng = np.random.default_rng(0)
    n = 10_001
    t = C.TopK(0.01)
    residual_before = np.zeros(n, dtype)
    for step in range(3):
        x = rng.standard_normal(n).astype(dtype)
        g = residual_before + x  # the vector top-k compresses this step
        idx, val = t.select(x)
        k = t.k_for(n)
        assert idx.dtype == np.int32 and val.dtype == np.float32 and idx.size == val.size == k
        assert np.all(np.diff(idx) > 0)
        others = np.delete(np.abs(g), idx)
        assert np.abs(g[idx]).min() >= others.max()
        # Conservation: what was sent plus what is kept is exactly this step's vector.
        sent = np.zeros(n, np.float64)
        sent[idx] = val
        np.testing.assert_array_equal(sent + t.residual.astype(np.float64), g.astype(np.float64))
        if dtype == np.float32:
            assert np.all(t.residual[idx] == 0)
        residual_before = t.residual.copy()


def test_topk_arguments():
    for bad in (0, -0.5, 1.5, "0.1", True):
        with pytest.raises(ValueError):
            C.TopK(bad)
    t = C.TopK(0.5)
    assert [t.k_for(n) for n in (0, 1, 3, 10)] == [0, 1, 2, 5]
    t.select(np.ones(10, np.float32))
    with pytest.raises(ValueError, match="one TopK per tensor"):
        t.select(np.ones(11, np.float32))
    assert isinstance(C.resolve("topk:0.05"), C.TopK) and C.resolve("topk:0.05").ratio == 0.05
    assert C.resolve("fp16").name == "fp16" and C.resolve("bf16").name == "bf16"
    with pytest.raises(ValueError):
        C.resolve("int8")
    with pytest.raises(ValueError):
        C.resolve("topk:x")
    with pytest.raises(TypeError):
        C.resolve(16)


def test_compressed_allreduce_rejects_bad_arguments():
    x = np.ones(10, np.float32)
    with pytest.raises(TypeError, match="float32 and float64"):
        mpicoll.allreduce(np.ones(10, np.int32), compression="fp16", comm=MPI.COMM_SELF)
    with pytest.raises(TypeError, match="float32 and float64"):
        mpicoll.allreduce(np.ones(10, np.float16), compression="bf16", comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="'sum' and 'avg'"):
        mpicoll.allreduce(x, op="max", compression="fp16", comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="algorithm must be 'auto'"):
        mpicoll.allreduce(x, compression="fp16", algorithm="ring", comm=MPI.COMM_SELF)
    with pytest.raises(ValueError):
        mpicoll.allreduce(x, compression="fp8", comm=MPI.COMM_SELF)


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_one_rank_goes_through_the_wire_format(spec):
    x = np.random.default_rng(1).standard_normal(1001).astype(np.float32)
    y = mpicoll.allreduce(x, compression=spec, comm=MPI.COMM_SELF)
    np.testing.assert_array_equal(y, x.astype(WIDE[spec]).astype(np.float32))
    y64 = mpicoll.allreduce(x.astype(np.float64), op="avg", compression=spec, comm=MPI.COMM_SELF)
    assert y64.dtype == np.float64
    np.testing.assert_array_equal(y64, y.astype(np.float64))


# ---- bucket layout (no messages but the layout check, on COMM_SELF) -----------

def test_bucket_assembly_reverse_order_and_caps():
    kib = 1024
    # float32 gradients of 1, 2, 3, 4, 5, 6 KiB, registered in this order.
    grads = [np.zeros(256 * (i + 1), np.float32) for i in range(6)]
    b = mpicoll.GradientBucketer(grads, comm=MPI.COMM_SELF, bucket_bytes=9 * kib, first_bucket_bytes=5 * kib)
    # Reverse order: 6 (>= 5 KiB: first bucket closes), then 5+4 (9 KiB), then 3+2+1.
    assert b.buckets == [[5], [4, 3], [2, 1, 0]]
    assert b.bucket_nbytes() == [6 * kib, 9 * kib, 6 * kib]
    for i, v in enumerate(b.views):
        assert v.shape == grads[i].shape and v.dtype == grads[i].dtype
    # Views tile each fused buffer in fill order, without gaps.
    bucket = b._buckets[2].buffer
    assert np.shares_memory(b.views[2], bucket) and b.views[2].ctypes.data == bucket.ctypes.data
    assert b.views[1].ctypes.data == bucket.ctypes.data + b.views[2].nbytes


def test_bucket_dtypes_are_kept_apart():
    grads = [((4,), np.float32), ((3, 2), np.float64), ((5,), np.float32), ((0,), np.float64)]
    b = mpicoll.GradientBucketer(grads, comm=MPI.COMM_SELF)
    assert sorted(map(sorted, b.buckets)) == [[0, 2], [1, 3]]
    assert b.buckets[0] == [3, 1]  # the float64 bucket holds the last-registered gradient
    assert b.views[1].shape == (3, 2)


def test_bucketer_one_rank_step_and_errors():
    grads = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)]
    b = mpicoll.GradientBucketer(grads, comm=MPI.COMM_SELF, op="avg")
    with pytest.raises(RuntimeError, match="marked ready"):
        b.wait()
    b.mark_ready(1)
    with pytest.raises(RuntimeError, match="twice"):
        b.mark_ready(1)
    with pytest.raises(IndexError):
        b.mark_ready(2)
    grads[0] += 1  # mark_ready copies the array's current values
    b.mark_ready(0)
    out = b.wait()
    assert out[0] is grads[0]
    np.testing.assert_array_equal(out[0], np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    b.allreduce()  # the next step starts clean
    with pytest.raises(TypeError):
        mpicoll.GradientBucketer([np.ones(3, np.int32)], comm=MPI.COMM_SELF, op="avg")
    with pytest.raises(TypeError):
        mpicoll.GradientBucketer([np.ones(3, np.float16)], comm=MPI.COMM_SELF, compression="fp16")
    with pytest.raises(ValueError):
        mpicoll.GradientBucketer([np.ones(3, np.float32)], comm=MPI.COMM_SELF, op="max", compression="topk")
    with pytest.raises(ValueError):
        mpicoll.GradientBucketer([np.ones(3, np.float32)], comm=MPI.COMM_SELF, bucket_bytes=0)
    with pytest.raises(TypeError):
        mpicoll.GradientBucketer(["x"], comm=MPI.COMM_SELF)


@pytest.mark.parametrize("case", ["normal", "ties", "spike", "ramp"])
def test_topk_threshold_selection_is_exact(case):
    n, k = 300_007, 3001
    rng = np.random.default_rng(5)
    mag = {"normal": np.abs(rng.standard_normal(n)),
           "ties": np.ones(n),
           "spike": np.where(np.arange(n) % 997 == 1, 10.0, 1e-3),  # the large entries sit between sample points
           "ramp": np.arange(n, dtype=np.float64)}[case].astype(np.float32)
    got = C._largest(mag, k)
    assert got.size == k and np.unique(got).size == k
    np.testing.assert_array_equal(np.sort(mag[got]), np.sort(mag)[n - k:])
