"""flash-attention's serving entry points written in torch, as a kernel author's reference twin would be:
``flash_attn_varlen_func`` (packed, cu_seqlens) and ``flash_attn_with_kvcache`` (paged, appends k/v in
place), declared ``framework="torch"`` - torch CPU tensors here, a CUDA kernel's on a GPU.  Per
sequence, bottom-right aligned at the sequence's own lengths, float32 inside for 16-bit inputs (as
flash-attention accumulates).  torch is imported when the module is (a plug-in's own choice).
"""
from __future__ import annotations

import torch

from attnspec.backends import declare

DTYPES = ("float16", "bfloat16", "float32")


def _attend(q, k, v, scale, causal, window, softcap, alibi, sinks=None):
    """One sequence: q (Lq, Hq, E), k (Lk, Hkv, E), v (Lk, Hkv, Ev) -> out (Lq, Hq, Ev), lse (Hq, Lq);
    sinks (Hq,): a logit per head in the denominator, counted in the LSE (FA4's learnable_sink)."""
    Lq, Hq, _ = q.shape
    Lk, Hkv = k.shape[:2]
    kk, vv = (x.float().repeat_interleave(Hq // max(Hkv, 1), dim=1) for x in (k, v))  # (Lk, Hq, D)
    s = torch.einsum("qhe,khe->hqk", q.float(), kk) * scale  # (Hq, Lq, Lk)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq)  # (Lq, 1) query positions, bottom-right
    j = torch.arange(Lk, device=q.device)[None, :]  # (1, Lk)
    if alibi is not None:
        s = s - alibi.float()[:, None, None] * (i - j).abs()
    left, right = window
    right = 0 if causal else right
    keep = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device)  # (Lq, Lk)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None, None].expand(Hq, Lq, 1)], dim=-1)  # (Hq, Lq, Lk + 1)
    lse = torch.logsumexp(s, dim=-1)  # (Hq, Lq): -inf for a row that sees nothing
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])  # (Hq, Lq, Lk[+1]), 0 where hidden
    p = p[..., :Lk]  # (Hq, Lq, Lk): the sink's weight goes to no value
    return torch.einsum("hqk,khd->qhd", p, vv), lse  # (Lq, Hq, Ev), (Hq, Lq)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attention 2's padded signature: q (B, Lq, Hq, E), k/v (B, Lk, Hkv, E) -> (B, Lq, Hq, Ev), with
    return_attn_probs (out, lse (B, Hq, Lq), None) as flash-attention 2 returns them (its S_dmask: dropout's)."""
    assert dropout_p == 0.0, "no dropout in a conformance run"
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(q.shape[:3] + v.shape[-1:], dtype=torch.float32, device=q.device)  # (B, Lq, Hq, Ev)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), device=q.device)  # (B, Hq, Lq)
    for b in range(q.shape[0]):
        out[b], lse[b] = _attend(q[b], k[b], v[b], scale, causal, window_size, softcap, alibi_slopes)
    out = out.to(q.dtype)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           return_softmax_lse=False, learnable_sink=None):
    """q (total_q, Hq, E), k/v (total_k, Hkv, E), cu_seqlens_* (B+1,) int32 tensors; learnable_sink (Hq,)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(q.shape[:2] + v.shape[-1:], dtype=torch.float32, device=q.device)  # (total_q, Hq, Ev)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)  # (Hq, total_q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    for b in range(len(cq) - 1):
        k1 = ck[b + 1] if used is None else ck[b] + used[b]
        if cq[b + 1] > cq[b]:
            o, l_ = _attend(q[cq[b]:cq[b + 1]], k[ck[b]:k1], v[ck[b]:k1], scale, causal, window_size, softcap,
                            alibi_slopes, learnable_sink)
            out[cq[b]:cq[b + 1]], lse[:, cq[b]:cq[b + 1]] = o, l_
    out = out.to(q.dtype)
    return (out, lse) if return_softmax_lse else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, return_softmax_lse=False):
    """q (B, Lq, Hq, E); paged caches (num_pages, page_size, Hkv, D) with block_table (B, max_pages);
    k, v (B, n, Hkv, D) appended in place at cache_seqlens first."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    B, P = q.shape[0], k_cache.shape[1]
    lens = cache_seqlens.tolist()
    if k is not None:
        for b in range(B):
            for t in range(k.shape[1]):
                j = lens[b] + t
                page = int(block_table[b, j // P])
                k_cache[page, j % P], v_cache[page, j % P] = k[b, t], v[b, t]
        lens = [n + k.shape[1] for n in lens]
    starts = [0] * B if cache_leftpad is None else cache_leftpad.tolist()
    out = torch.zeros(q.shape[:3] + v_cache.shape[-1:], dtype=torch.float32, device=q.device)  # (B, Lq, Hq, Ev)
    lse = torch.full((B, q.shape[2], q.shape[1]), float("-inf"), device=q.device)  # (B, Hq, Lq)
    for b in range(B):
        j = torch.arange(starts[b], lens[b], device=q.device)  # (n,) this sequence's keys
        pages = block_table[b, j // P].long()  # (n,)
        out[b], lse[b] = _attend(q[b], k_cache[pages, j % P], v_cache[pages, j % P], scale, causal, window_size,
                                 softcap, alibi_slopes)
    out = out.to(q.dtype)
    return (out, lse) if return_softmax_lse else out


padded = declare(flash_attn_func, framework="torch", dtypes=DTYPES, fully_masked="zeros")


def _padded_window_swapped(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Planted: window_size read as (right, left)."""
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, tuple(window_size)[::-1], softcap, alibi_slopes,
                           deterministic, return_attn_probs)


padded_window_swapped = declare(_padded_window_swapped, framework="torch", dtypes=("float32",), fully_masked="zeros")


def _without(fn, *names):
    """fn under a signature without `names` (the features a twin does not take), as its own function."""
    import functools
    import inspect

    @functools.wraps(fn)
    def call(*args, **kw):
        return fn(*args, **kw)
    sig = inspect.signature(fn)
    call.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if n not in names])
    return call


# flash-attention 2's varlen names (no sinks); with FA4's learnable_sink (sinks counted in its LSE)
varlen = declare(_without(flash_attn_varlen_func, "learnable_sink"), framework="torch", dtypes=DTYPES,
                 fully_masked="zeros")
varlen_sinks = declare(flash_attn_varlen_func, framework="torch", dtypes=DTYPES, fully_masked="zeros",
                       lse_with_sinks=True)
kvcache = declare(flash_attn_with_kvcache, framework="torch", dtypes=DTYPES, fully_masked="zeros")


def _varlen_reads_max_seqlen_k(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               return_softmax_lse=False):
    """Planted: every sequence reads max_seqlen_k keys from its start (vllm-project/flash-attention#18)."""
    padded = cu_seqlens_k.clone()
    padded[1:] = (cu_seqlens_k[:-1] + max_seqlen_k).clamp(max=k.shape[0])
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, padded, max_seqlen_q, max_seqlen_k, None, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, return_softmax_lse)


varlen_reads_max_seqlen_k = declare(_varlen_reads_max_seqlen_k, framework="torch", dtypes=("bfloat16",),
                                    fully_masked="zeros")


def _varlen_sinks_ignored(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None,
                          softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                          return_softmax_lse=False, learnable_sink=None):
    """Planted: takes FA4's learnable_sink and never applies it (the harness's own slip before 2026-12-07)."""
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, return_softmax_lse)


varlen_sinks_ignored = declare(_varlen_sinks_ignored, framework="torch", dtypes=("float32",), fully_masked="zeros",
                               lse_with_sinks=True)
