"""Plain functions taking fp8 inputs with descales, as a kernel author's twins would be (issue 31).

``sdpa_quantized``: NumPy over ml_dtypes' fp8 arrays, PyTorch's signature plus the descales of
``torch.nn.attention.experimental._scaled_dot_product_attention_quantized`` (q_descale, k_descale,
v_descale, (B, Hkv) float32): what its FA3 backend computes - float32 accumulation, P = exp(s - max)
rounded to the input's fp8 format before P V, the row sum from P before rounding, V's descale on the
output, bfloat16 out.  ``sdpa_fp8_kv``: FlashInfer's fp8 KV cache - q in bfloat16, K and V fp8 with one
``k_scale``, ``v_scale`` per tensor (its names), P rounded to bfloat16 (its second GEMM's 16-bit
operand), bfloat16 out.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from attnspec.backends import declare

_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _per_head(d, heads: int):
    """(B, Hkv) -> (B, heads, 1, 1) float32, a query group sharing its KV head's; a scalar as is."""
    d = np.asarray(d, dtype=np.float32)
    if d.ndim == 0:
        return d
    return np.repeat(d, heads // d.shape[-1], axis=-1)[..., None, None]


def _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa, p_type):
    """float32 scores of q, k (already times their descales), P rounded to p_type, (out, row sums)."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k, v = (np.repeat(x, q.shape[-3] // x.shape[-3], axis=-3) for x in (k, v))  # (..., Hq, Lk, ·)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(scale)  # (..., Lq, Lk) float32
    Lq, Lk = s.shape[-2:]
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf) if attn_mask.dtype == bool else s + attn_mask.astype(np.float32)
    if is_causal:
        s = np.where(np.arange(Lk)[None, :] <= np.arange(Lq)[:, None], s, -np.inf)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
    p = np.exp(s - np.where(np.isfinite(top), top, 0)).astype(np.float32)  # (..., Lq, Lk) P <= 1
    total = p.sum(axis=-1, keepdims=True)  # (..., Lq, 1) from P before rounding
    p_rounded = p.astype(p_type).astype(np.float32)  # P as the second GEMM takes it
    out = (p_rounded @ v.astype(np.float32)) / np.where(total == 0, 1, total)  # (..., Lq, Ev)
    return out


@declare(dtypes=_FP8, output_dtypes={d: "bfloat16" for d in _FP8}, p_dtypes={d: d for d in _FP8})
def sdpa_quantized(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                   q_descale=None, k_descale=None, v_descale=None):
    """PyTorch's quantised SDPA (FA3) as NumPy: fp8 q, k, v, (B, Hkv) descales, bfloat16 out."""
    fp8 = query.dtype
    q = query.astype(np.float32) * (1 if q_descale is None else _per_head(q_descale, query.shape[-3]))
    k = key.astype(np.float32) * (1 if k_descale is None else _per_head(k_descale, key.shape[-3]))
    out = _attention(q, k, value.astype(np.float32), attn_mask, is_causal, scale, enable_gqa, fp8)
    if v_descale is not None:
        out = out * _per_head(v_descale, out.shape[-3])  # (..., Hq, Lq, Ev)
    return out.astype(ml_dtypes.bfloat16)


@declare(dtypes=_FP8, output_dtypes={d: "bfloat16" for d in _FP8}, p_dtypes={d: "bfloat16" for d in _FP8},
         fp8_query="bfloat16", descale_granularity="tensor")
def sdpa_fp8_kv(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                k_scale=None, v_scale=None):
    """FlashInfer's fp8 KV cache as NumPy: bfloat16 q, fp8 K/V, k_scale folded into the softmax scale,
    v_scale on the output (one each per tensor), P rounded to bfloat16, bfloat16 out."""
    scale = (1.0 / np.sqrt(query.shape[-1]) if scale is None else scale) * (1.0 if k_scale is None else float(k_scale))
    out = _attention(query.astype(np.float32), key.astype(np.float32), value.astype(np.float32), attn_mask,
                     is_causal, scale, enable_gqa, ml_dtypes.bfloat16)
    out = out * (1.0 if v_scale is None else np.float32(v_scale))
    return out.astype(ml_dtypes.bfloat16)
