"""Markdown tables from ``python -m mpicoll.bench --json`` files, in the
project's ratio convention (speed-up = MPI_Allreduce's time / the
algorithm's time; > 1 means faster than MPI).

    python tools/bench_table.py bench-out/bench-p2.json [bench-out/bench-p4.json ...]
"""
from __future__ import annotations

import json
import sys


def _size(n: int) -> str:
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def table(result: dict, mode: str = "out") -> str:
    meta = result["meta"]
    rows = [r for r in result["rows"] if r["mode"] == mode]
    algs = [a for a in dict.fromkeys(r["algorithm"] for r in rows) if a not in ("MPI_Allreduce", "auto")]
    out = [f"**p = {meta['p']}** ({meta['mpi']}, {meta['op']} {meta['dtype']}, {'out of' if mode == 'out' else 'in'} "
           f"place, time = {meta['stat']} of the slowest rank over iterations, best of {meta['repeat']})", "",
           "| size | MPI_Allreduce us | auto (choice) us | auto speed-up | "
           + " | ".join(f"{a}" for a in algs) + " |",
           "|---" * (4 + len(algs)) + "|"]
    by = {(r["bytes"], r["algorithm"]): r for r in rows}
    for n in sorted({r["bytes"] for r in rows}):
        nat, auto = by.get((n, "MPI_Allreduce")), by.get((n, "auto"))
        if nat is None or auto is None:
            continue
        cells = [_size(n), f"{nat['time_us']:.1f}", f"{auto['time_us']:.1f} ({auto['chosen']})",
                 f"{nat['time_us'] / auto['time_us']:.2f}"]
        cells += [f"{nat['time_us'] / by[(n, a)]['time_us']:.2f}" if (n, a) in by else "-" for a in algs]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    for path in (sys.argv[1:] if argv is None else argv):
        with open(path) as f:
            print(table(json.load(f)))
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
