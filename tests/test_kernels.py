"""The C kernels against numpy, without MPI: every (op, dtype), awkward
lengths, offset views, aliasing, special floats, and the casts."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, NUMPY_OPS, np_dtype, ops_for
from mpicoll import kernels

LENGTHS = [0, 1, 7, 16, 63, 1000, 1025, 4099, 20011]


def random_values(name, n, rng, specials=True):
    dt = np_dtype(name)
    if name in INT_DTYPES:
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
    vals = rng.standard_normal(n).astype(np.float32) * 10
    if specials and n >= 8:
        idx = rng.choice(n, size=max(1, n // 10), replace=False)
        vals[idx] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 0.0, 65504.0, 1e-7], idx.size)
    return vals.astype(dt)


def assert_same(got, want, name, op):
    """Bit-exact where numpy is defined bit-exactly; NaN positions must match."""
    if name in INT_DTYPES:
        np.testing.assert_array_equal(got, want)
        return
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"NaN positions differ for {op} {name}")
    np.testing.assert_array_equal(g[~np.isnan(g)], w[~np.isnan(w)], err_msg=f"{op} {name}")


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_every_op_matches_numpy(name):
    rng = np.random.default_rng(1)
    for op in ops_for(name):
        if op == "avg":
            continue
        for n in LENGTHS:
            a = random_values(name, n, rng)
            b = random_values(name, n, rng)
            with np.errstate(all="ignore"):
                want = NUMPY_OPS[op](a, b)
            dst = np.empty_like(a)
            kernels.reduce(op, dst, a, b)
            assert_same(dst, want, name, op)


@pytest.mark.parametrize("name", ["int8", "int64", "uint16", "float16", "bfloat16", "float32", "float64"])
def test_in_place_and_offset_views(name):
    """dst aliasing a or b, and views starting one element into an array
    (element-aligned: the kernels refuse a view at a byte offset, see
    test_misaligned_or_wrong_itemsize_views_are_refused; the public calls
    stage such views, tests/test_user_buffers.py's misaligned cases)."""
    rng = np.random.default_rng(2)
    for n in (1, 17, 4099):
        base_a = random_values(name, n + 1, rng, specials=False)
        base_b = random_values(name, n + 1, rng, specials=False)
        head = base_a[:1].view(np.uint8).copy()  # the bits of the element before the view
        a, b = base_a[1:], base_b[1:]
        with np.errstate(all="ignore"):
            want = NUMPY_OPS["sum"](a, b)
        a2 = a.copy()
        kernels.reduce("sum", a, a, b)  # dst is a
        assert_same(a, want, name, "sum")
        kernels.reduce("sum", b, a2, b)  # dst is b
        assert_same(b, want, name, "sum")
        assert base_a[:1].view(np.uint8).tobytes() == head.tobytes(), "element before the view was written"


def test_kernel_writes_only_its_buffer():
    guard = np.full(100, 7, np.int32)
    dst = guard[10:90]
    kernels.reduce("sum", dst, np.ones(80, np.int32), np.ones(80, np.int32))
    assert (guard[:10] == 7).all() and (guard[90:] == 7).all() and (dst == 2).all()


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16"])
def test_min_max_nan_and_signed_zero_rule(name):
    """NaN propagates (numpy's rule), and the result's bits do not depend on
    the operand order: ranks that combine the same values in another order
    (the MPI library running the kernel as a commutative op) get the same
    bits. The two ties numpy leaves open: -0.0/+0.0 (min -0.0, max +0.0) and
    two NaNs (the OR of their bits)."""
    dt = np_dtype(name)
    bits = np.dtype(f"uint{8 * np.dtype(dt).itemsize}")
    nan1 = np.array([np.nan], dt)
    nan2 = (nan1.view(bits) | 1).view(dt)  # another payload
    special = np.concatenate([np.array([np.nan, -np.nan, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.0], dt),
                              nan2])
    a = np.repeat(special, special.size)
    b = np.tile(special, special.size)
    for op, ref in (("min", np.minimum), ("max", np.maximum)):
        ab, ba = np.empty_like(a), np.empty_like(a)
        kernels.reduce(op, ab, a, b, dtype=name)
        kernels.reduce(op, ba, b, a, dtype=name)
        assert ab.view(bits).tobytes() == ba.view(bits).tobytes(), "bits depend on the operand order"
        np.testing.assert_array_equal(ab.astype(np.float64), ref(a.astype(np.float64), b.astype(np.float64)))
        one_nan = np.isnan(a) != np.isnan(b)
        nan_in = np.where(np.isnan(a), a, b)
        assert (ab[one_nan].view(bits) == nan_in[one_nan].view(bits)).all(), "a lone NaN is not passed on as is"
        zeros = (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
        assert zeros.any() and (np.signbit(ab[zeros]) == (op == "min")).all()


def test_integer_wraparound():
    a = np.array([127, -128, 100], np.int8)
    b = np.array([1, -1, 100], np.int8)
    dst = np.empty_like(a)
    kernels.reduce("sum", dst, a, b)
    assert dst.tolist() == [-128, 127, -56]
    kernels.reduce("prod", dst, a, b)
    assert dst.tolist() == (a.astype(np.int64) * b).astype(np.int8).tolist()
    u = np.array([65535], np.uint16)
    out = np.empty_like(u)
    kernels.reduce("prod", out, u, u)  # 65535^2 overflows int if promoted carelessly
    assert out[0] == (65535 * 65535) % 65536


@pytest.mark.parametrize("name", INT_DTYPES)
def test_logical_ops_give_zero_or_one(name):
    a = np.array([0, 3, 0, 5], name)
    b = np.array([0, 0, 2, 7], name)
    for op, want in (("land", [0, 0, 0, 1]), ("lor", [0, 1, 1, 1]), ("lxor", [0, 1, 1, 0])):
        dst = np.empty_like(a)
        kernels.reduce(op, dst, a, b)
        assert dst.tolist() == want, op


def test_bad_arguments():
    f = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="integer"):
        kernels.reduce("band", f, f, f)
    with pytest.raises(ValueError, match="unknown op"):
        kernels.reduce("mean", f, f, f)
    with pytest.raises(ValueError, match="elements"):
        kernels.reduce("sum", f, f, np.ones(3, np.float32))
    with pytest.raises(TypeError, match="unsupported dtype"):
        c = np.ones(4, np.complex64)
        kernels.reduce("sum", c, c, c)
    with pytest.raises(ValueError, match="read-only"):
        r = np.ones(4, np.float32)
        r.flags.writeable = False
        kernels.reduce("sum", r, f, f)
    with pytest.raises(ValueError, match="overlap"):
        big = np.ones(8, np.float32)
        kernels.reduce("sum", big[1:5], big[0:4], f)
    with pytest.raises(TypeError, match="floating"):
        i = np.ones(4, np.int32)
        kernels.scale(i, 2)


@pytest.mark.parametrize("name", ["int16", "float32", "float16", "bfloat16"])
def test_reduce_many_equals_pairwise(name):
    rng = np.random.default_rng(3)
    for k in (1, 2, 3, 5):
        for n in (0, 5, 9000):
            srcs = [random_values(name, n, rng, specials=False) for _ in range(k)]
            want = srcs[0].copy()
            for s in srcs[1:]:
                kernels.reduce("max", want, want, s)
            dst = np.empty_like(srcs[0])
            kernels.reduce_many("max", dst, srcs)
            assert_same(dst, want, name, "max")
    s0 = srcs[0].copy()
    kernels.reduce_many("sum", s0, [s0, srcs[1]])  # dst may be srcs[0]
    with pytest.raises(ValueError, match="alias"):
        kernels.reduce_many("sum", srcs[1], [srcs[0], srcs[1]])


@pytest.mark.parametrize("name", FLOAT_DTYPES)
def test_scale_divides_like_numpy(name):
    rng = np.random.default_rng(4)
    x = random_values(name, 3001, rng)
    with np.errstate(all="ignore"):
        want = (x.astype(np.float32) / np.float32(3)).astype(x.dtype) if name in ("float16", "bfloat16") \
            else x / x.dtype.type(3)
    kernels.scale(x, 3)
    assert_same(x, want, name, "avg")


def test_casts_match_numpy_and_ml_dtypes():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 1000,
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504, 65520, 65519.99, 1e-8, 6e-8,
                                  3e-5, -1e-40, 3.4e38], np.float32)])
    h = kernels.f32_to_f16(x)
    assert h.dtype == np.float16
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(h.view(np.uint16)[~np.isnan(x)], x.astype(np.float16).view(np.uint16)[~np.isnan(x)])
    back = kernels.f16_to_f32(h)
    np.testing.assert_array_equal(back, h.astype(np.float32))
    bf = np_dtype("bfloat16")
    b = kernels.f32_to_bf16(x)
    ref = x.astype(bf).view(np.uint16)
    np.testing.assert_array_equal(b[~np.isnan(x)], ref[~np.isnan(x)])
    assert np.isnan(kernels.bf16_to_f32(b)[np.isnan(x)]).all()
    np.testing.assert_array_equal(kernels.bf16_to_f32(b), b.view(bf).astype(np.float32))


