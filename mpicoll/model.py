"""The alpha-beta-gamma cost model of the all-reduce algorithms.

A message of ``m`` bytes costs ``alpha + m beta``; combining ``m`` bytes
costs ``m gamma`` (Hockney's model with Thakur, Rabenseifner & Gropp's
reduction term, "Optimization of Collective Communication Operations in
MPICH", 2005). The time of one all-reduce is priced by its busiest rank:

    T = o + M alpha + W beta + R gamma

with ``M`` the messages, ``W`` the bytes that rank sends and ``R`` the bytes
it combines (``terms()``, each the largest over the ranks: exactly what the
simulated driver ``mpicoll.counting.simulate`` counts when it runs the
algorithm's schedule, which tests/test_model_counts.py checks for p = 1..9
and awkward counts), and ``o`` the fixed cost of one call (argument checks,
Python, the MPI library's entry; measured here it is tens of microseconds,
as large as several alphas, so leaving it out would bias alpha).

A message is counted where it is sent (its receive is the sender's
message), zero-byte ones included: they cost a latency all the same. Each
term is a maximum of its own, possibly over different ranks. ``p = 1``
prices nothing: the plan layer copies instead of running a schedule. The
busiest rank is not the critical path: the tree's reduce and broadcast
chain 2 ceil(log2 p) messages one after the other, while its busiest rank
sends ceil(log2 p), so on a power of two the tree and recursive doubling
get the same terms; the fitted alpha and the call cost ``o`` absorb such
chains on average.

``n`` is the message size in bytes, ``p`` the number of ranks, ``b_i`` the
blocks of np.array_split, ``pof2`` the largest power of two <= p,
``rem = p - pof2``, ``lg = log2(pof2)``, ``fold = 1`` when p is not a power
of two (else 0); for divisible sizes:

=====================  =====================  ==========================  =====================
algorithm              M (messages)           W (bytes sent)              R (bytes combined)
=====================  =====================  ==========================  =====================
ring                   (p-1)(segs+1)          2 (p-1)/p n                 (p-1)/p n
tree (reduce + bcast)  ceil(log2 p) (root)    ceil(log2 p) n              ceil(log2 p) n
recursive_doubling     lg + fold              (lg + fold) n               (lg + fold) n
rabenseifner           2 lg + fold            2 (pof2-1)/pof2 n + fold n  (pof2-1)/pof2 n + fold n
mpi (MPICH)            recursive doubling for n <= 2048 B or count < pof2, else Rabenseifner
knomial (radix k)      (k-1) ceil(log_k p)    (k-1) ceil(log_k p) n       (k-1) ceil(log_k p) n
cascade (N nodes of L) 2 (L-1) + cross        2 (L-1)/L n + cross         (L-1)/L n + cross
hetero_ring            as ring                max 2 n - b_r - b_(r+1)     n - min b_r
=====================  =====================  ==========================  =====================

(knomial: the root's counts when p is a power of k, fewer children at the
top level otherwise; cascade: ``cross`` is the ring's or recursive
doubling's terms for N ranks and n/L bytes, once per shard a rank owns;
hetero_ring: b_r are the weighted blocks. ``terms()`` computes all three
rank by rank, uneven nodes and blocks included.)

(uneven blocks: ``terms()`` sums the real block lengths, e.g. the ring's
W is max over r of 2 n - b_r - b_(r+1)). ``segs`` is the number of pipeline
segments per ring block (``ceil(max b / segment)``): each costs an extra
message in the reduce-scatter half. The ring and Rabenseifner fall back to
recursive doubling with fewer elements than ranks, as the implementations do.

Three parameter sets are fitted, since the costs per message differ by an
order of magnitude: ``p2p`` for mpicoll's algorithms (point-to-point calls
from Python), ``native`` for MPI_Allreduce called directly and ``mpi`` for
the same through mpicoll's API (the same formulas, a larger ``o``).
``modelfit.fit()`` finds (o, alpha, beta, gamma) >= 0 by least squares on
relative errors (so that 10 us and 1 s measurements weigh alike), from the
rows the benchmark writes.

    python -m mpicoll.model --profile bench-out/tuning.json --p 16,64,256,1024,4096
    python -m mpicoll.model --fit bench-out/bench-p2.json bench-out/bench-p3.json bench-out/bench-p4.json

print predicted times at process counts this machine cannot run (the
second fits the model to bench results first and prints measured against
predicted times).
"""
from __future__ import annotations

import functools
import math
from typing import Dict, Iterable, NamedTuple, Optional

import numpy as np


