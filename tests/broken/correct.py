"""Correct but different: other algorithms, orders and declared choices the suite must accept.

Each runs in two dtypes (each one more pass of the suite); between them, every dtype is covered.
DsScaleRounded runs in all four: the rounding it models must be accepted wherever it happens.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Capabilities, Semantics
from attnspec.specs.fields import EVERY_FEATURE  # the definition's every feature: these kernels take all natively

from ._kernels import (
    ALL_DTYPES,
    F64_F32,
    NumpyBackend,
    attention_weights,
    in_dtype,
    resolve_scale,
    softmax_backward,
    store,
    sum_to,
    tiled_attention,
    visible,
    widened,
)
from ._variants import VariantKernel


def _einsum_weights(q, k, mask, is_causal, scale):
    s = np.einsum("...qe,...ke->...qk", q, k) * resolve_scale(q, scale)  # (..., Lq, Lk)
    vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
    s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    row_max = np.max(s, axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1) Lk = 0 too
    e = np.exp(s - np.where(np.isfinite(row_max), row_max, 0))  # (..., Lq, Lk)
    total = np.einsum("...qk->...q", e)[..., None]  # (..., Lq, 1)
    return e / np.where(total == 0, 1, total)  # (..., Lq, Lk)


class EinsumAttention(NumpyBackend):
    """Every contraction an einsum, forward and backward (dS = A ⊙ (dA − rowsum(dA ⊙ A)))."""

    name = "ok-einsum"
    capabilities = Capabilities(dtypes=F64_F32, device="cpu", gradients=True)

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return np.einsum("...qk,...kv->...qv", _einsum_weights(q, k, mask, is_causal, scale), v)  # (..., Lq, Ev)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        sc = resolve_scale(q, scale)
        a = _einsum_weights(q, k, mask, is_causal, scale)  # (..., Lq, Lk)
        dv = np.einsum("...qk,...qv->...kv", a, grad_out)  # (..., Lk, Ev)
        da = np.einsum("...qv,...kv->...qk", grad_out, v)  # (..., Lq, Lk)
        ds = a * (da - np.einsum("...qk,...qk->...q", da, a)[..., None])  # (..., Lq, Lk)
        dq = np.einsum("...qk,...ke->...qe", ds, k) * sc  # (..., Lq, E)
        dk = np.einsum("...qk,...qe->...ke", ds, q) * sc  # (..., Lk, E)
        return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)


def einsum_attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """The same as a plain function with PyTorch's signature: a plug-in that declares nothing."""
    return np.einsum("...qk,...kv->...qv", _einsum_weights(query, key, attn_mask, is_causal, scale), value)


class TiledOnline(NumpyBackend):
    """Flash-style: online softmax over blocks of 7 keys (odd, so tails are the rule); the backward
    recomputes P = exp(S − lse) and uses D = rowsum(dO ⊙ O), never the stored weights."""

    name = "ok-tiled-online-7"
    capabilities = Capabilities(dtypes=("bfloat16", "float64"), device="cpu", gradients=True)
    block = 7

    def native_forward(self, q, k, v, mask, is_causal, scale):
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        return tiled_attention(q, k, v, vis, resolve_scale(q, scale), self.block)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        sc = resolve_scale(q, scale)
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        s = np.where(vis, (q @ np.swapaxes(k, -1, -2)) * sc, -np.inf)  # (..., Lq, Lk)
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
        row_max = np.where(np.isfinite(row_max), row_max, 0)
        row_sum = np.exp(s - row_max).sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        lse = row_max + np.log(np.maximum(row_sum, np.finfo(q.dtype).tiny))  # (..., Lq, 1)
        p = np.exp(s - lse)  # (..., Lq, Lk) exp(-inf) = 0 on masked keys and empty rows
        out = p @ v  # (..., Lq, Ev)
        d = (grad_out * out).sum(axis=-1, keepdims=True)  # (..., Lq, 1) = rowsum(dA ⊙ A)
        dv = np.swapaxes(p, -1, -2) @ grad_out  # (..., Lk, Ev)
        ds = p * (grad_out @ np.swapaxes(v, -1, -2) - d)  # (..., Lq, Lk)
        dq = (ds @ k) * sc  # (..., Lq, E)
        dk = (np.swapaxes(ds, -1, -2) @ q) * sc  # (..., Lk, E)
        return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)


