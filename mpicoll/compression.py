"""Compressed all-reduce for gradient synchronisation: 16-bit wire formats and top-k.

    mpicoll.allreduce(g, op="avg", compression="fp16")          # float16 on the wire
    mpicoll.allreduce(g, op="avg", compression=mpicoll.HalfPrecision("bf16", prescale=True))
    topk = mpicoll.TopK(ratio=0.01)                             # keeps its residual:
    mpicoll.allreduce(g, op="avg", compression=topk)            # one instance per gradient stream

Two kinds, for float32 and float64 data and the ops "sum" and "avg":

* ``HalfPrecision("fp16" | "bf16", prescale=False)`` - the strings "fp16"
  and "bf16" mean this with the defaults. Partial sums travel as 16 bits and
  are accumulated in float32 at every step (algorithms/ring_compressed.py):
  half the bytes of a float32 all-reduce. The result is written back in the
  caller's dtype and is identical on every rank. ``prescale=True`` divides
  each contribution by the world size before it is rounded (PyTorch's
  fp16 hook does the same), so a float16 sum cannot overflow 65504; for
  "sum" the result is multiplied back.
* ``TopK(ratio=0.01)`` - the string "topk" (or "topk:0.05") means a fresh
  one. Each rank adds its residual to its input, sends only the
  k = ceil(ratio n) largest-magnitude entries as (int32 index, float32
  value) pairs (algorithms/sparse_allgather.py), and keeps everything it
  did not send - including the float32 rounding of what it did send - in
  the residual, which is added to the next call's input (error feedback:
  nothing is lost, only delayed). The residual belongs to one gradient
  stream, so keep one ``TopK`` per tensor (the bucketer keeps one per
  bucket); a string makes a new instance per call, which drops the residual.

Any float32/float64 array is accepted, views that start at a byte offset
included (``np.frombuffer(buf, np.float32, offset=2)``): the C kernels get
aligned scratch copies of those, with the bits an aligned copy would give.

The compressed result is defined whatever the communicator size: on one rank
the data still go through the wire format (rounded to 16 bits, or
sparsified), so a one-process run computes what a p-process run computes.

Bytes each rank sends, for n float32 elements on p ranks (ring algorithms):
uncompressed 8 (p-1)/p n, fp16/bf16 4 (p-1)/p n, top-k (p-1)(8k + 8).
``python -m mpicoll.bench compression`` measures them next to the times.
"""
from __future__ import annotations

import math

import numpy as np

from . import ops as _ops
from ._kernels import ffi, lib
from .algorithms import ring_compressed, sparse_allgather

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _arg(x, itemsize: int, ctype: str, what: str, writable=False):
    """``x`` as a cffi pointer for a wire kernel, after the checks the C code
    relies on (as kernels.py does for reductions): 1-D contiguous storage of
    ``itemsize``-byte elements, aligned to them (compress.c loads through
    typed pointers; schedule() copies misaligned user arrays to scratch, so
    a misaligned array here is a bug in mpicoll, refused, never read)."""
    if x.itemsize != itemsize:
        raise TypeError(f"mpicoll: wire kernel {what} has {x.itemsize}-byte elements ({x.dtype}), needs {itemsize}")
    if not x.flags.c_contiguous:
        raise ValueError(f"mpicoll: wire kernel {what} must be contiguous")
    if x.ctypes.data % itemsize:
        raise ValueError(f"mpicoll: wire kernel {what} at {hex(x.ctypes.data)} is not aligned to its "
                         f"{itemsize}-byte elements")
    return ffi.from_buffer(ctype, x, require_writable=writable)


def aligned(x: np.ndarray) -> bool:
    """Whether the wire kernels may take ``x`` as it is (contiguous, aligned)."""
    return x.flags.c_contiguous and x.ctypes.data % x.itemsize == 0


