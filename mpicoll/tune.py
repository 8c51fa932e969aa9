"""Measure this machine and write a tuning profile for ``algorithm="auto"``.

    mpiexec -n 2 python -m mpicoll.tune                # writes ~/.cache/mpicoll/tuning.json
    mpiexec -n 4 python -m mpicoll.tune                # adds p=4 to the same profile
    mpiexec -n 4 python -m mpicoll.tune --out prof.json --sizes 8:64M

What it does, on the communicator it runs on (``p`` ranks):

1. times every registered all-reduce algorithm, out of place, on a sweep of
   message sizes (the benchmark's ``run()``, best of ``--repeat``
   interleaved runs), and the ring with several segment sizes;
2. per size keeps the fastest, preferring the native ``mpi`` algorithm
   unless another one beats it by ``--margin`` (a choice should not flip on
   noise), overrules a lone winner between two sizes that agree on another
   (``smooth``), and merges neighbouring sizes with the same winner into ranges
   whose edges lie half-way (geometrically) between the measured sizes;
3. fits the alpha-beta-gamma model (``mpicoll.model``) to every
   measurement in the profile (this run's and earlier runs' at other
   process counts) and uses it to decide for the process counts nobody
   measured, 2 .. 4096 and beyond, in ranges (powers of two alone, the
   counts between them together);
4. writes the profile (measured rules first: they win where they apply).

A profile is specific to a machine, an MPI library and whether the dtype
is native to MPI (``--dtype``); the op is not distinguished.
"""
from __future__ import annotations

import argparse
import math
import platform
import time
from typing import List, Optional

import numpy as np
from mpi4py import MPI

import importlib
from . import dtypes as _dtypes
from . import model as _model
from . import modelfit as _modelfit
from . import ops as _ops
from . import profile as _profile
from .bench import allreduce as _bench
from .bench import timing as _timing
from .commstate import state
from .kernels import Reduction

# Not `from . import algorithms`: the package attribute is mpicoll.algorithms(), the function.
_alg = importlib.import_module("mpicoll.algorithms")

DEFAULT_SIZES = "8:256M"
DEFAULT_SEGMENTS = "256K,1M,4M"
# The model decides for p up to this; the last range is open-ended.
MODEL_P_MAX = 4096


def _edges(sizes: List[int]) -> List[int]:
    """Range edges half-way (geometrically) between consecutive sizes."""
    return [int(math.sqrt(a * b)) for a, b in zip(sizes, sizes[1:])]


def ranges_from_winners(sizes: List[int], winners: List[tuple]) -> List[tuple]:
    """[(bytes_min, bytes_max, (algorithm, segment_bytes))]: consecutive
    sizes with the same winner merged, the first range from 0, the last
    open (None)."""
    edges = [0] + _edges(sizes) + [None]
    out = []
    for i, w in enumerate(winners):
        if out and out[-1][2] == w:
            out[-1] = (out[-1][0], edges[i + 1], w)
        else:
            out.append((edges[i], edges[i + 1], w))
    return out


def p_ranges(p_max: int = MODEL_P_MAX) -> List[tuple]:
    """[(p_min, p_max, representative p)]: each power of two alone, the
    counts strictly between two powers together, represented by their
    geometric middle; the last range is open."""
    out = []
    k = 2
    while k <= p_max:
        out.append((k, k, k))
        lo, hi = k + 1, 2 * k - 1
        if lo <= hi:
            out.append((lo, hi if 2 * k <= p_max else None, max(lo, min(hi, int(round(math.sqrt(lo * hi)))))))
        k *= 2
    return out


def smooth(winners: List[tuple]) -> List[tuple]:
    """Replace a lone winner between two equal neighbours by theirs: the
    fastest algorithm does not change for one size and back at the next,
    so an isolated flip is measurement noise."""
    out = list(winners)
    for i in range(1, len(out) - 1):
        if winners[i - 1] == winners[i + 1] != winners[i]:
            out[i] = winners[i - 1]
    return out


def choose(times: dict, margin: float) -> tuple:
    """(algorithm, segment_bytes) with the least time, where only a clear
    win (by ``margin``) displaces the native ``mpi``."""
    (t_best, best) = min((t, k) for k, t in times.items())
    native = times.get(("mpi", None))
    if native is not None and best != ("mpi", None) and t_best > native * (1 - margin):
        return ("mpi", None)
    return best