P2P = ("ring", "tree", "recursive_doubling", "rabenseifner")
NATIVE = ("mpi", "MPI_Allreduce")
# Issue 20's algorithms: priced with the p2p parameters, listed by the CLI,
# not fitted (no measurements of them in the bench rows); their knobs are
# terms() arguments. "auto" takes them by select.py's rules, drawn from the
# SimGrid study, not from this model: its busiest-rank terms have one link
# speed and no shared links, so they cannot see why the cascade wins (a
# node's link shared by its ranks) nor price uneven links (hetero_ring).
SEEDS = ("knomial", "cascade", "hetero_ring")
# Defaults of their knobs (copies, as RING_SEGMENT_BYTES: knomial.RADIX,
# cascade.CROSS_RING_MIN_BYTES).
KNOMIAL_RADIX = 4
CASCADE_CROSS_RING_MIN_BYTES = 64 << 10
# MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: at most this many bytes,
# MPIR_Allreduce_intra_auto runs recursive doubling.
MPICH_SHORT_MSG = 2048
# The ring's default segment (mpicoll.algorithms.ring.SEGMENT_BYTES); a
# copy, so the model stays importable without MPI.
RING_SEGMENT_BYTES = 1 << 20


class Params(NamedTuple):
    """Seconds per call, per message, per byte sent, per byte combined."""

    o: float
    alpha: float
    beta: float
    gamma: float

    def time(self, t: "Terms") -> float:
        return self.o + self.alpha * t.messages + self.beta * t.wire + self.gamma * t.combined


class Terms(NamedTuple):
    """Critical-path counts of one all-reduce (see the module docstring)."""

    messages: float
    wire: float  # bytes sent
    combined: float  # bytes combined


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _tree_counts(p: int) -> tuple:
    """(messages, combines) of the busiest rank of the binomial tree on p
    ranks: reduce to rank 0, then bcast from it. A rank sends once in the
    reduce (the root: never) and once per child in the bcast, and combines
    once per child in the reduce. Cached: O(p log p), independent of n."""
    most = combined = 0
    for v in range(p):
        children = sum(1 for k in range(_log2_ceil(p)) if v % (2 << k) == 0 and v + (1 << k) < p)
        most = max(most, children + (v != 0))
        combined = max(combined, children)
    return most, combined


def _blocks(count: int, p: int) -> list:
    """Block lengths by np.array_split's rule (algorithms/common.block_bounds)."""
    q, r = divmod(count, p)
    return [q + (1 if i < r else 0) for i in range(p)]


def _weighted_blocks(count: int, weights) -> list:
    """Block lengths of hetero_ring.weighted_bounds (cumulative floors;
    equal weights: np.array_split's rule)."""
    if weights is None or all(w == weights[0] for w in weights):
        return _blocks(count, len(weights) if weights else 1)
    cuts = weighted_cuts(count, weights)
    return [b - a for a, b in zip(cuts[:-1], cuts[1:])]


def weighted_cuts(n: int, weights) -> list:
    """Where the blocks of ``n`` elements split when block r gets about
    n weights[r] / sum(weights): cumulative floors, so every rank computes
    the same cuts from the same weights (hetero_ring's partition; kept here,
    in the module without MPI, so that the model prices exactly it)."""
    total = math.fsum(weights)
    cuts, acc = [0], 0.0
    for w in weights[:-1]:
        acc += w
        cuts.append(min(n, int(n * acc / total)))
    cuts.append(n)
    return cuts


