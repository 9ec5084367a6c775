"""A memo keyed by content, for the budget functions: the fixed grids hand every backend the same problems.

`specs.error_budget`'s row budgets are pure functions of a problem's numbers (its arrays, fields, the
dtype and the rule), and the shape grids (`properties/test_edges.py`) give each backend of a run, in
each dtype, the same problems: one process checking several backends computed each budget once a
backend.  The key is the content itself - every array's shape, dtype and bytes, every scalar's repr
(so -0.0 and 0.0 stay apart, and NaN meets NaN, as the arithmetic sees them), all of it one SHA-256 -
so a hit returns what the same call would compute, never a neighbour's answer.  Values are stored
read-only (lists as tuples); what cannot be keyed (an object array, an ndarray subclass, an unknown
type) is computed every time.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict

import numpy as np

_SCALARS = (bool, int, float, str, bytes, type(None), np.generic)


class Unkeyable(Exception):
    """A value the memo cannot key by content (then the call is not memoised)."""


def content_key(x):
    """A hashable key that two values share only if the budget functions read them alike."""
    if isinstance(x, np.ndarray):
        if type(x) is not np.ndarray or x.dtype.hasobject:
            raise Unkeyable(type(x))
        digest = hashlib.sha256(np.ascontiguousarray(x).view(np.uint8)).digest()
        # the dtype itself, not its .str: ml_dtypes' float8 formats all read '<V1', bfloat16 '<V2'
        return ("array", x.shape, x.dtype, digest)
    if isinstance(x, _SCALARS):
        return (type(x).__name__, repr(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(content_key(i) for i in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, content_key(v)) for k, v in sorted(x.items()))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__qualname__,) + tuple((f.name, content_key(getattr(x, f.name))) for f in dataclasses.fields(x))
    raise Unkeyable(type(x))


def _frozen(value):
    """The value with its arrays read-only and its lists tuples (a caller that writes into a shared
    result fails loudly)."""
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


ENTRY_BYTES = 1024  # what an entry holds besides its arrays (its digest, tuples, array headers), charged generously


def _size(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_size(i) for i in value)
    return 0


class ContentMemo:
    """Least recently used results, up to `max_bytes` held (their arrays, plus ENTRY_BYTES an entry)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.held = max_bytes, 0
        self._items: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def __call__(self, fn, *key_parts):
        """fn() for this content, computed once while it stays held."""
        try:
            key = hashlib.sha256(repr(content_key(key_parts)).encode()).digest()  # 32 bytes held, not the parts
        except Unkeyable:
            return fn()
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key][0]
        self.misses += 1
        value = _frozen(fn())
        size = _size(value) + ENTRY_BYTES
        if size <= self.max_bytes:
            self._items[key] = (value, size)
            self.held += size
            while self.held > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.held -= dropped
        return value