def _time_ring_segments(comm, sizes, dt, red, segments, repeat, scale) -> list:
    """Times of the ring with each segment size (called directly: the
    public API has no knob for it)."""
    st = state(comm)
    ring = _alg.get("allreduce", "ring")
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // dt.itemsize)
        for seg in segments:
            if seg >= -(-count * dt.itemsize // comm.Get_size()):  # one segment per block: same as any larger one
                continue
            src = _bench.inputs(dt, red.op.name, count, comm.Get_rank(), timing=True)
            buf = np.empty_like(src)
            warmup, iters = _timing.iterations(count * dt.itemsize, scale)
            best = math.inf
            for _ in range(repeat):
                ts = _timing.measure(comm, lambda: ring(st, buf, red, src=src, segment_bytes=seg), iters, warmup)
                best = min(best, float(ts.min()))
            rows.append({"bytes": count * dt.itemsize, "algorithm": "ring", "segment_bytes": seg, "time_s": best})
    return rows


def tune(comm=None, sizes: Optional[List[int]] = None, op: str = "sum", dtype: str = "float32",
         segments: Optional[List[int]] = None, repeat: int = 2, scale: float = 1.0, margin: float = 0.05,
         base: Optional[_profile.Profile] = None, progress: Optional[bool] = None,
         stream_bytes: int = 64 << 20) -> _profile.Profile:
    """Measure on ``comm`` and return the profile (``base``'s entries for
    other process counts kept). Every rank returns the same profile."""
    comm = MPI.COMM_WORLD if comm is None else comm
    p = comm.Get_size()
    if p < 2:
        raise ValueError("tune: needs at least 2 ranks (run it with mpiexec -n P, P >= 2)")
    dt = _dtypes.BY_NAME[dtype]
    red = Reduction(_ops.resolve(op), dt)
    native_dtype = dt.native
    sizes = _timing.parse_sizes(DEFAULT_SIZES) if sizes is None else sorted(sizes)
    segments = _timing.parse_sizes(DEFAULT_SEGMENTS) if segments is None else segments
    algs = [a for a in _alg.names("allreduce") if a != "auto"]
    res = _bench.run(comm, sizes, algs, op, dtype, modes=("out",), scale=scale, repeat=repeat,
                     progress=progress, validate=False, stat="min", stream_bytes=stream_bytes)
    rows = [{"p": p, "bytes": r["bytes"], "algorithm": r["algorithm"], "segment_bytes": None,
             "time_s": r["time_us"] * 1e-6, "itemsize": dt.itemsize, "native_dtype": native_dtype}
            for r in res["rows"]]
    if _alg.has("allreduce", "ring"):
        for r in _time_ring_segments(comm, sizes, dt, red, segments, repeat, scale):
            rows.append({"p": p, "itemsize": dt.itemsize, "native_dtype": native_dtype, **r})
    measured_sizes = sorted({r["bytes"] for r in rows})

    # 2. measured rules for this p.
    winners = []
    for nb in measured_sizes:
        times = {(r["algorithm"], r["segment_bytes"]): r["time_s"] for r in rows
                 if r["bytes"] == nb and r["algorithm"] != _bench.NATIVE}
        winners.append(choose(times, margin))
    winners = smooth(winners)
    new_rules = []
    for lo, hi, (alg, seg) in ranges_from_winners(measured_sizes, winners):
        new_rules.append(_profile.Rule(p, p, lo, hi, alg, seg, native_dtype, "measured",
                                       f"fastest of {len(algs)} algorithms measured at p={p}"))

    # Keep what earlier runs measured at other process counts (or for the
    # other kind of dtype); replace this p's.
    old_meas, old_rules, meta = [], [], {}
    if base is not None:
        same = lambda pp, nd: pp == p and nd == native_dtype  # noqa: E731
        old_meas = [m for m in base.measurements if not same(m.get("p"), m.get("native_dtype", True))]
        old_rules = [r for r in base.rules if r.source == "measured" and not (r.p_min <= p <= (r.p_max or p)
                                                                              and r.native_dtype == native_dtype)]
        meta = dict(base.meta)
    measurements = old_meas + rows
    measured_rules = sorted(old_rules + new_rules, key=lambda r: (not r.native_dtype, r.p_min, r.bytes_min))

    # 3. the model, from every native-dtype measurement, for the other p.
    fit_rows = [m for m in measurements if m.get("native_dtype", True)]
    model = _modelfit.fit(fit_rows) if fit_rows else None
    model_rules = []
    if model is not None and "p2p" in model.params and "mpi" in model.params:
        # Every rank has the same model (the same measurements), so rank 0
        # works the rules out and sends them: pricing every candidate at
        # p = 2..4096 is 0.2 s of Python, which p ranks sharing few cores
        # would otherwise all pay at once.
        if comm.Get_rank() == 0:
            model_rules = model_rules_for(model)
        model_rules = comm.bcast(model_rules, root=0)
    measured_p = sorted({m["p"] for m in measurements})
    meta.update({"host": platform.node(), "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "measured_p": measured_p,
                 "op": op, "dtype": dtype, "margin": margin, "stream": res["stream"]})
    return _profile.Profile(measured_rules + model_rules, model=model, meta=meta, measurements=measurements)


def model_rules_for(model) -> List[_profile.Rule]:
    """Rules for the process counts up to MODEL_P_MAX (p_ranges), each the
    model's fastest predicted algorithm over the default size grid."""
    candidates = [a for a in _model.P2P + ("mpi",) if _alg.has("allreduce", a)]
    grid = _timing.default_sizes()
    rules = []
    for p_lo, p_hi, p_rep in p_ranges():
        winners = [(_model.best(model, p_rep, nb, candidates)[1], None) for nb in grid]
        for lo, hi, (alg, seg) in ranges_from_winners(grid, winners):
            rules.append(_profile.Rule(p_lo, p_hi, lo, hi, alg, seg, True, "model",
                                       f"least predicted time at p={p_rep}"))
    return rules


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mpiexec -n P python -m mpicoll.tune",
                                 description="Measure the all-reduce algorithms here and write a tuning profile.")
    ap.add_argument("--out", default=None,
                    help=f"profile to write (default: ${_profile.ENV_TUNING_FILE}, else {_profile.default_path()})")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes (as the bench: 8,4K,1M or 8:64M)")
    ap.add_argument("--segments", default=DEFAULT_SEGMENTS, help="ring segment sizes to try")
    ap.add_argument("--op", default="sum", choices=_ops.names())
    ap.add_argument("--dtype", default="float32", choices=_dtypes.names())
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply iteration counts")
    ap.add_argument("--margin", type=float, default=0.05,
                    help="how much faster than native mpi another algorithm must be to be chosen (default 0.05)")
    ap.add_argument("--fresh", action="store_true", help="do not keep other process counts' entries from --out")
    args = ap.parse_args(argv)
    out = args.out or _profile.path() or _profile.default_path()
    comm = MPI.COMM_WORLD
    base, err = None, None
    if comm.Get_rank() == 0 and not args.fresh:
        try:
            base = _profile.load(out)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            err = str(e)
    base = comm.bcast(base, root=0)
    if err and comm.Get_rank() == 0:
        print(f"tune: not merging with the existing {out}: {err}")
    prof = tune(comm, _timing.parse_sizes(args.sizes), args.op, args.dtype, _timing.parse_sizes(args.segments),
                args.repeat, args.scale, args.margin, base)
    if comm.Get_rank() == 0:
        _profile.save(prof, out)
        print(f"wrote {out}: measured p = {prof.meta['measured_p']}, {len(prof.rules)} rules")
        for r in prof.rules:
            if r.source == "measured":
                print(f"  measured  {r.describe():<52} -> {r.algorithm}")
        if prof.model is not None:
            for fam, prm in prof.model.params.items():
                print(f"  model {fam}: o={prm.o * 1e6:.1f} us alpha={prm.alpha * 1e6:.2f} us "
                      f"beta={prm.beta * 1e9:.3f} ns/B gamma={prm.gamma * 1e9:.3f} ns/B "
                      f"(rms rel. error {prof.model.rms_rel_error[fam]:.0%})")
        print(f"auto uses it when MPICOLL_TUNING_FILE={out} (or it is the default {_profile.default_path()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
