"""The native-vs-mpicoll plot of docs/scale.md, as a hand-written SVG.

    python sim/plot.py [--doc docs/scale.md] [--out docs/scale-native-vs-mpicoll.svg]

reads the "mpicoll best / MPICH / Open MPI" tables of docs/scale.md (one
per platform section: "### The fat tree ..." and "### This machine ...")
and draws, per platform, the simulated time per call against the message
size, log-log: mpicoll's best algorithm (solid), MPICH's call priced with
its reductions and mpicoll's call cost (dashed), Open MPI's call as SMPI
simulated it, reductions not priced (dotted); one colour per process count.
Standard library only: matplotlib is an optional extra of the package
(`pip install mpicoll[plot]`, for `mpicoll.bench --plot`), not something
the documentation's figure should need.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = (("The fat tree", "fat tree, 100 Gbit/s (cluster-128x8-fattree.xml)"),
            ("This machine", "this machine x 128 on 1 Gbit/s (this-machine.xml)"))
HEADER = "| p | size | mpicoll best (us) | MPICH (SMPI) us | MPICH + reductions + call (us)"
COLOURS = {64: "#1b6ca8", 256: "#d95f02", 1024: "#2a9d3f"}
SERIES = (("mpicoll", "mpicoll best", ""), ("mpich", "MPICH + reductions", "7,4"),
          ("ompi", "Open MPI (no reductions)", "2,3"))
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}


def _number(cell: str):
    """The last number in a cell ('rabenseifner 59.5' -> 59.5), None for '-'."""
    found = re.findall(r"[0-9]+(?:\.[0-9]+)?", cell)
    return float(found[-1]) if found and cell.strip() != "-" else None


def _bytes(cell: str) -> int:
    value, unit = cell.split()
    return int(value) * UNITS[unit]


def read_tables(text: str) -> dict:
    """{section title: {p: {series: [(bytes, us)]}}} from the note's tables."""
    out = {}
    for title, _ in SECTIONS:
        start = text.find("### " + title)
        if start < 0:
            raise ValueError(f"plot: no section '### {title}' in the note")
        at = text.find(HEADER, start)
        if at < 0:
            raise ValueError(f"plot: no native-vs-mpicoll table in section '{title}'")
        data = {}
        for line in text[at:].splitlines()[2:]:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip("|").split("|")]
            p, n = int(cells[0]), _bytes(cells[1])
            for key, col in (("mpicoll", 2), ("mpich", 4), ("ompi", 5)):
                t = _number(cells[col])
                if t is not None:
                    data.setdefault(p, {}).setdefault(key, []).append((n, t))
        out[title] = data
    return out


def _ticks(lo: float, hi: float):
    """Powers of ten covering [lo, hi]."""
    return [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def _size_label(n: int) -> str:
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n >> k} {unit}"
    return f"{n} B"


def _time_label(us: float) -> str:
    return f"{us / 1e6:g} s" if us >= 1e6 else f"{us / 1e3:g} ms" if us >= 1e3 else f"{us:g} us"


def svg(tables: dict) -> str:
    w, h, left, top, pw, ph, gap = 980, 430, 70, 40, 380, 300, 110
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
             'font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>']
    for i, (title, caption) in enumerate(SECTIONS):
        data = tables[title]
        points = [pt for series in data.values() for pts in series.values() for pt in pts]
        xs = sorted({n for n, _ in points})
        y_ticks = _ticks(min(t for _, t in points), max(t for _, t in points))
        ylo, yhi = math.log10(y_ticks[0]), math.log10(y_ticks[-1])
        x0 = left + i * (pw + gap)

        def px(n, xs=xs, x0=x0):  # sizes evenly spaced by their rank (log scale, 4-6 sizes)
            return x0 + pw * (xs.index(n) + 0.5) / len(xs)

        def py(t, ylo=ylo, yhi=yhi):
            return top + ph * (1 - (math.log10(t) - ylo) / (yhi - ylo))

        parts.append(f'<text x="{x0 + pw / 2}" y="{top - 14}" text-anchor="middle" font-weight="bold">'
                     f'{caption}</text>')
        parts.append(f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        for t in y_ticks:
            y = py(t)
            parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_time_label(t)}</text>')
        for n in xs:
            x = px(n)
            parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#eee"/>')
            parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_size_label(n)}</text>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{top + ph + 34}" text-anchor="middle">all-reduce size '
                     '(float32 sum, 8 ranks per node)</text>')
        if i == 0:
            parts.append(f'<text x="16" y="{top + ph / 2}" text-anchor="middle" '
                         f'transform="rotate(-90 16 {top + ph / 2})">simulated time per call</text>')
        for p in sorted(data):
            for key, _, dash in SERIES:
                pts = sorted(data[p].get(key, []))
                if not pts:
                    continue
                path = " ".join(f"{px(n):.1f},{py(t):.1f}" for n, t in pts)
                style = f' stroke-dasharray="{dash}"' if dash else ""
                parts.append(f'<polyline points="{path}" fill="none" stroke="{COLOURS.get(p, "#000")}" '
                             f'stroke-width="1.8"{style}/>')
                for n, t in pts:
                    parts.append(f'<circle cx="{px(n):.1f}" cy="{py(t):.1f}" r="2.5" '
                                 f'fill="{COLOURS.get(p, "#000")}"/>')
    # legend: colours (p) and line styles (series)
    ly = h - 30
    x = left
    for p, colour in COLOURS.items():
        parts.append(f'<line x1="{x}" y1="{ly}" x2="{x + 24}" y2="{ly}" stroke="{colour}" stroke-width="3"/>')
        parts.append(f'<text x="{x + 30}" y="{ly + 4}">p = {p}</text>')
        x += 95
    x += 20
    for _, label, dash in SERIES:
        style = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line x1="{x}" y1="{ly}" x2="{x + 30}" y2="{ly}" stroke="#333" stroke-width="1.8"{style}/>')
        parts.append(f'<text x="{x + 36}" y="{ly + 4}">{label}</text>')
        x += 60 + 7 * len(label)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "scale.md"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "scale-native-vs-mpicoll.svg"))
    a = ap.parse_args(argv)
    with open(a.doc) as f:
        tables = read_tables(f.read())
    with open(a.out, "w") as f:
        f.write(svg(tables))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