class _WireFormat:
    """A 16-bit wire format bound to its compress.c / cast.c kernels.

    The methods take 1-D contiguous arrays of equal length, float32 and
    uint16 (16-bit bits), aligned to their elements (all checked) and run on
    the hot path of the compressed ring.
    """

    def __init__(self, name, acc_round, acc, to32, from32):
        self.name = name
        self._acc_round, self._acc, self._to32, self._from32 = acc_round, acc, to32, from32

    def accumulate_round(self, dst, a, divisor, b):
        """dst = round16(a / divisor + widen(b)); b None means zero."""
        n = dst.size
        if a.size != n or (b is not None and b.size != n):
            raise ValueError(f"mpicoll: accumulate_round of unequal lengths {n}, {a.size}, {None if b is None else b.size}")
        pd, pa = _arg(dst, 2, "uint16_t[]", "dst", True), _arg(a, 4, "float[]", "a")
        pb = ffi.NULL if b is None else _arg(b, 2, "uint16_t[]", "b")
        if n:
            self._acc_round(pd, pa, float(divisor), pb, n)

    def accumulate(self, acc, b):
        """acc += widen(b), in float32."""
        if acc.size != b.size:
            raise ValueError(f"mpicoll: accumulate of unequal lengths {acc.size}, {b.size}")
        pacc, pb = _arg(acc, 4, "float[]", "acc", True), _arg(b, 2, "uint16_t[]", "b")
        if acc.size:
            self._acc(pacc, pb, acc.size)

    def widen(self, dst, src):
        if dst.size != src.size:
            raise ValueError(f"mpicoll: widen of unequal lengths {dst.size}, {src.size}")
        pd, ps = _arg(dst, 4, "float[]", "dst", True), _arg(src, 2, "uint16_t[]", "src")
        if dst.size:
            self._to32(pd, ps, dst.size)

    def narrow(self, dst, src):
        if dst.size != src.size:
            raise ValueError(f"mpicoll: narrow of unequal lengths {dst.size}, {src.size}")
        pd, ps = _arg(dst, 2, "uint16_t[]", "dst", True), _arg(src, 4, "float[]", "src")
        if dst.size:
            self._from32(pd, ps, dst.size)


WIRE_FORMATS = {
    "fp16": _WireFormat("fp16", lib.mpicoll_accumulate_round_f16, lib.mpicoll_accumulate_f16,
                        lib.mpicoll_f16_to_f32, lib.mpicoll_f32_to_f16),
    "bf16": _WireFormat("bf16", lib.mpicoll_accumulate_round_bf16, lib.mpicoll_accumulate_bf16,
                        lib.mpicoll_bf16_to_f32, lib.mpicoll_f32_to_bf16),
}


class HalfPrecision:
    """16-bit wire format ("fp16" or "bf16") with float32 accumulation."""

    def __init__(self, fmt: str = "fp16", *, prescale: bool = False):
        if fmt not in WIRE_FORMATS:
            raise ValueError(f"mpicoll: unknown 16-bit wire format {fmt!r}; known: {', '.join(WIRE_FORMATS)}")
        self.fmt = WIRE_FORMATS[fmt]
        self.prescale = bool(prescale)

    @property
    def name(self) -> str:
        return self.fmt.name

    def __repr__(self):
        return f"HalfPrecision({self.fmt.name!r}, prescale={self.prescale})"


class TopK:
    """Top-k sparsification with error feedback; holds the residual of one gradient stream."""

    name = "topk"

    def __init__(self, ratio: float = 0.01):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"mpicoll: top-k ratio must be a number in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)
        self.residual = None  # what was not sent yet, in the data's dtype

    def k_for(self, n: int) -> int:
        return 0 if n == 0 else min(n, max(1, math.ceil(self.ratio * n)))

    def check(self, n: int, dtype: np.dtype) -> None:
        if self.residual is not None and (self.residual.size != n or self.residual.dtype != dtype):
            raise ValueError(f"mpicoll: this TopK holds the residual of a {self.residual.size}-element "
                             f"{self.residual.dtype} stream, not {n} elements of {dtype}: use one TopK per tensor")
        if n >= 2 ** 31:
            raise ValueError("mpicoll: top-k sends int32 indices: at most 2**31 - 1 elements")

    def select(self, x: np.ndarray):
        """Add the residual to ``x`` (1-D float), return the k largest-magnitude
        entries as (sorted int32 indices, float32 values) and keep the rest -
        and the float32 rounding of the values sent - as the new residual."""
        n = x.size
        self.check(n, x.dtype)
        if self.residual is None:
            self.residual = np.zeros(n, x.dtype)
        g = self.residual
        np.add(g, x, out=g)  # g = x + old residual: the vector to compress
        k = self.k_for(n)
        if k == n:
            idx = np.arange(n, dtype=np.int64)
        else:
            idx = _largest(np.abs(g), k)
            idx.sort()  # ascending indices: cache-friendly scatter-add on the receivers
        val = g[idx].astype(np.float32)
        g[idx] -= val  # 0 for float32 data; the rounding error for float64
        return idx.astype(np.int32), val

    def reset(self) -> None:
        self.residual = None

    def __repr__(self):
        return f"TopK(ratio={self.ratio})"


