"""Reading environment variables on the per-call path.

``os.environ.get`` encodes the key and goes through two Python-level calls
(about 1 us), which is a measurable share of a short all-reduce. CPython on
POSIX keeps the encoded mapping behind ``os.environ`` in ``_data`` and keeps
it in sync on every change through ``os.environ``, so looking there gives
the same answer for a tenth of the cost; elsewhere we fall back to
``os.environ.get``.
"""
from __future__ import annotations

import os
from typing import Optional

_DATA = getattr(os.environ, "_data", None)
_keys = {}


def get(name: str) -> Optional[str]:
    """``os.environ.get(name)``, fast."""
    if _DATA is None:
        return os.environ.get(name)
    key = _keys.get(name)
    if key is None:
        key = _keys[name] = os.environ.encodekey(name)
    value = _DATA.get(key)
    return None if value is None else os.environ.decodevalue(value)
