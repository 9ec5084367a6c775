"""Planted backends for the harness's tests of the suite: each with one bug the suite must report
(and reproduce) as the tests in tests/test_suite_*.py expect.

- `ValuesOfTheNextSlice`: (batch, KV head) slice i reads the values of slice i + 1 (a pointer off by
  one slice): the structure family's batch-head independence fails.
- `AfterReshape`: keeps state - a call whose shapes differ from the previous call's gets its last
  query row shifted by one (a scratch buffer sized for the previous shape); it declines Ev != E
  (Unsupported), so a reproducer's replay of earlier calls meets declined calls too.
- `gqa_raises`: a plain function with PyTorch's full signature that raises whenever key has fewer
  heads than query (a grouped-heads path that crashes): every failure needs grouped KV heads.
- `float32_inside_top_left`: top-left causal, correct, but computing float64 input in float32.
- `drops_causal_for_one_row`: drops is_causal when the query has one row (transformers' SDPA path
  does: ``is_causal = query.shape[2] > 1 and ...``), declared top-left.
- `raises_at_no_keys` / `raises_at_no_keys_declared_zeros`: raise when Lk = 0.
- `records_calls`: records each call's keywords (what a plain function is handed).
- `LeaksPaddingNaNDeclaredSameName`: tests.plugins.deviating.LeaksPaddingNaN, its leak declared.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends import declare
from attnspec.backends.base import Backend, Capabilities, Deviation, Semantics, Unsupported
from attnspec.backends.numpy_backends import NumpyNaive
from tests.plugins.deviating import LeaksPaddingNaN

_NAIVE = NumpyNaive()


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Correct attention over NumPy arrays in their dtype: top-left causal; a float mask is added;
    a row that sees nothing gives zeros; Lk = 0 gives zeros."""
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    s = (query @ np.swapaxes(key, -1, -2)) * query.dtype.type(scale)  # (..., Lq, Lk)
    Lq, Lk = s.shape[-2:]
    vis = np.ones((Lq, Lk), dtype=bool)  # (Lq, Lk)
    if attn_mask is not None and attn_mask.dtype == bool:
        vis = vis & attn_mask  # (..., Lq, Lk)
    elif attn_mask is not None:
        s = s + attn_mask.astype(s.dtype)  # (..., Lq, Lk) a float mask: added
    if is_causal:
        vis = vis & np.tri(Lq, Lk, dtype=bool)  # (..., Lq, Lk)
    s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))  # (..., Lq, Lk)
    total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    return (e / np.where(total == 0, 1, total)) @ value  # (..., Lq, Ev)


# ---- structure -----------------------------------------------------------------------------------

class ValuesOfTheNextSlice(NumpyNaive):
    """The value pointer advanced one (batch, KV head) slice too far, wrapping round: slice i reads the
    values of slice i + 1.  Changing one slice's values changes another slice's output."""

    name = "planted-values-of-the-next-slice"
    capabilities = Capabilities(dtypes=("float64",), device="cpu")
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def native_attention(self, q, k, v, call):
        if v.ndim == 4 and v.shape[0] * v.shape[1] > 1:
            B, H, Lk, Ev = v.shape
            v = np.roll(v.reshape(B * H, Lk, Ev), -1, axis=0).reshape(v.shape)  # (B, Hkv, Lk, Ev) slice i + 1's
        return super().native_attention(q, k, v, call)


# ---- state kept between calls ---------------------------------------------------------------------

class AfterReshape(Backend):
    """Right for the first call of a process and for a call of the previous call's shapes; a call of
    other shapes gets its last query row shifted by one (a stale scratch buffer).  Declines Ev != E."""

    name = "planted-after-reshape"
    capabilities = Capabilities(dtypes=("float64",), device="cpu")
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def __init__(self):
        self.before = None

    def native_forward(self, q, k, v, mask, is_causal, scale):
        if v.shape[-1] != q.shape[-1]:
            raise Unsupported("planted-after-reshape needs Ev == E")
        out = np.array(_NAIVE.native_forward(q, k, v, mask, is_causal, scale))  # (..., Lq, Ev)
        shapes = (q.shape, k.shape, v.shape)
        if self.before is not None and shapes != self.before:
            out[..., -1, :] += 1.0  # (..., Ev) the stale buffer
        self.before = shapes
        return out


# ---- grouped heads that crash ---------------------------------------------------------------------

@declare(dtypes=("float64",), fully_masked="zeros", causal_alignment="top_left")
def gqa_raises(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's full signature (so: grouped heads and float masks); the grouped path raises."""
    if key.shape[-3] != query.shape[-3]:
        raise RuntimeError(f"grouped path not built: {query.shape[-3]} query heads, {key.shape[-3]} KV heads")
    return attention(query, key, value, attn_mask, is_causal, scale)


# ---- semantics ------------------------------------------------------------------------------------

@declare(dtypes=("float64", "float32"), fully_masked="zeros", causal_alignment="top_left")
def float32_inside_top_left(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Top-left causal and right, but float64 input is computed in float32 (and cast back)."""
    dtype = query.dtype
    q, k, v = (x.astype(np.float32) for x in (query, key, value))
    return attention(q, k, v, attn_mask, is_causal, scale).astype(dtype)


@declare(dtypes=("float64", "float32"), fully_masked="zeros", causal_alignment="top_left")
def drops_causal_for_one_row(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """transformers' SDPA integration: ``is_causal = query.shape[2] > 1 and ...`` - a one-row query
    (a decode step) is computed without the causal mask, i.e. bottom-right for Lq = 1."""
    return attention(query, key, value, attn_mask, is_causal and query.shape[-2] > 1, scale)


def raises_at_no_keys(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Raises for Lk = 0 (a reduction over no keys), right otherwise; declares nothing."""
    if key.shape[-2] == 0:
        raise ValueError("zero-size reduction over the keys")
    return attention(query, key, value, attn_mask, is_causal, scale)


@declare(dtypes=("float64", "float32"), fully_masked="zeros", causal_alignment="top_left")
def raises_at_no_keys_declared_zeros(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return raises_at_no_keys(query, key, value, attn_mask, is_causal, scale)


CALLS: list = []  # (is_causal, attn_mask dtype or None, attn_mask) of each call of `records_calls`


@declare(dtypes=("float64",), fully_masked="zeros", causal_alignment="top_left")
def records_calls(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Right (full signature: takes a float mask, the suite's bias); notes what it is handed."""
    CALLS.append((is_causal, None if attn_mask is None else attn_mask.dtype, attn_mask))
    if key.shape[-3] != query.shape[-3]:
        g = query.shape[-3] // key.shape[-3]
        key, value = np.repeat(key, g, axis=-3), np.repeat(value, g, axis=-3)
    return attention(query, key, value, attn_mask, is_causal, scale)


# ---- declared deviations --------------------------------------------------------------------------


class LeaksPaddingNaNDeclaredSameName(LeaksPaddingNaN):
    """tests.plugins.deviating.LeaksPaddingNaN with its leak declared, under the same name: with one
    --hypothesis-seed both draw the very same problems (each test's seed derives from its id)."""

    name = "leaks-padding-nan"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", deviations=(
        Deviation("nan_in_padding_changes_nothing", "reads padded values: 0 * NaN reaches the output"),))
