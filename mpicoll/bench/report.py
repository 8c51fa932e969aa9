"""Reporting of an all-reduce sweep (``bench.allreduce.run``'s result):
the table, the summary lines, JSON, CSV and plots."""
from __future__ import annotations

import csv
import json
import math

import numpy as np

# Ratios: speed-up = native time / mpicoll time everywhere (see speedup()).
NATIVE = "MPI_Allreduce"  # the label of the MPI library's own call in every row
ROW_FIELDS = ("bytes", "count", "algorithm", "mode", "chosen", "iters", "avg_us", "min_us", "max_us",
              "median_us", "time_us", "algbw_gbs", "busbw_gbs", "t_over_native", "wrong", "bound_us", "pct_of_bound")


def _fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def table(result: dict, explain: bool = False) -> str:
    meta, bw = result["meta"], result["stream"]
    lines = [f"mpicoll {meta['mpicoll']} all-reduce, {meta['op']} {meta['dtype']}, p={meta['p']}, {meta['mpi']}",
             f"node memory bandwidth (STREAM copy {bw['copy_gbs']:.1f} GB/s, add {bw['add_gbs']:.1f} GB/s, all ranks "
             f"at once); bound = 2 p n / {bw['node_gbs']:.1f} GB/s; times are the slowest rank's, per call; "
             f"time = {meta['stat']} over iterations; best of {meta['repeat']} interleaved run(s)"]
    if meta.get("profile"):
        lines.append(f"tuning profile: {meta['profile']}")
    head = (f"{'size':>9} {'algorithm':<22} {'mode':<4} {'iters':>5} {'avg us':>10} {'min us':>10} {'max us':>10} "
            f"{'time us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} {'speed-up':>8} {'% bound':>7} {'wrong':>5}")
    lines += [head, "-" * len(head)]
    for r in result["rows"]:
        label = r["algorithm"] if r["algorithm"] != "auto" else f"auto ({r['chosen']})"
        wrong = "-" if r["wrong"] is None else str(r["wrong"])
        lines.append(f"{_fmt_bytes(r['bytes']):>9} {label:<22.22} {r['mode']:<4} {r['iters']:>5} {r['avg_us']:>10.1f} "
                     f"{r['min_us']:>10.1f} {r['max_us']:>10.1f} {r['time_us']:>10.1f} {r['algbw_gbs']:>10.3f} {r['busbw_gbs']:>10.3f} "
                     f"{speedup(r):>8.2f} {r['pct_of_bound']:>6.1f}% {wrong:>5}")
    lines.append(summary(result))
    if explain:
        lines.append("auto's choices:")
        for e in result["explain"]:
            lines.append(f"  {_fmt_bytes(e['bytes']):>9}: {e['algorithm']} - {e['reason']}")
    return "\n".join(lines)


def speedup(row: dict) -> float:
    """The convention of every figure mpicoll prints: speed-up = native time /
    mpicoll time, > 1 means mpicoll is faster (rows keep the time ratio
    ``t_over_native``, its inverse, for the model fit and old files)."""
    return 1.0 / row["t_over_native"] if row["t_over_native"] else float("inf")


def summary(result: dict) -> str:
    """auto's speed-up over MPI_Allreduce against the targets (out of place)."""
    small = [speedup(r) for r in result["rows"]
             if r["algorithm"] == "auto" and r["mode"] == "out" and r["bytes"] <= 4096]
    large = [speedup(r) for r in result["rows"]
             if r["algorithm"] == "auto" and r["mode"] == "out" and r["bytes"] >= 4 << 20]
    parts = []
    if small:
        parts.append(f"auto speed-up over native <= 4 KiB: geomean {math.exp(np.mean(np.log(small))):.2f} "
                     "(target >= 0.80)")
    if large:
        parts.append(f">= 4 MiB: worst {min(large):.2f}, geomean {math.exp(np.mean(np.log(large))):.2f} "
                     f"(target >= 1.00)")
    return "summary (out of place): " + ("; ".join(parts) if parts else "no auto rows")


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def write_csv(result: dict, path: str) -> None:
    meta = result["meta"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=("p", "op", "dtype") + ROW_FIELDS)
        w.writeheader()
        for r in result["rows"]:
            w.writerow({"p": meta["p"], "op": meta["op"], "dtype": meta["dtype"], **{k: r[k] for k in ROW_FIELDS}})


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench: --plot needs matplotlib (pip install 'mpicoll[plot]')") from None
    meta = result["meta"]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5))
    for mode, style in (("out", "-"), ("in", ":")):
        for a in meta["algorithms"]:
            rs = [r for r in result["rows"] if r["algorithm"] == a and r["mode"] == mode]
            if not rs:
                continue
            xs = [r["bytes"] for r in rs]
            label = f"{a} ({'in place' if mode == 'in' else 'out of place'})"
            color = None if a != NATIVE else "black"
            line, = ax_t.plot(xs, [r["time_us"] for r in rs], style, marker=".", label=label, color=color)
            ax_b.plot(xs, [r["busbw_gbs"] for r in rs], style, marker=".", label=label, color=line.get_color())
    rs = [r for r in result["rows"] if r["algorithm"] == NATIVE and r["mode"] == meta["modes"][0]]
    ax_t.plot([r["bytes"] for r in rs], [r["bound_us"] for r in rs], "--", color="grey", label="memory bound")
    lowest = min(r["time_us"] for r in result["rows"])
    ax_t.set_ylim(bottom=lowest / 3)  # the bound falls far below at small sizes: do not let it set the scale
    ax_t.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel=f"latency ({meta['stat']}), slowest rank (us)")
    ax_b.set(xscale="log", xlabel="message size (bytes)", ylabel="busbw (GB/s)")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
    ax_b.legend(fontsize=7, ncol=2)
    fig.suptitle(f"mpicoll all-reduce, {meta['op']} {meta['dtype']}, p={meta['p']} ({meta['mpi']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