def test_every_float16_bit_pattern_round_trips():
    """All 65536 half bit patterns: f16 -> f32 -> f16 is the identity on
    non-NaN values (exhaustive, covers subnormals and the tails)."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f = kernels.f16_to_f32(h)
    np.testing.assert_array_equal(f[~np.isnan(f)], h.view(np.float16).astype(np.float32)[~np.isnan(f)])
    back = kernels.f32_to_f16(f).view(np.uint16)
    np.testing.assert_array_equal(back[~np.isnan(f)], h[~np.isnan(f)])


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(ALL_DTYPES), n=st.integers(0, 3000), offset=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_property_against_numpy(name, n, offset, seed, data):
    op = data.draw(st.sampled_from([o for o in ops_for(name) if o != "avg"]))
    rng = np.random.default_rng(seed)
    a = random_values(name, n + offset, rng)[offset:]
    b = random_values(name, n + offset, rng)[offset:]
    with np.errstate(all="ignore"):
        want = NUMPY_OPS[op](a, b)
    kernels.reduce(op, a, a, b)
    assert_same(a, want, name, op)


def test_misaligned_or_wrong_itemsize_views_are_refused():
    """A view at a byte offset, or of another element size, is an error,
    never a misaligned or reinterpreted read."""
    from mpicoll import dtypes, ops

    raw = np.zeros(4 * 9 + 1, np.uint8)
    odd = raw[1:33].view(np.float32)  # 8 float32 starting one byte in
    assert odd.size == 8 and not odd.flags.aligned
    ok = np.ones(8, np.float32)
    red = kernels.Reduction(ops.BY_NAME["sum"], dtypes.FLOAT32)
    for args in ((odd, ok, ok), (ok, odd, ok), (ok, ok, odd)):
        with pytest.raises(ValueError, match="aligned"):
            red.combine(*args)
    with pytest.raises(ValueError, match="aligned"):
        kernels.reduce("sum", odd, ok, ok)
    with pytest.raises(ValueError, match="aligned"):
        red.combine_many(ok, [ok, odd])
    with pytest.raises(ValueError, match="aligned"):
        kernels.reduce_many("sum", ok, [ok, odd])
    with pytest.raises(ValueError, match="aligned"):
        kernels.scale(odd, 2)
    with pytest.raises(ValueError, match="aligned"):
        kernels.Reduction(ops.BY_NAME["avg"], dtypes.FLOAT32).finish(odd, 2)
    with pytest.raises(ValueError, match="aligned"):
        kernels.f32_to_f16(odd)
    # same byte length, other element size: not silently reinterpreted
    with pytest.raises(TypeError, match="4 bytes"):
        red.combine(ok, ok, np.ones(16, np.uint16))
    with pytest.raises(TypeError, match="4 bytes"):
        red.combine(np.ones(32, np.uint8), ok, ok)
    with pytest.raises(TypeError, match="4 bytes"):
        red.combine_many(ok, [ok, np.ones(4, np.float64)])
    with pytest.raises(ValueError, match="byte lengths"):
        red.combine(ok, ok, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="byte lengths"):
        red.combine_many(ok, [ok, np.ones(9, np.float32)])
    assert (ok == 1).all() and (raw == 0).all()


def test_enum_codes_are_the_compiled_ones():
    """dtypes.py and ops.py carry the codes of csrc/kernels.h's enums, and
    every enum value has its Python entry."""
    from mpicoll import dtypes, ops
    from mpicoll._kernels import lib

    for d in dtypes.ALL:
        assert d.code == getattr(lib, "MPICOLL_" + d.name.upper()), d
    assert sorted(d.code for d in dtypes.ALL) == list(range(lib.MPICOLL_NDTYPES))
    for o in ops.ALL:
        assert o.code == getattr(lib, "MPICOLL_" + ("sum" if o.average else o.name).upper()), o
    assert sorted({o.code for o in ops.ALL}) == list(range(lib.MPICOLL_NOPS))
    assert [d.name for d in dtypes.ALL if not d.native] == ["float16", "bfloat16"]


NO_MPI_SCRIPT = """
import importlib.util, sys, types
sys.modules["mpi4py"] = None  # any import of mpi4py now raises ImportError
# mpicoll/__init__.py imports MPI: load the submodules under a bare package.
spec = importlib.util.find_spec("mpicoll")
pkg = types.ModuleType("mpicoll")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["mpicoll"] = pkg
import numpy as np
import mpicoll.kernels, mpicoll.dtypes, mpicoll.ops
from mpicoll import dtypes, kernels, ops
a = np.arange(1000, dtype=np.float32)
dst = np.empty_like(a)
kernels.reduce("sum", dst, a, a)
assert (dst == 2 * a).all()
red = kernels.Reduction(ops.resolve("max"), dtypes.FLOAT16)
h = np.ones(5, np.uint16)
red.combine(h, h, h)
assert dtypes.FLOAT32.native and not dtypes.FLOAT16.native and dtypes.FLOAT16.mpi is None
try:
    dtypes.FLOAT32.mpi
