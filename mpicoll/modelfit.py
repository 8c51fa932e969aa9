"""Fitting the cost model (mpicoll/model.py) to measurements.

``fit`` finds each family's (o, alpha, beta, gamma) from measured times by
non-negative least squares on relative errors, so that 5 us and 50 ms
measurements weigh alike; ``rows_from_bench`` turns a ``python -m
mpicoll.bench --json`` result into its rows; ``compare`` prices the rows
with a fitted model against what was measured. Used by ``python -m
mpicoll.tune`` and ``python -m mpicoll.model --fit``; ``auto`` only reads
the fitted parameters (model.Model, kept in a tuning profile).
"""
from __future__ import annotations

import itertools
from typing import Dict, Iterable

import numpy as np

from .model import NATIVE, P2P, Model, Params, family, terms


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 for a handful of unknowns: the best
    unconstrained solution over every subset of free variables that comes
    out non-negative (the optimum of a convex problem is one of them)."""
    k = a.shape[1]
    best, best_res = np.zeros(k), float(np.sum(b * b))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(k)
            x[list(cols)] = sol
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best


def fit(rows: Iterable[dict]) -> Model:
    """Fit (o, alpha, beta, gamma) per family from measurement rows.

    Each row needs ``algorithm``, ``p``, ``bytes``, ``time_s`` and may give
    ``itemsize`` and ``segment_bytes``; rows of algorithms without a formula
    (``auto``, or ones registered later) are skipped.
    """
    by_family: Dict[str, list] = {}
    for r in rows:
        alg = r["algorithm"]
        if alg not in P2P + NATIVE or r["time_s"] <= 0 or r["p"] < 2:
            continue
        t = terms(alg, int(r["p"]), int(r["bytes"]), int(r.get("itemsize", 4)),
                  segment_bytes=r.get("segment_bytes"))
        by_family.setdefault(family(alg), []).append(([1.0, t.messages, t.wire, t.combined], float(r["time_s"])))
    params, err = {}, {}
    for fam, data in by_family.items():
        a = np.array([x for x, _ in data])
        t = np.array([y for _, y in data])
        # Divide each equation by its measured time: minimises relative error.
        sol = _nnls(a / t[:, None], np.ones_like(t))
        params[fam] = Params(*map(float, sol))
        rel = (a @ sol - t) / t
        err[fam] = float(np.sqrt(np.mean(rel ** 2)))
    return Model(params, err)


def rows_from_bench(result: dict, mode: str = "out") -> list:
    """Measurement rows for ``fit()`` from a ``python -m mpicoll.bench --json`` result."""
    meta = result["meta"]
    return [{"p": meta["p"], "bytes": r["bytes"], "algorithm": r["algorithm"], "time_s": r["time_us"] * 1e-6,
             "itemsize": meta.get("itemsize", 4)} for r in result["rows"]
            if r["mode"] == mode and r["algorithm"] in P2P + NATIVE]


def compare(model: Model, rows: Iterable[dict]) -> Dict[tuple, dict]:
    """Measured vs predicted per (p, algorithm): rms and max relative error
    (prediction / measurement - 1), and the per-size pairs."""
    out: Dict[tuple, dict] = {}
    for r in rows:
        key = (r["p"], r["algorithm"])
        pred = model.predict(r["algorithm"], r["p"], r["bytes"], r.get("itemsize", 4),
                             segment_bytes=r.get("segment_bytes"))
        out.setdefault(key, {"pairs": []})["pairs"].append((r["bytes"], r["time_s"], pred))
    for v in out.values():
        rel = np.array([pr / t - 1 for _, t, pr in v["pairs"]])
        v["rms"] = float(np.sqrt(np.mean(rel ** 2)))
        v["max"] = float(np.max(np.abs(rel)))
    return out
