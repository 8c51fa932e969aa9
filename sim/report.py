"""Markdown tables for docs/scale.md from a study's JSON files (sim/study.sh).

    python sim/report.py --platform platforms/cluster-128x8-fattree.xml \\
        --mpicoll bench-out/sim/mpicoll-cluster-128x8-fattree.json \\
        --native bench-out/sim/native-cluster-128x8-fattree-mpich.json bench-out/sim/native-...-ompi.json

prints three tables: every algorithm's simulated time; the native anchor
beside mpicoll's best; auto's choice against the best (regret).
(matplotlib is not in the project's venv, so no plot: text tables.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mpicoll import simulate  # noqa: E402


def _us(t):
    return "-" if t is None else (f"{t * 1e6:.0f}" if t >= 1e-4 else f"{t * 1e6:.1f}")


def _size(n):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def _regret(r):
    if r is None:
        return "unknown (not simulated)"
    return f"{r:.0%}" + (" **>10 %**" if r > 0.10 else "")


def tables(plat, rows, native, ppn) -> str:
    summary = simulate.summarize(rows, plat, ppn, native)
    algs = sorted({r["algorithm"] for r in rows})
    out = ["| p | size | " + " | ".join(algs) + " | best |", "|---" * (len(algs) + 3) + "|"]
    for s in summary:
        out.append(f"| {s['p']} | {_size(s['bytes'])} | " + " | ".join(_us(s["times"].get(a)) for a in algs)
                   + f" | {min(s['times'], key=s['times'].get) if s['times'] else '-'} |")
    out += ["", "| p | size | mpicoll best (us) | MPICH (SMPI) us | MPICH + reductions + call (us) | "
                "Open MPI (SMPI) us | MPICH priced / mpicoll best |", "|---|---|---|---|---|---|---|"]
    for s in summary:
        best = min(s["times"].items(), key=lambda kv: kv[1]) if s["times"] else None
        ratio = "-" if best is None or s["mpi_priced"] is None else f"{s['mpi_priced'] / best[1]:.2f}"
        out.append(f"| {s['p']} | {_size(s['bytes'])} | {best[0] + ' ' + _us(best[1]) if best else '-'} | "
                   f"{_us(s['native']['mpich'])} | {_us(s['mpi_priced'])} | {_us(s['native']['ompi'])} | {ratio} |")
    out += ["", f"| p | size | best | best time (us) | auto ({ppn} per node) | its time (us) | regret | "
                "auto, no shm window | its time (us) | regret |", "|---" * 10 + "|"]
    for s in summary:
        out.append(f"| {s['p']} | {_size(s['bytes'])} | {s['best']} | {_us(s['best_s'])} | {s['auto']} | "
                   f"{_us(s['auto_s'])} | {_regret(s['regret'])} | {s['auto_no_shm']} | {_us(s['auto_no_shm_s'])} | "
                   f"{_regret(s['regret_no_shm'])} |")
    return "\n".join(out)


def load_rows(files, error):
    """(rows, ranks per node) of ``python -m mpicoll.simulate --json`` files,
    merged: a later file's simulated cell replaces an earlier file's skipped
    one. ``error(message)`` for files of different layouts."""
    rows, ppn = [], None
    for file in files:
        with open(file) as f:
            d = json.load(f)
        if ppn is not None and d["ppn"] != ppn:
            error(f"{file}: {d['ppn']} ranks per node, the others {ppn}")
        ppn = d["ppn"]
        done = {(r["p"], r["bytes"], r["algorithm"]) for r in d["rows"] if r["time_s"] is not None}
        rows = [r for r in rows if (r["p"], r["bytes"], r["algorithm"]) not in done] + d["rows"]
    return rows, ppn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", required=True)
    ap.add_argument("--mpicoll", required=True, nargs="+",
                    help="python -m mpicoll.simulate --json outputs (their cells are merged)")
    ap.add_argument("--native", nargs="*", default=[], help="sim/run_anchor.py --json outputs")
    ap.add_argument("--profile-out", help="also write the tuning profile of the simulated best")
    a = ap.parse_args(argv)
    rows, ppn = load_rows(a.mpicoll, ap.error)
    natives = [x for x in a.native if os.path.exists(x)]
    plat, native = simulate.load_platform(a.platform), simulate.load_native(natives)
    print(tables(plat, rows, native, ppn))
    if a.profile_out:
        from mpicoll import profile

        profile.save(simulate.profile_from(simulate.summarize(rows, plat, ppn, native), plat, ppn), a.profile_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