except ImportError:
    pass
else:
    raise AssertionError("DType.mpi resolved without mpi4py")
assert not any(m.startswith("mpi4py") for m in sys.modules if sys.modules[m] is not None)
print("kernel layer ok without mpi4py")
"""


def test_kernel_layer_imports_without_mpi4py():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", NO_MPI_SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernel layer ok without mpi4py" in proc.stdout


def test_mpi_attributes_are_cached():
    """DType.mpi / Op.mpi resolve once, then are plain instance attributes."""
    from mpicoll import dtypes, ops

    d, o = dtypes.FLOAT32, ops.BY_NAME["avg"]
    assert d.mpi is d.mpi and "mpi" in vars(d)
    assert o.mpi is o.mpi and "mpi" in vars(o)
    from mpi4py import MPI

    assert o.mpi == MPI.SUM and d.mpi == MPI.FLOAT and ops.resolve(MPI.BXOR) is ops.BY_NAME["bxor"]


def test_expected_isa():
    """make test-portable sets MPICOLL_EXPECT_ISA=generic: the dispatch must be off there."""
    import os

    want = os.environ.get("MPICOLL_EXPECT_ISA")
    if want is None:
        assert kernels.isa() in ("avx512f", "f16c", "generic")
    else:
        assert kernels.isa() == want
