"""Plain functions with attention sinks, as a kernel author's reference twins would be (issue 31).

``sdpa_sinks``: NumPy, PyTorch's signature plus FlashInfer's ``sinks`` and ``return_lse``; the sink
concatenated as one more column and dropped after the softmax (gpt-oss's torch reference), the LSE
with it (declared); its backward returns (dq, dk, dv, dsink).  ``fa4_sinks``: torch, flash-attention
4's name ``learnable_sink`` and its softcap; the backward is autograd.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends import declare


def _weights(query, key, attn_mask, is_causal, scale, enable_gqa, sinks):
    """(weights (..., Lq, Lk), the sink's weight (..., Lq, 1), lse (..., Lq), key expanded)."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = np.repeat(key, query.shape[-3] // key.shape[-3], axis=-3)  # (..., Hq, Lk, E)
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    s = (query @ np.swapaxes(key, -1, -2)) * query.dtype.type(scale)  # (..., Lq, Lk)
    Lq, Lk = s.shape[-2:]
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf) if attn_mask.dtype == bool else s + attn_mask
    if is_causal:
        s = np.where(np.arange(Lk)[None, :] <= np.arange(Lq)[:, None], s, -np.inf)
    sink = np.full(s.shape[:-1] + (1,), -np.inf, s.dtype) if sinks is None else \
        np.broadcast_to(sinks.astype(s.dtype)[:, None, None], s.shape[:-1] + (1,))  # (..., Lq, 1)
    z = np.concatenate([s, sink], axis=-1)  # (..., Lq, Lk + 1) the sink as one more key
    top = z.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    e = np.exp(z - top)
    total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    w = e / np.where(total == 0, 1, total)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, top[..., 0] + np.log(np.where(total[..., 0] > 0, total[..., 0], 1)), -np.inf)
    return w[..., :-1], w[..., -1:], lse, key


def _grouped(x, query, enable_gqa):
    return np.repeat(x, query.shape[-3] // x.shape[-3], axis=-3) if enable_gqa and x.shape[-3] != query.shape[-3] else x


def _summed(g, like):
    """(..., Hq, L, D) -> like's head count: each group of query heads summed."""
    if g.shape[-3] == like.shape[-3]:
        return g
    return g.reshape(g.shape[:-3] + (like.shape[-3], g.shape[-3] // like.shape[-3]) + g.shape[-2:]).sum(axis=-3)


def sdpa_sinks_backward(query, key, value, grad_out, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                        sinks=None, return_lse=False):
    w, p_sink, _, k = _weights(query, key, attn_mask, is_causal, scale, enable_gqa, sinks)
    v = _grouped(value, query, enable_gqa)
    out = w @ v  # (..., Lq, Ev)
    d = (grad_out * out).sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    ds = w * (grad_out @ np.swapaxes(v, -1, -2) - d)  # (..., Lq, Lk)
    sc = query.dtype.type(1.0 / np.sqrt(query.shape[-1]) if scale is None else scale)
    dq, dk, dv = (ds @ k) * sc, (np.swapaxes(ds, -1, -2) @ query) * sc, np.swapaxes(w, -1, -2) @ grad_out
    grads = (dq, _summed(dk, key), _summed(dv, value))
    if sinks is None:
        return grads
    dsink = -(p_sink * d)[..., 0]  # (..., Hq, Lq)
    return grads + (dsink.reshape(-1, *dsink.shape[-2:]).sum(axis=(0, 2)),)


@declare(dtypes=("float64", "float32"), backward=sdpa_sinks_backward, fully_masked="zeros", lse_with_sinks=True)
def sdpa_sinks(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, sinks=None,
               return_lse=False):
    w, _, lse, _ = _weights(query, key, attn_mask, is_causal, scale, enable_gqa, sinks)
    out = w @ _grouped(value, query, enable_gqa)  # (..., Lq, Ev)
    return (out, lse) if return_lse else out


def _fa4(q, k, v, attn_mask=None, is_causal=False, scale=None, learnable_sink=None, softcap=None, return_lse=False):
    import torch
    s = (q.float() @ k.float().transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)  # (B, H, Lq, Lk)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    if is_causal:
        Lq, Lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).triu(1), float("-inf"))
    sink = torch.full(s.shape[:-1] + (1,), float("-inf")) if learnable_sink is None else \
        learnable_sink.float()[:, None, None].expand(*s.shape[:-1], 1)  # (B, H, Lq, 1)
    z = torch.cat([s, sink], dim=-1)  # (B, H, Lq, Lk + 1)
    lse = torch.logsumexp(z, dim=-1)  # (B, H, Lq) with the sink, as FA4 returns it
    p = torch.exp(z - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])[..., :-1]  # (B, H, Lq, Lk)
    out = (p @ v.float()).to(q.dtype)
    return (out, lse) if return_lse else out


fa4_sinks = declare(_fa4, framework="torch", dtypes=("float16", "bfloat16", "float32"), fully_masked="zeros",
                    lse_with_sinks=True)
