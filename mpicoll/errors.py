"""Exceptions mpicoll raises beyond the built-in TypeError/ValueError.

``MismatchError``: the ranks of a communicator called the same collective
with arguments that do not agree (element count, dtype, op, algorithm,
root, block counts, or a different collective altogether). It is a
``ValueError`` because, like any bad argument, it is the caller's input
that is wrong - only the evidence is spread over several ranks.
"""
from __future__ import annotations


class MismatchError(ValueError):
    """Ranks disagree on a collective's arguments.

    ``field`` names the first argument found to differ ("count", "dtype",
    ...), ``values`` maps each value seen to the ranks that passed it (a
    dict ``{value: [ranks]}``), empty when only one rank could see the
    disagreement (a receive-size check; see ``mpicoll.check``).
    """

    def __init__(self, message: str, field: str = "", values=None):
        super().__init__(message)
        self.field = field
        self.values = dict(values or {})
