"""Building blocks shared by the algorithms: block partitions and the
non-power-of-two fold.

Messages are raw bytes: algorithms move storage arrays whose real element
type only the kernels need to know (float16 and bfloat16 have no MPI
datatype). Sending, receiving, tags and size checks are the drivers'
(``mpicoll.schedule``), the same for every algorithm.
"""
from __future__ import annotations

import functools


def block_bounds(n: int, p: int) -> list:
    """[(start, stop)] of ``p`` blocks of ``n`` elements, np.array_split's
    convention: the first ``n % p`` blocks hold one element more."""
    q, r = divmod(n, p)
    bounds = []
    start = 0
    for i in range(p):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def split_range(start: int, stop: int, pieces: int) -> list:
    """[start, stop) cut into ``pieces`` ranges by block_bounds' convention
    (pipeline segments of one block: sender and receiver cut a block the
    same way as long as ``pieces`` is the same on both)."""
    return [(start + a, start + b) for a, b in block_bounds(stop - start, pieces)]


def counts_to_bounds(counts) -> list:
    bounds = []
    start = 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return bounds


class Fold:
    """Reduce a communicator of any size to a power of two and back.

    The standard fold-in (Thakur, Rabenseifner & Gropp 2005): with
    ``pof2`` the largest power of two <= p and ``rem = p - pof2``, each
    even rank below ``2*rem`` hands its vector to the odd rank above it,
    which combines them (lower rank first) and takes part for both; the
    even ranks sit out and get the result back at the end. The survivors
    are renumbered 0..pof2-1 in rank order (``newrank``), so "lower
    newrank" still means "lower ranks" when combining.

    Cost: one extra send of the whole vector before and after (2 n beta
    plus n gamma) on ``2*rem`` ranks; nothing when p is a power of two.
    ``fold_in``/``fold_out`` are schedule fragments: ``yield from`` them.
    """

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def of(rank: int, size: int) -> "Fold":
        """The (immutable) fold of ``rank`` in a communicator of ``size``, cached."""
        return Fold(rank, size)

    def __init__(self, rank: int, size: int):
        self.pof2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.pof2
        if rank < 2 * self.rem:
            self.newrank = -1 if rank % 2 == 0 else rank // 2
        else:
            self.newrank = rank - self.rem
        self.rank = rank

    def real(self, newrank: int) -> int:
        """The communicator rank of a survivor's new rank."""
        return newrank * 2 + 1 if newrank < self.rem else newrank + self.rem

    def fold_in(self, ctx, buf, red):
        if self.rank >= 2 * self.rem:
            return
        ctx.phase = "fold-in"
        if self.newrank < 0:
            yield [ctx.send(buf, self.rank + 1)]
        else:
            tmp = ctx.scratch("fold", buf.size, buf.dtype)
            yield [ctx.recv(tmp, self.rank - 1)]
            red.combine(buf, tmp, buf)

    def fold_out(self, ctx, buf):
        if self.rank >= 2 * self.rem:
            return
        ctx.phase = "fold-out"
        if self.newrank < 0:
            yield [ctx.recv(buf, self.rank + 1)]
        else:
            yield [ctx.send(buf, self.rank - 1)]