def _per_rank(algorithm: str, p: int, count: int, itemsize: int) -> list:
    """[(messages, bytes sent, bytes combined)] of every rank of a ring or
    recursive-doubling all-reduce (the cascade's cross step)."""
    n = count * itemsize
    if p == 1:
        return [(0, 0, 0)]
    if algorithm == "ring" and count >= p:
        b = _blocks(count, p)
        segs = max(1, -(-max(b) // max(1, RING_SEGMENT_BYTES // itemsize)))
        return [((p - 1) * (segs + 1), (2 * count - b[r] - b[(r + 1) % p]) * itemsize,
                 (count - b[(r - 1) % p]) * itemsize) for r in range(p)]
    if algorithm not in ("ring", "recursive_doubling"):
        raise ValueError(f"model: no per-rank terms for {algorithm!r}")
    lg = _pof2(p).bit_length() - 1
    rem = p - _pof2(p)
    out = []
    for r in range(p):
        if r < 2 * rem and r % 2 == 0:  # folded out: sends its vector once, combines nothing
            out.append((1, n, 0))
        else:
            extra = 1 if r < 2 * rem else 0
            out.append((lg + extra, (lg + extra) * n, (lg + extra) * n))
    return out


def _cascade(p: int, count: int, itemsize: int, ppn: int, cross: Optional[str]) -> Terms:
    """The cascade's terms, rank by rank (algorithms/cascade.py's steps)."""
    nodes = [list(range(a, min(a + ppn, p))) for a in range(0, p, ppn)]
    k = max(len(m) for m in nodes)
    shard = _blocks(count, k)
    cross_cache: dict = {}
    most = wire = combined = 0
    for m, members in enumerate(nodes):
        L = len(members)
        for me in range(L):
            msgs = w = c = 0
            for j, sz in enumerate(shard):
                if sz == 0:
                    continue
                if j % L != me:  # intra-node: send it to its owner, later receive it back
                    msgs, w = msgs + 1, w + sz * itemsize
                    continue
                c += (L - 1) * sz * itemsize  # its node's L-1 other copies
                msgs, w = msgs + L - 1, w + (L - 1) * sz * itemsize  # the allgather
                if len(nodes) > 1:
                    name = cross or ("ring" if sz * itemsize >= CASCADE_CROSS_RING_MIN_BYTES else "recursive_doubling")
                    key = (name, sz)
                    if key not in cross_cache:
                        cross_cache[key] = _per_rank(name, len(nodes), sz, itemsize)
                    cm, cw, cc = cross_cache[key][m]
                    msgs, w, c = msgs + cm, w + cw, c + cc
            most, wire, combined = max(most, msgs), max(wire, w), max(combined, c)
    return Terms(most, wire, combined)


def terms(algorithm: str, p: int, nbytes: int, itemsize: int = 4, *,
          segment_bytes: Optional[int] = None, radix: Optional[int] = None, ppn: Optional[int] = None,
          cross: Optional[str] = None, weights=None) -> Terms:
    """M, W, R of ``algorithm`` on ``p`` ranks for an ``nbytes`` message:
    the largest, over the ranks, of the messages a rank sends, the bytes it
    sends and the bytes it combines (exactly what the simulated driver,
    ``mpicoll.counting.simulate``, counts for the algorithm's schedule;
    tests/test_model_counts.py and tests/test_new_algorithms.py hold them
    equal). The other arguments are the algorithms' knobs: ``radix``
    (knomial), ``ppn`` and ``cross`` (cascade: nodes of ``ppn`` consecutive
    ranks; required), ``weights`` (hetero_ring)."""
    if p < 1 or nbytes < 0:
        raise ValueError(f"model: need p >= 1 and nbytes >= 0, got p={p}, nbytes={nbytes}")
    if algorithm == "cascade" and not ppn:
        raise ValueError("model: the cascade's terms need its layout: ppn (ranks per node)")
    if p == 1:
        return Terms(0, 0, 0)
    count = nbytes // itemsize
    n = count * itemsize
    pof2 = _pof2(p)
    lg = pof2.bit_length() - 1
    fold = 1 if p != pof2 else 0
    if algorithm == "ring":
        if count < p:
            return terms("recursive_doubling", p, nbytes, itemsize)
        seg = max(1, (segment_bytes or RING_SEGMENT_BYTES) // itemsize)
        b = _blocks(count, p)
        segs = max(1, -(-max(b) // seg))
        # reduce-scatter: every block but one's own, in segs messages each
        # step; allgather: every block but the right neighbour's.
        wire = max(2 * count - b[r] - b[(r + 1) % p] for r in range(p)) * itemsize
        return Terms((p - 1) * (segs + 1), wire, (count - min(b)) * itemsize)
    if algorithm == "tree":
        most, combined = _tree_counts(p)
        return Terms(most, most * n, combined * n)
    if algorithm == "recursive_doubling":
        # Survivors of the fold send lg times, plus the fold-out once.
        return Terms(lg + fold, (lg + fold) * n, (lg + fold) * n)
    if algorithm == "rabenseifner":
        if count < pof2:
            return terms("recursive_doubling", p, nbytes, itemsize)
        # Every surviving rank at once (numpy over the ranks: p = 4096 is
        # priced thousands of times when a profile's model rules are drawn).
        q, r = divmod(count, pof2)
        start = np.arange(pof2 + 1, dtype=np.int64) * q + np.minimum(np.arange(pof2 + 1), r)
        rem = p - pof2
        me = np.arange(pof2)
        lo, hi = np.zeros(pof2, np.int64), np.full(pof2, pof2, np.int64)
        w, c = np.zeros(pof2, np.int64), np.zeros(pof2, np.int64)
        mask = pof2 >> 1
        while mask:  # halving: send the half given away, combine the half kept
            mid = (lo + hi) // 2
            low = (me & mask) == 0
            klo, khi = np.where(low, lo, mid), np.where(low, mid, hi)
            glo, ghi = np.where(low, mid, lo), np.where(low, hi, mid)
            c += start[khi] - start[klo]
            w += start[ghi] - start[glo]
            lo, hi = klo, khi
            mask >>= 1
        # doubling replays the rounds, sending each round's kept range
        w += c
        extra = np.where(me < rem, n, 0)  # fold region: combine the fold-in, send the fold-out
        wire = max(n if rem else 0, int((w * itemsize + extra).max()))  # a folded-out rank sends its vector once
        combined = int((c * itemsize + extra).max())
        most = 2 * lg + (1 if rem else 0)
        return Terms(most, wire, combined)
    if algorithm == "knomial":
        # As the tree: a rank has the same children in the reduce (combines
        # each) and the bcast (sends to each), and one parent (sends once).
        k = radix or KNOMIAL_RADIX
        most = combined = 0
        for v in range(p):
            children, s = 0, 1
            while s < p and v % (k * s) == 0:
                children += sum(1 for j in range(1, k) if v + j * s < p)
                s *= k
            most = max(most, children + (v != 0))
            combined = max(combined, children)
        return Terms(most, most * n, combined * n)
    if algorithm == "cascade":
        return _cascade(p, count, itemsize, ppn, cross)
    if algorithm == "hetero_ring":
        if count < p:
            return terms("recursive_doubling", p, nbytes, itemsize)
        b = _weighted_blocks(count, list(weights) if weights is not None else [1] * p)
        seg = max(1, (segment_bytes or RING_SEGMENT_BYTES) // itemsize)
        segs = max(1, -(-max(b) // seg))
        wire = max(2 * count - b[r] - b[(r + 1) % p] for r in range(p)) * itemsize
        return Terms((p - 1) * (segs + 1), wire, (count - min(b)) * itemsize)
    if algorithm in NATIVE:
        return terms(mpich_choice(p, nbytes, itemsize), p, nbytes, itemsize)
    raise ValueError(f"model: no cost formula for algorithm {algorithm!r}; known: {', '.join(P2P + SEEDS + NATIVE)}")


def mpich_choice(p: int, nbytes: int, itemsize: int = 4) -> str:
    """What MPICH's MPIR_Allreduce_intra_auto runs for a commutative builtin op."""
    if nbytes <= MPICH_SHORT_MSG or nbytes // itemsize < _pof2(p):
        return "recursive_doubling"
    return "rabenseifner"


def family(algorithm: str) -> str:
    """Which parameter set prices ``algorithm``: ``p2p`` (mpicoll's own
    algorithms), ``mpi`` (MPI_Allreduce through mpicoll's API) or
    ``native`` (MPI_Allreduce called directly)."""
    if algorithm == "MPI_Allreduce":
        return "native"
    return "mpi" if algorithm == "mpi" else "p2p"


class Model(NamedTuple):
    """Fitted parameters per family, and how well they fit."""

    params: Dict[str, Params]
    rms_rel_error: Dict[str, float]

    def predict(self, algorithm: str, p: int, nbytes: int, itemsize: int = 4, *,
                segment_bytes: Optional[int] = None, **knobs) -> float:
        fam = family(algorithm)
        if fam not in self.params:
            raise ValueError(f"model: no fitted parameters for {fam} algorithms ({algorithm})")
        return self.params[fam].time(terms(algorithm, p, nbytes, itemsize, segment_bytes=segment_bytes, **knobs))

    def to_json(self) -> dict:
        return {"params": {k: v._asdict() for k, v in self.params.items()},
                "rms_rel_error": dict(self.rms_rel_error)}

    @classmethod
    def from_json(cls, d: dict) -> "Model":
        try:
            params = {k: Params(**{f: float(v[f]) for f in Params._fields}) for k, v in d["params"].items()}
            err = {k: float(v) for k, v in d.get("rms_rel_error", {}).items()}
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"model: malformed model parameters: {e!r}") from None
        return cls(params, err)


def best(model: Model, p: int, nbytes: int, candidates: Iterable[str], itemsize: int = 4) -> tuple:
    """(predicted seconds, algorithm) of the fastest candidate the model can price."""
    priced = [(model.predict(a, p, nbytes, itemsize), a) for a in candidates
              if (a in P2P or a in NATIVE) and family(a) in model.params]
    if not priced:
        raise ValueError("model: none of the candidates has a cost formula and fitted parameters")
    return min(priced)


if __name__ == "__main__":
    # The command line lives in model_cli.py: it reads tuning profiles, a
    # layer above the model (profile.py holds fitted models).
    from mpicoll.model_cli import main

    raise SystemExit(main())