# Sample size for top-k's threshold estimate.
_SAMPLE = 1 << 16


def _largest(mag: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of ``mag`` (any order; ties broken arbitrarily).

    A full np.argpartition over n elements costs ~3 ns each; instead, a
    threshold is taken from a strided sample (set a little low, so that more
    than k entries pass it), the entries above it are found in one vectorised
    pass, and only those are partitioned. Exact: every one of the k largest
    is at least the k-th largest, which is at least the threshold whenever k
    entries pass it; when fewer pass (an unlucky sample), it falls back to
    the full partition.
    """
    n = mag.size
    stride = max(1, n // _SAMPLE)
    if stride > 1 and k * 4 < n:
        sample = mag[::stride]
        want = min(sample.size, int(2 * k * sample.size / n) + 16)  # twice k's share of the sample, plus slack
        thr = np.partition(sample, sample.size - want)[sample.size - want]
        cand = np.flatnonzero(mag >= thr)
        if cand.size >= k:
            return cand[np.argpartition(mag[cand], cand.size - k)[cand.size - k:]]
    return np.argpartition(mag, n - k)[n - k:]


def resolve(spec):
    """A compression object from a string or an instance (TypeError/ValueError otherwise)."""
    if isinstance(spec, (HalfPrecision, TopK)):
        return spec
    if isinstance(spec, str):
        if spec in WIRE_FORMATS:
            return HalfPrecision(spec)
        if spec == "topk":
            return TopK()
        if spec.startswith("topk:"):
            try:
                ratio = float(spec[5:])
            except ValueError:
                raise ValueError(f"mpicoll: bad top-k ratio in {spec!r}") from None
            return TopK(ratio)
        raise ValueError(f"mpicoll: unknown compression {spec!r}; known: 'fp16', 'bf16', 'topk', 'topk:RATIO'")
    raise TypeError(f"mpicoll: compression must be a name, HalfPrecision or TopK, not {type(spec).__name__}")


def check_args(arr: np.ndarray, op, spec):
    """(Op, compression object) after checking that compression applies to this call."""
    o = _ops.resolve(op)
    c = resolve(spec)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"mpicoll: compression {c.name!r} applies to float32 and float64 data, not {arr.dtype}")
    if o.name not in ("sum", "avg"):
        raise ValueError(f"mpicoll: compression applies to the ops 'sum' and 'avg', not {o.name!r}")
    if isinstance(c, TopK):
        c.check(arr.size, arr.dtype)
    return o, c


def schedule(ctx, src: np.ndarray, dst: np.ndarray, average: bool, c):
    """Compressed sum (or average) of the 1-D float arrays ``src`` into ``dst``
    (same length and dtype; may be the same array) over ``ctx``'s ranks, as a
    schedule: the blocking and nonblocking drivers both run it. Arguments are
    checked by the plan layer."""
    n, p = src.size, ctx.size
    if n == 0:
        return
    if isinstance(c, TopK):
        idx, val = c.select(src)  # reads src before dst is written: in place is fine
        yield from sparse_allgather.allreduce(ctx, idx, val, n, dst, average)
        return
    fmt = c.fmt
    # The wire kernels read and write float32 through typed pointers: float64
    # data, and float32 views at a byte offset (valid numpy arrays, e.g.
    # np.frombuffer(buf, np.float32, offset=2)), go through aligned scratch.
    if src.dtype == np.float32 and aligned(src):
        src32 = src
    else:
        src32 = ctx.scratch("compression_src32", src.size, np.float32)
        src32[...] = src
    wire = ctx.scratch("compression_wire", n, np.uint16)
    yield from ring_compressed.allreduce(ctx, src32, wire, fmt, p if c.prescale else 1)
    if dst.dtype == np.float32 and aligned(dst):
        fmt.widen(dst, wire)
        res = dst
    else:
        res = ctx.scratch("compression_f32", n, np.float32)
        fmt.widen(res, wire)
        dst[...] = res
        res = dst
    if c.prescale and not average:
        res *= p  # back from the pre-divided sum
    elif average and not c.prescale:
        res /= p


def run(st, src: np.ndarray, dst: np.ndarray, average: bool, c) -> None:
    """Blocking run of ``schedule`` on CommState ``st`` (benchmarks)."""
    from . import schedule as _sched

    seq, tag = st.next_seq()
    _sched.run(schedule(_sched.Context(st, tag, st.pool, ("allreduce", f"compressed-{c.name}", src.nbytes, seq)),
                        src, dst, average, c))
