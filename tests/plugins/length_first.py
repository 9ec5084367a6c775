"""Backends that take (..., L, H, E) - the length axis before the heads, as Keras, Flax and
flash-attn do - declared with `length_before_heads`: numpy-naive's kernel behind a swap that
such a kernel never makes, and one that declares the order but computes as if it were (..., H, L, E)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive

# the padded call only: the order governs q, k, v of the padded call, and numpy-naive's packed and paged
# calls gather into its own padded call (the formats' arrays have layouts of their own: specs/formats.py)
PADDED_ONLY = replace(NumpyNaive.capabilities, formats=("padded",))


def _heads_first(x):  # (..., L, H, E) -> (..., H, L, E); rank 2 has no head axis
    return np.swapaxes(x, -3, -2) if x.ndim >= 3 else x


class LengthFirst(NumpyNaive):
    name = "numpy-length-first"
    capabilities = PADDED_ONLY
    length_before_heads = True
    seen: list = []  # the q shapes its calls were handed, oldest first

    def native_attention(self, q, k, v, call):
        self.seen.append(q.shape)
        out = super().native_attention(_heads_first(q), _heads_first(k), _heads_first(v), call)
        return tuple(_heads_first(x) if i == 0 else x for i, x in enumerate(out)) if isinstance(out, tuple) \
            else _heads_first(out)

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(*(_heads_first(x) for x in (q, k, v, grad_out)), call)
        return tuple(_heads_first(g) if i < 3 else g for i, g in enumerate(grads))


class LengthFirstMixesAxes(NumpyNaive):
    """Declares (..., L, H, E) but computes on the arrays as if they were (..., H, L, E): each length
    position's heads attend to one another.  Its outputs have the declared shapes."""

    name = "broken-length-first-mixes-axes"
    capabilities = PADDED_ONLY
    length_before_heads = True
