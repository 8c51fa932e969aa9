"""Kernel throughput against numpy: ``python -m mpicoll.bench kernels``.

For each dtype, times ``dst = a + b`` in place (dst is a) with numpy's
``np.add(a, b, out=a)`` and with mpicoll's C kernel on the same arrays
(through ``Reduction.combine``, the call every algorithm makes),
and prints GB/s counted as bytes read plus written (3 n itemsize) and the
speed ratio. The figure of merit in the issue: float32, float64 and int32
at >= 0.9x numpy, float16 at >= 10x numpy's float16 add.

Each timing is the best of ``--repeat`` runs (the machine is shared and
noisy; the best run is the least disturbed one).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from .. import dtypes, kernels, ops
from ..dtypes import bfloat16_numpy
from ..kernels import Reduction

TARGETS = {"float32": 0.9, "float64": 0.9, "int32": 0.9, "float16": 10.0}


def _best_pair(fn_a, fn_b, repeat_a, repeat_b):
    """Best times of two functions, runs interleaved so that both see the
    same background load."""
    fn_a()  # warm-up: page faults, dispatch resolution
    fn_b()
    best = [float("inf"), float("inf")]
    for i in range(max(repeat_a, repeat_b)):
        for k, fn, rep in ((0, fn_a, repeat_a), (1, fn_b, repeat_b)):
            if i < rep:
                t = time.perf_counter()
                fn()
                best[k] = min(best[k], time.perf_counter() - t)
    return best


def _arrays(name, n, rng):
    if name == "bfloat16":
        a = rng.standard_normal(n, dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        bf16 = bfloat16_numpy()
        if bf16 is None:
            return kernels.f32_to_bf16(a), kernels.f32_to_bf16(b), None
        return a.astype(bf16), b.astype(bf16), True
    dt = np.dtype(name)
    if dt.kind == "f":
        return rng.standard_normal(n).astype(dt), rng.standard_normal(n).astype(dt), True
    return rng.integers(-1000, 1000, n).astype(dt), rng.integers(-1000, 1000, n).astype(dt), True


def run(mib=16, repeat=10, names=("float32", "float64", "int32", "float16", "bfloat16")):
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        itemsize = 2 if name == "bfloat16" else np.dtype(name).itemsize
        n = (mib << 20) // itemsize
        a, b, numpy_ok = _arrays(name, n, rng)
        moved = 3 * n * itemsize
        # The algorithms' hot path: a Reduction bound once, combine() per call.
        red = Reduction(ops.BY_NAME["sum"], dtypes.BY_NAME[name])
        sa, sb = a.view(red.dtype.storage), b.view(red.dtype.storage)
        # numpy's float16 add is slow: fewer runs of it keep the bench short.
        np_repeat = (max(2, repeat // 5) if name in ("float16", "bfloat16") else repeat) if numpy_ok else 0
        t_np, t_mc = _best_pair(lambda: np.add(a, b, out=a), lambda: red.combine(sa, sa, sb),
                                np_repeat, repeat)
        if not numpy_ok:
            t_np = float("nan")
        rows.append({"dtype": name, "mib": mib, "numpy_s": t_np, "mpicoll_s": t_mc,
                     "numpy_gbs": moved / t_np / 1e9, "mpicoll_gbs": moved / t_mc / 1e9,
                     "speedup": t_np / t_mc, "target": TARGETS.get(name)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=16, help="array size in MiB (default 16)")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    print(f"mpicoll kernels, sum in place on {args.mib} MiB arrays; dispatch: {kernels.isa()}")
    print(f"{'dtype':<9} {'numpy GB/s':>11} {'mpicoll GB/s':>13} {'speedup':>8} {'target':>7}  ok")
    ok_all = True
    for r in run(args.mib, args.repeat):
        target = r["target"]
        ok = "" if target is None else ("yes" if r["speedup"] >= target else "NO")
        ok_all &= ok != "NO"
        tgt = "" if target is None else f">={target:g}x"
        print(f"{r['dtype']:<9} {r['numpy_gbs']:>11.2f} {r['mpicoll_gbs']:>13.2f} {r['speedup']:>7.2f}x {tgt:>7}  {ok}")
    return 0 if ok_all else 1
