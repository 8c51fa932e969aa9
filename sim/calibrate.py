"""Calibrate platforms/this-machine.xml and report the simulation's error.

    python sim/calibrate.py fit BENCH-p2.json
        fits the cost model (mpicoll.model.fit) to mpicoll's measured
        all-reduce runs and prints the platform figures it implies
        (loopback bandwidth = 1/beta, per-message software cost = alpha
        minus the loopback latency, per-call cost = o);
    python sim/calibrate.py compare --platform platforms/this-machine.xml [--ppn K] BENCH-p2.json ...
        simulates every measured (p, algorithm, size) of the files on one
        node of the platform (default; --ppn K: K ranks per node, e.g. 1
        for the two-host namespace test bed) and prints measured vs
        simulated as a markdown table (docs/scale.md), with MPI_Allreduce's
        rows against SMPI's MPICH selector on the same platform and layout.

The measurements are ``python -m mpicoll.bench allreduce --json`` files
(sim/calibration/ holds the ones docs/scale.md quotes).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mpicoll import model, simulate  # noqa: E402

LOOPBACK_LAT_S = 1e-6  # the transfer share of alpha kept in the platform's loopback_lat


def fit(files) -> None:
    rows = []
    for f in files:
        with open(f) as fh:
            rows += model.rows_from_bench(json.load(fh))
    m = model.fit(rows)
    p2p = m.params["p2p"]
    n = sum(1 for r in rows if model.family(r["algorithm"]) == "p2p")
    print(f"p2p fit over {n} rows (rms rel. error {m.rms_rel_error.get('p2p', float('nan')):.0%}): "
          f"o={p2p.o * 1e6:.2f} us alpha={p2p.alpha * 1e6:.2f} us beta={p2p.beta * 1e9:.3f} ns/B "
          f"gamma={p2p.gamma * 1e9:.3f} ns/B")
    print(f'  loopback_bw="{1 / p2p.beta / 1e9:.2f}GBps" loopback_lat="{LOOPBACK_LAT_S * 1e6:g}us"')
    print(f'  mpicoll.op_overhead_s = {max(p2p.alpha - LOOPBACK_LAT_S, 0):.3g}')
    print(f'  mpicoll.call_overhead_s = {p2p.o:.3g}')


def _native_smpi(platform, p, ppn, sizes):
    """SMPI's MPICH-selector MPI_Allreduce, ``ppn`` ranks per node, per size (seconds)."""
    import run_anchor

    exe = run_anchor.build(os.path.join(os.path.dirname(HERE), "build", "sim"))
    rows = run_anchor.run_one(exe, platform, p, ppn, "mpich", "allreduce", sizes, 300)
    return {r["bytes"]: r["time_s"] for r in rows}


def compare(platform, files, ppn=None) -> None:
    plat = simulate.load_platform(platform)
    errs = {}
    print("| p | algorithm | " + " | ".join(["size: measured / simulated us (error)"]) + " |")
    print("|---|---|---|")
    for f in files:
        with open(f) as fh:
            d = json.load(fh)
        p = d["meta"]["p"]
        per_node = ppn or p
        by_alg = {}
        for r in d["rows"]:
            if r["mode"] == "out":
                by_alg.setdefault(r["algorithm"], []).append((r["bytes"], r["time_us"] * 1e-6))
        native = None
        for alg, pts in by_alg.items():
            cells = []
            for nbytes, meas in sorted(pts):
                if alg == "MPI_Allreduce":
                    if native is None:
                        native = _native_smpi(platform, p, per_node, sorted(b for b, _ in pts))
                    sim = native.get(nbytes)
                else:
                    sim = simulate.run(plat, "allreduce", alg, p, nbytes, ppn=per_node).time_s
                if sim is None:
                    cells.append(f"{_size(nbytes)}: {meas * 1e6:.0f} / -")
                    continue
                err = sim / meas - 1
                errs.setdefault((p, alg), []).append(err)
                cells.append(f"{_size(nbytes)}: {meas * 1e6:.0f} / {sim * 1e6:.0f} ({err:+.0%})")
            name = "MPI_Allreduce (SMPI mpich)" if alg == "MPI_Allreduce" else alg
            print(f"| {p} | {name} | " + ", ".join(cells) + " |")
    print()
    print("| p | algorithm | rms error | median abs. error |")
    print("|---|---|---|---|")
    for (p, alg), e in sorted(errs.items()):
        rms = math.sqrt(sum(x * x for x in e) / len(e))
        med = sorted(abs(x) for x in e)[len(e) // 2]
        print(f"| {p} | {alg} | {rms:.0%} | {med:.0%} |")


def _size(n):
    for unit, k in (("M", 20), ("K", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k}{unit}"
    return f"{n}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("files", nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("--platform", required=True)
    c.add_argument("--ppn", type=int, help="ranks per node (default: all on one node)")
    c.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "fit":
        fit(a.files)
    else:
        compare(a.platform, a.files, a.ppn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