class NaNForFullyMasked(NumpyBackend):
    """PyTorch-math-like softmax that gives NaN on rows with no visible key, and says so."""

    name = "ok-nan-fully-masked"
    capabilities = Capabilities(dtypes=("float16", "float64"), device="cpu", gradients=False)
    semantics = Semantics(fully_masked="nan", causal_alignment="top_left")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = (q @ np.swapaxes(k, -1, -2)) * resolve_scale(q, scale)  # (..., Lq, Lk)
        s = np.where(visible(q.shape[-2], k.shape[-2], mask, is_causal), s, -np.inf)  # (..., Lq, Lk)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(axis=-1, keepdims=True, initial=-np.inf))  # (..., Lq, Lk) NaN on empty rows only
            # normalised after P V, so Lk = 0 (every row empty) gives 0 / 0 = NaN too, as declared
            return (e @ v) / e.sum(axis=-1, keepdims=True)  # (..., Lq, Ev)


class LogSpace(NumpyBackend):
    """Weights as exp(s − lse), lse = m + log Σ exp(s − m): no division; rows sum to 1 only to |lse|·u."""

    name = "ok-log-space"
    capabilities = Capabilities(dtypes=("bfloat16", "float32"), device="cpu", gradients=False)

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = (q @ np.swapaxes(k, -1, -2)) * resolve_scale(q, scale)  # (..., Lq, Lk)
        s = np.where(visible(q.shape[-2], k.shape[-2], mask, is_causal), s, -np.inf)  # (..., Lq, Lk)
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1) -inf on empty rows
        row_max = np.where(np.isfinite(row_max), row_max, 0)
        with np.errstate(divide="ignore"):  # empty rows: log(0) = -inf, as it should be
            lse = row_max + np.log(np.exp(s - row_max).sum(axis=-1, keepdims=True))  # (..., Lq, 1)
        w = np.exp(s - np.where(np.isfinite(lse), lse, 0))  # (..., Lq, Lk) empty rows: exp(-inf) = 0
        return w @ v  # (..., Lq, Ev)


class Float32Internal(NumpyBackend):
    """16-bit in, 16-bit out, a 32-key online softmax in float32 in between (what real kernels do)."""

    name = "ok-float32-internal"
    capabilities = Capabilities(dtypes=("float16", "bfloat16"), device="cpu", gradients=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", notes=("softmax runs in float32",))

    def native_forward(self, q, k, v, mask, is_causal, scale):
        q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))  # (NumpyBackend widened 16-bit already)
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        return tiled_attention(q32, k32, v32, vis, resolve_scale(q32, scale), block=32)  # (..., Lq, Ev)


# ---- the variants: the same problem computed other ways (tests/broken/_variants.py) -----------

def _everything(*dtypes: str) -> Capabilities:
    return Capabilities(dtypes=dtypes, device="cpu", gradients=True, features=EVERY_FEATURE, bias_gradient=True)


class GqaRepeatKv(VariantKernel):
    """Every field; grouped heads by repeating K and V per query head (PyTorch's repeat_interleave);
    the mask and the window by selection, where(visible, s, -inf)."""

    name = "ok-gqa-repeat-kv"
    gqa_by, hide_by = "repeat", "select"
    capabilities = _everything("float16", "float64")


class GqaGroupedQueries(VariantKernel):
    """Every field; grouped heads by grouping the queries, (Hkv, group) against each KV head with no
    copy of K/V (JAX's reshape); the mask and the window as a 0/-inf additive bias."""

    name = "ok-gqa-grouped-queries"
    gqa_by, hide_by = "group", "bias"
    capabilities = _everything("bfloat16", "float32")


class DsScaleRounded(NumpyBackend):
    """A backward that rounds dS * scale to the input dtype before dQ = (dS scale) K and
    dK = (dS scale)^T Q, the products accumulated in float32: a common kernel choice (a Triton
    FlashAttention's float16 backward, "to reduce register pressure").  A dS * scale below half
    the format's smallest subnormal vanishes, so dK (and dQ) lose up to half a subnormal step
    times |Q| (|K|) per entry: the error budget's floor carries it (specs/error_budget.py)."""

    name = "ok-ds-scale-rounded"
    capabilities = Capabilities(dtypes=ALL_DTYPES, device="cpu", gradients=True)

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return attention_weights(q, k, mask, is_causal, scale) @ v  # (..., Lq, Ev)

    def native_attention_backward(self, q, k, v, grad_out, call):
        q, k, v, grad_out = widened(q, k, v, grad_out)
        a = attention_weights(q, k, call.mask, call.is_causal, call.scale)  # (..., Lq, Lk)
        ds, dv = softmax_backward(a, v, grad_out)  # (..., Lq, Lk), (..., Lk, Ev)
        ds = in_dtype(ds * resolve_scale(q, call.scale), call.dtype)  # (..., Lq, Lk) the rounding
        dq = ds @ k  # (..., Lq, E)
        dk = np.swapaxes(ds, -1, -2) @ q  # (..., Lk, E)
        return tuple(store(sum_to(g, x.shape), call.dtype) for g, x in ((dq, q), (dk, k), (dv, v)))


