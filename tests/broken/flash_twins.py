"""NumPy twins of flash-attention's serving entry points, with its names and layouts (issue 30).

``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` as a user would transcribe them: per
sequence, bottom-right aligned at the sequence's own lengths; keys past ``seqused_k`` /
``cache_seqlens`` and before ``cache_leftpad`` never read.  Written from flash-attention's
docstrings, not from specs/ (tests/broken never reads the definition).  The planted kernels
(serving_bugs.py) are these with one slip each, selected by ``slip``.  fp8 inputs come with FA3's
``q_descale``, ``k_descale``, ``v_descale`` (B, Hkv): sequence b's q and k times row b (a KV head's over
its query group), its output times v's (fp8_serving_bugs.py's slips misread them).
"""
from __future__ import annotations

import numpy as np


def attend(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, alibi=None, slip="", shift=0):
    """One sequence: q (Lq, Hq, E), k (Lk, Hkv, E), v (Lk, Hkv, Ev) -> out (Lq, Hq, Ev), lse (Hq, Lq);
    `shift`: a slip's misplaced diagonal (query positions moved back by it)."""
    Lq, Hq, _ = q.shape
    Lk, Hkv = k.shape[:2]
    kk, vv = (np.repeat(np.asarray(x, np.float64), Hq // max(Hkv, 1), axis=1) for x in (k, v))  # (Lk, Hq, D)
    s = np.einsum("qhe,khe->hqk", np.asarray(q, np.float64), kk) * scale  # (Hq, Lq, Lk)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    i = np.arange(Lq)[:, None] + (0 if slip == "top_left" else Lk - Lq) - shift  # (Lq, 1) query i's position
    j = np.arange(Lk)[None, :]  # (1, Lk)
    if alibi is not None:
        s = s - np.asarray(alibi, np.float64)[:, None, None] * np.abs(i - j)
    left, right = window
    right = 0 if causal else right
    vis = np.ones((Lq, Lk), dtype=bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    s = np.where(vis, s, -np.inf)  # (Hq, Lq, Lk)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (Hq, Lq, 1)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)  # (Hq, Lq, 1)
    out = np.einsum("hqk,khd->qhd", e / np.where(total > 0, total, 1.0), vv)  # (Lq, Hq, Ev)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(np.where(total[..., 0] > 0, total[..., 0], 1.0)), -np.inf)
    return out, lse  # (Lq, Hq, Ev), (Hq, Lq)


def _descaled(x, descale, b: int, slip: str = ""):
    """x (L, H, D) of sequence b times its row of a (B, Hkv) descale, a KV head's over its query group."""
    if descale is None or slip == "descales_dropped":
        return np.asarray(x, np.float64)
    if np.ndim(descale) == 0:  # one a tensor (FlashInfer's and vLLM's k_scale, v_scale)
        return np.asarray(x, np.float64) * float(descale)
    row = np.asarray(descale, np.float64)[0 if slip == "descale_first_sequence" else b]  # (Hkv,)
    return np.asarray(x, np.float64) * np.repeat(row, x.shape[1] // row.shape[0])[None, :, None]


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None, softmax_scale=None,
           causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False, slip="",
           q_descale=None, k_descale=None, v_descale=None):
    """q (total_q, Hq, E), k/v (total_k, Hkv, E): flash_attn_varlen_func's contract (FA3's descales)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = np.zeros(q.shape[:2] + v.shape[-1:])  # (total_q, Hq, Ev): rows past cu_seqlens_q[-1] zeros
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)  # (Hq, total_q)
    if slip == "decode_dispatch_by_first" and len(cu_seqlens_q) > 1 and int(cu_seqlens_q[1]) - int(cu_seqlens_q[0]) == 1:
        causal = False  # "a decode batch": the first sequence's one query chose the kernel with no causal mask
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1, k0 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(cu_seqlens_k[b])
        k1 = int(cu_seqlens_k[b + 1]) if seqused_k is None else k0 + int(seqused_k[b])
        if slip == "padded_seqlen_k":  # the kernel's padded length instead of the sequence's (vllm-project/flash-attention#18)
            k1 = k0 + int(max_seqlen_k) if seqused_k is None else int(cu_seqlens_k[b + 1])
        if slip == "past_cu_seqlens":  # one token more than the sequence owns
            k1 += 1
        if q1 > q0:
            out[q0:q1], lse[:, q0:q1] = attend(_descaled(q[q0:q1], q_descale, b, slip),
                                               _descaled(k[k0:k1], k_descale, b, slip), v[k0:k1], scale, causal,
                                               window_size, softcap, alibi_slopes, slip)
            out[q0:q1] = _descaled(out[q0:q1], v_descale, b, slip)
    n = int(cu_seqlens_q[-1])
    if slip == "rows_past_cu_seqlens" and n < q.shape[0]:  # the last sequence's block runs on past its end
        k0 = int(cu_seqlens_k[-2]) if len(cu_seqlens_k) > 1 else 0
        out[n:], lse[:, n:] = attend(q[n:], k[k0:], v[k0:], scale, False, (-1, -1), softcap, alibi_slopes)
    out = out.astype(q.dtype)
    return (out, lse) if return_softmax_lse else out


def _sequence_keys(k_cache, v_cache, b, start, end, block_table, slip=""):
    """Keys [start, end) of sequence b, (n, Hkv, D), from a contiguous (B, S, Hkv, D) or paged cache."""
    if block_table is None:
        return k_cache[b, start:end], v_cache[b, start:end]
    P = k_cache.shape[1]
    j = np.arange(start, end)
    if slip == "clamp_indices":  # "safe" indexing: a column past the table, a page id outside the pool clamped
        pages = np.clip(block_table[b, np.minimum(j // P, block_table.shape[1] - 1)], 0, k_cache.shape[0] - 1)
    else:
        pages = block_table[b, j // P] if slip != "page_order" else np.sort(block_table[b])[j // P]
    return k_cache[pages, j % P], v_cache[pages, j % P]


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table, slip=""):
    """k, v (B, n, Hkv, D) written in place at slots cache_seqlens[b] + t (through block_table when paged)."""
    for b in range(k.shape[0]):
        for t in range(k.shape[1]):
            j = int(cache_seqlens[b]) + t + (1 if slip == "append_one_late" else 0)
            row = (b + 1) % k.shape[0] if slip == "append_next_sequence" else b  # whose slots it writes
            if block_table is None:
                k_cache[row, j], v_cache[row, j] = k[b, t], v[b, t]
            else:
                P = k_cache.shape[1]
                page = block_table[row, j // P]
                k_cache[page, j % P], v_cache[page, j % P] = k[b, t], v[b, t]


def kvcache(q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, block_table=None, softmax_scale=None,
            causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False, slip="",
            k=None, v=None, q_descale=None, k_descale=None, v_descale=None):
    """q (B, Lq, Hq, E); k_cache (B, S, Hkv, E) or paged (num_pages, P, Hkv, E) with block_table; k, v
    (B, n, Hkv, D): appended in place at cache_seqlens first, then attention over the grown cache."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    B = q.shape[0]
    if k is not None:
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table, slip)
        cache_seqlens = np.asarray(cache_seqlens) + k.shape[1]
    if slip == "prescale_in_place" and block_table is not None:  # keys scaled where they lie, once a sequence
        P = k_cache.shape[1]
        for b in range(B):
            k_cache[block_table[b, :-(-int(cache_seqlens[b]) // P)]] *= scale  # a shared page: scaled twice
        scale = 1.0
    out = np.zeros(q.shape[:3] + v_cache.shape[-1:])  # (B, Lq, Hq, Ev)
    lse = np.full((B, q.shape[2], q.shape[1]), -np.inf)  # (B, Hq, Lq)
    for b in range(B):
        end = int(cache_seqlens[b])
        if slip == "decode_skips_newest" and q.shape[1] == 1:
            end -= 1  # the decode path reads keys before cache_seqlens - 1: the newest key left out
        start = 0 if cache_leftpad is None or slip == "ignores_leftpad" else int(cache_leftpad[b])
        if slip == "leftpad_block_mask" and start >= 128:  # padding's whole blocks skipped, the first block
            start = min(end, (start // 128 + 1) * 128)  # read masked by j < leftpad, not block-relative
        if slip == "split_floor" and end - start > 512:  # 512-key partitions counted as n // 512
            end = start + (end - start) // 512 * 512
        if slip == "chunk_within_itself":  # a prefill chunk attends to its own keys only, not to the cache's past
            start = max(start, end - q.shape[1])
        kb, vb = _sequence_keys(k_cache, v_cache, b, start, end, block_table, slip)
        shift = start if slip == "leftpad_counted_twice" else 0  # the diagonal moved back by the padding again
        alibi = alibi_slopes
        if q.shape[1] == 1 and end - start > 512:  # the multi-partition decode kernel (vLLM's v2) of its own
            if slip == "long_decode_gqa_modulo":  # its KV head h % Hkv
                heads = np.arange(q.shape[2]) % kb.shape[1]
                kb, vb = kb[:, heads], vb[:, heads]  # (Lk, Hq, ·)
            if slip == "long_decode_drops_alibi":  # launched without the slopes
                alibi = None
        # the descales' row: the sequence's, or (slip) the one of the page its keys start in
        row = int(block_table[b, 0]) % B if slip == "descale_by_page" and block_table is not None else b
        out[b], lse[b] = attend(_descaled(q[b], q_descale, row, slip), _descaled(kb, k_descale, row, slip), vb, scale,
                                causal, window_size, softcap, alibi, shift=shift)
        out[b] = _descaled(out[b], v_descale, row, slip)
    out = out.astype(q.dtype)
    return (out, lse) if return_softmax_lse else out


def kvcache_scaled(q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                   causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False,
                   slip="", k=None, v=None, k_scale=None, v_scale=None):
    """`kvcache` with FlashInfer's and vLLM's fp8 KV cache scales: one ``k_scale``, ``v_scale`` a tensor (q 16-bit)."""
    return kvcache(q, k_cache, v_cache, cache_seqlens, cache_leftpad, block_table, softmax_scale, causal, window_size,
                   softcap, alibi_slopes, return_softmax_lse, slip, k=k, v=v, k_descale=k_scale, v_descale=v_scale)


def stacked_halves(paged_kv_cache, slip=""):
    """The K and V caches (num_pages, P, Hkv, D) of FlashInfer's one tensor (num_pages, 2, P, Hkv, D):
    views, so an append writes through.  slip "v_page_stride": V of page p addressed at a separate V
    cache's page stride - half-page p + 1 of the tensor instead of 2p + 1 (right for page 0 only)."""
    if slip == "v_page_stride":
        halves = paged_kv_cache.reshape((2 * paged_kv_cache.shape[0],) + paged_kv_cache.shape[2:])  # K0, V0, K1, ...
        return paged_kv_cache[:, 0], halves[1:paged_kv_cache.shape[0] + 1]
    return paged_kv_cache[:, 0], paged_kv_cache[:, 1]


def kvcache_stacked(q, paged_kv_cache, cache_seqlens=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                    causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False,
                    slip="", k=None, v=None):
    """`kvcache` over one stacked K/V tensor (num_pages, 2, P, Hkv, E): index 0 the keys, 1 the values."""
    k_cache, v_cache = stacked_halves(paged_kv_cache, slip)
    return kvcache(q, k_cache, v_cache, cache_seqlens, cache_leftpad, block_table, softmax_scale, causal, window_size,
                   softcap, alibi_slopes, return_softmax_lse, slip, k=k, v=v)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           return_softmax_lse=False):
    """The correct twin of flash-attention's flash_attn_varlen_func."""
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, return_softmax_lse)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, return_softmax_lse=False):
    """The correct twin of flash-attention's flash_attn_with_kvcache: k, v appended in place at cache_seqlens."""
    return kvcache(q, k_cache, v_cache, cache_seqlens, cache_leftpad, block_table, softmax_scale, causal, window_size,
                   softcap, alibi_slopes, return_softmax_lse, k=k, v=v)


def flash_attn_with_paged_kv_cache(q, paged_kv_cache, k=None, v=None, cache_seqlens=None, cache_leftpad=None,
                                   block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                                   softcap=0.0, alibi_slopes=None, return_softmax_lse=False):
    """flash_attn_with_kvcache's correct twin over FlashInfer's one K/V tensor (``paged_kv_cache``)."""
    return kvcache_stacked(q, paged_kv_cache, cache_seqlens, cache_leftpad, block_table, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, return_softmax_lse, k=k, v=v)
