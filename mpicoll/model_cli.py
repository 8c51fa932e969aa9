"""``python -m mpicoll.model``: the cost model's command line.

Fits the model to ``python -m mpicoll.bench --json`` results and prints
measured against predicted, or predicts from a tuning profile's fitted model
at process counts this machine cannot run. Kept apart from model.py because
it reads tuning profiles (profile.py), which sit above the model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from . import profile as _profile
from .model import KNOMIAL_RADIX, P2P, SEEDS, Model, family
from .modelfit import compare, fit, rows_from_bench


def _print_params(model: Model) -> None:
    for fam, prm in model.params.items():
        print(f"  {fam:<7} o={prm.o * 1e6:.2f} us  alpha={prm.alpha * 1e6:.2f} us  "
              f"beta={prm.beta * 1e9:.3f} ns/B ({1 / prm.beta / 1e9 if prm.beta else math.inf:.2f} GB/s)  "
              f"gamma={prm.gamma * 1e9:.3f} ns/B  fit rms rel. error {model.rms_rel_error.get(fam, math.nan):.0%}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.model",
                                 description="Fit the cost model to bench results, or predict from a profile's model.")
    ap.add_argument("--profile", default=None,
                    help="tuning profile whose model to use (default: MPICOLL_TUNING_FILE or the per-user one)")
    ap.add_argument("--fit", nargs="+", metavar="BENCH.json",
                    help="fit to these bench --json results instead, and print measured vs predicted")
    ap.add_argument("--p", default="16,64,256,1024,4096", help="comma-separated process counts to predict")
    ap.add_argument("--sizes", default="8,4096,65536,1048576,16777216,268435456", help="message sizes in bytes")
    ap.add_argument("--ppn", type=int, default=8, help="ranks per node for the cascade's prediction")
    ap.add_argument("--radix", type=int, default=KNOMIAL_RADIX, help="the k-nomial tree's radix")
    args = ap.parse_args(argv)
    if args.fit:
        rows = []
        for f in args.fit:
            with open(f) as fh:
                rows += rows_from_bench(json.load(fh))
        model = fit(rows)
        print(f"model fitted to {len(rows)} measurements from {', '.join(args.fit)}")
        _print_params(model)
        cmp = compare(model, rows)
        sizes = sorted({r["bytes"] for r in rows})
        print("measured vs predicted (us); rel. error = predicted / measured - 1")
        print(f"{'p':>3} {'algorithm':<19} {'rms':>5} {'max':>5}  " + " ".join(f"{n:>15}" for n in sizes))
        for (p, alg), v in sorted(cmp.items()):
            cells = {n: f"{t * 1e6:.0f}/{pr * 1e6:.0f}" for n, t, pr in v["pairs"]}
            print(f"{p:>3} {alg:<19} {v['rms']:>5.0%} {v['max']:>5.0%}  " +
                  " ".join(f"{cells.get(n, '-'):>15}" for n in sizes))
        for p in sorted({k[0] for k in cmp}):
            errs = [x for (pp, _), v in cmp.items() if pp == p for x in
                    [pr / t - 1 for _, t, pr in v["pairs"]]]
            print(f"p={p}: rms relative error {np.sqrt(np.mean(np.square(errs))):.0%} over {len(errs)} points, "
                  f"median |error| {np.median(np.abs(errs)):.0%}")
    else:
        path = args.profile or _profile.path()
        if not os.path.exists(path):
            print(f"{path}: no tuning profile there; write one with `python -m mpicoll.tune` (make tune), "
                  "name one with --profile, or fit bench results with --fit", file=sys.stderr)
            return 1
        prof = _profile.load(path)
        if prof.model is None:
            print(f"{path}: no fitted model in this profile")
            return 1
        model = prof.model
        print(f"model from {path}")
        _print_params(model)
    algs = [a for a in P2P + ("mpi",) + SEEDS if family(a) in model.params]
    knobs = {"knomial": {"radix": args.radix}, "cascade": {"ppn": args.ppn}}
    print("predicted time (us) at process counts not measured here:")
    print(f"  (knomial radix {args.radix}; cascade with {args.ppn} ranks per node; hetero_ring with equal "
          "weights, i.e. the ring: the model has one link speed)")
    print(f"{'p':>6} {'bytes':>11} " + " ".join(f"{a[:12]:>12}" for a in algs) + "  best")
    for p in (int(s) for s in args.p.split(",")):
        for n in (int(s) for s in args.sizes.split(",")):
            ts = [model.predict(a, p, n, **knobs.get(a, {})) for a in algs]
            print(f"{p:>6} {n:>11} " + " ".join(f"{t * 1e6:>12.1f}" for t in ts) + f"  {algs[int(np.argmin(ts))]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