# ---- issue 31: conventions, declared ------------------------------------------------------------

def _lse(*dtypes: str, gradients: bool = False) -> Capabilities:
    return Capabilities(dtypes=dtypes, device="cpu", gradients=gradients, features=frozenset(("lse",)))


class LseBase2Declared(VariantKernel):
    """Returns log2-sum-exp2 and says so (FlashInfer's convention): judged as declared."""

    name = "ok-lse-base2-declared"
    lse_base = "2"
    capabilities = _lse("bfloat16")
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", lse_base="2")


class EmptyLsePlusInf(VariantKernel):
    """An empty row's LSE +inf, declared (FA2); its merge takes +inf as empty, as vLLM's maps inf to -inf."""

    name = "ok-empty-lse-plus-inf"
    empty_lse = "+inf"
    capabilities = _lse("float32", "float16")
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", empty_lse="+inf")

    def native_merge(self, o_a, lse_a, o_b, lse_b):
        la, lb = (np.where(x == np.inf, -np.inf, x) for x in (lse_a, lse_b))  # (..., Lq) empty: -inf
        lse = np.logaddexp(la, lb)  # (..., Lq)
        ref = np.where(np.isfinite(lse), lse, 0)
        wide = [x.astype(np.float32) if x.dtype == np.float16 else x for x in (o_a, o_b)]
        out = wide[0] * np.exp(la - ref)[..., None] + wide[1] * np.exp(lb - ref)[..., None]  # (..., Lq, Ev)
        return out.astype(o_a.dtype), np.where(lse == -np.inf, np.inf, lse)


class KnobBlockSize(VariantKernel):
    """A block-size knob over an online-softmax loop that keeps the last partial block; declares a
    deterministic backward and batch invariance (NumPy's loops are both)."""

    name = "ok-knob-block-size"
    capabilities = _lse("float64", gradients=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros",
                          deterministic=True, batch_invariant=True)
    knobs = {"block_size": (1, 4, 16)}

    def native_attention(self, q, k, v, call):
        block = (call.knobs or {}).get("block_size", 1)
        if block == 1 or call.return_lse or call.enable_gqa:
            return super().native_attention(q, k, v, call)
        q, k, v = widened(q, k, v)
        vis = visible(q.shape[-2], k.shape[-2], call.mask, call.is_causal)  # (..., Lq, Lk)
        return store(tiled_attention(q, k, v, vis, resolve_scale(q, call.scale), block), call.dtype)


class MergeStatesOnline(VariantKernel):
    """A list merge (FA3's flash_attn_combine) done online, one split at a time: a running max, the sum and
    the output rescaled as it grows (the attention recurrence over splits), in float32; different from
    the max-first merges, and right: every split once, all-empty rows (0, -inf)."""

    name = "ok-merge-states-online"
    capabilities = _lse("bfloat16", "float64")

    def native_merge_states(self, o_parts, lse_parts):
        wide = np.float64 if o_parts.dtype == np.float64 else np.float32
        m = np.full(lse_parts.shape[1:], -np.inf, dtype=wide)  # (..., Lq) running max
        total = np.zeros(lse_parts.shape[1:], dtype=wide)  # (..., Lq) running sum
        acc = np.zeros(o_parts.shape[1:], dtype=wide)  # (..., Lq, Ev)
        for o, lse in zip(o_parts.astype(wide), lse_parts.astype(wide), strict=True):
            m_new = np.maximum(m, lse)  # (..., Lq)
            shift = np.where(np.isfinite(m_new), m_new, 0)  # nothing seen yet: exp(-inf - 0) = 0
            alpha, w = np.exp(m - shift), np.exp(lse - shift)  # (..., Lq) each
            total = total * alpha + w
            acc = acc * alpha[..., None] + o * w[..., None]
            m = m_new
        shift = np.where(np.isfinite(m), m, 0)
        with np.errstate(divide="ignore"):
            lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1)), -np.inf)  # (..., Lq)
        out = acc / np.where(total > 0, total, 1)[..., None]  # (..., Lq, Ev)
        return store(out, "float64" if wide is np.float64 else "bfloat16"), lse
