"""numpy-naive's and numpy-tiled's packed and paged calls (backends/serving.py's hooks).

numpy-naive takes them by its own gather: the sequences (or pages) copied into a padded batch with
per-sequence lengths and positions, then its padded kernel.  numpy-tiled takes them natively: a
packed call runs its online softmax on each sequence's own slice of the token axis, and a paged
call's key blocks are the pages themselves, read through the block table (only the pages holding a
sequence's keys; slots before its cache_leftpad zeroed before use, past cache_seqlens never cut) -
in a stacked layout each page's K and V halves read from the one tensor (``kv[page, 0]``,
``kv[page, 1]``: NumPy views, the numbers a separate cache would hold, in the same order).
fp8 inputs (numpy-tiled's): each sequence's own row of the descales (`numpy_fp8.of_sequence`), a page's
keys dequantised as it is read, P rounded tile by tile as its padded call rounds it.
Neither checks its index arguments (the harness validates them): what they do with bad ones is
what properties/test_bad_indices.py records.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends import numpy_fp8
from attnspec.specs.formats import gather_paged, kv_halves, split_layout


def _per(x, B: int):
    return None if x is None else np.broadcast_to(np.asarray(x), (B,))


def _packed_extents(args) -> tuple:
    """(cu_q, cu_k, used_k) as int64 arrays: sequence b's rows and keys on the token axes."""
    cu_q, cu_k = np.asarray(args.cu_seqlens_q, np.int64), np.asarray(args.cu_seqlens_k, np.int64)
    used = np.diff(cu_k) if args.seqused_k is None else np.asarray(args.seqused_k, np.int64)
    return cu_q, cu_k, used


def _packed_out(outs, lses, total_q: int, like, call):
    """Each sequence's (1, Hq, n_b, Ev) output stacked back on the token axis (total_q, Hq, Ev); rows
    past cu_seqlens_q[-1] zeros.  With the LSE: (Hq, total_q), -inf there."""
    Hq, Ev = like.shape[1], outs[0].shape[-1] if outs else 0
    rows = [np.swapaxes(o[0], 0, 1) for o in outs]  # each (n_b, Hq, Ev)
    n = sum(r.shape[0] for r in rows)
    out = np.concatenate(rows + [np.zeros((total_q - n, Hq, Ev), dtype=like.dtype)]).astype(like.dtype, copy=False)
    if not call.return_lse:
        return out
    lse = np.concatenate([x[0] for x in lses] + [np.full((Hq, total_q - n), -np.inf)], axis=-1)  # (Hq, total_q)
    return out, lse


def gathered_packed(self, q, k, v, args, call):
    """numpy-naive: the packed sequences gathered into a padded batch, lengths and positions per sequence."""
    cu_q, cu_k, used = _packed_extents(args)
    B, Hq, Hkv = cu_q.size - 1, q.shape[1], k.shape[1]
    qp = np.zeros((B, Hq, args.max_seqlen_q, q.shape[2]), dtype=q.dtype)  # (B, Hq, Lq, E)
    kp = np.zeros((B, Hkv, args.max_seqlen_k, k.shape[2]), dtype=k.dtype)  # (B, Hkv, Lk, E)
    vp = np.zeros((B, Hkv, args.max_seqlen_k, v.shape[2]), dtype=v.dtype)  # (B, Hkv, Lk, Ev)
    for b in range(B):
        nq, nk = cu_q[b + 1] - cu_q[b], used[b]
        qp[b, :, :nq] = np.swapaxes(q[cu_q[b]:cu_q[b + 1]], 0, 1)
        kp[b, :, :nk] = np.swapaxes(k[cu_k[b]:cu_k[b] + nk], 0, 1)
        vp[b, :, :nk] = np.swapaxes(v[cu_k[b]:cu_k[b] + nk], 0, 1)
    padded = replace(call, positions="per_sequence", q_lengths=np.diff(cu_q), kv_lengths=used, kv_starts=None)
    y = self.native_attention(qp, kp, vp, padded)
    out, lse = y if call.return_lse else (y, None)
    outs = [out[b:b + 1, :, :cu_q[b + 1] - cu_q[b]] for b in range(B)]
    lses = None if lse is None else [lse[b:b + 1, :, :cu_q[b + 1] - cu_q[b]] for b in range(B)]
    return _packed_out(outs, lses, q.shape[0], q, call)


def gathered_packed_backward(self, q, k, v, grad_out, args, call):
    """Both numpy backends: the packed sequences gathered into a padded batch, its backward, scattered back."""
    cu_q, cu_k, used = _packed_extents(args)
    B, Hq, Hkv = cu_q.size - 1, q.shape[1], k.shape[1]
    qp = np.zeros((B, Hq, args.max_seqlen_q, q.shape[2]), dtype=q.dtype)  # (B, Hq, Lq, E)
    gp = np.zeros((B, Hq, args.max_seqlen_q, v.shape[2]), dtype=q.dtype)  # (B, Hq, Lq, Ev)
    kp = np.zeros((B, Hkv, args.max_seqlen_k, k.shape[2]), dtype=k.dtype)  # (B, Hkv, Lk, E)
    vp = np.zeros((B, Hkv, args.max_seqlen_k, v.shape[2]), dtype=v.dtype)  # (B, Hkv, Lk, Ev)
    for b in range(B):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + used[b])
        qp[b, :, :cu_q[b + 1] - cu_q[b]], gp[b, :, :cu_q[b + 1] - cu_q[b]] = (np.swapaxes(x[rows], 0, 1)
                                                                              for x in (q, grad_out))
        kp[b, :, :used[b]], vp[b, :, :used[b]] = (np.swapaxes(x[keys], 0, 1) for x in (k, v))
    padded = replace(call, positions="per_sequence", q_lengths=np.diff(cu_q), kv_lengths=used, kv_starts=None)
    dqp, dkp, dvp = self.native_attention_backward(qp, kp, vp, gp, padded)[:3]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)  # tokens no sequence owns: exactly 0
    for b in range(B):
        dq[cu_q[b]:cu_q[b + 1]] = np.swapaxes(dqp[b, :, :cu_q[b + 1] - cu_q[b]], 0, 1)
        dk[cu_k[b]:cu_k[b] + used[b]] = np.swapaxes(dkp[b, :, :used[b]], 0, 1)
        dv[cu_k[b]:cu_k[b] + used[b]] = np.swapaxes(dvp[b, :, :used[b]], 0, 1)
    return dq, dk, dv


def gathered_paged(self, q, k_cache, v_cache, args, call):
    """numpy-naive: the pages gathered into contiguous keys, then its padded kernel."""
    lens = np.asarray(args.cache_seqlens, np.int64)
    k, v = gather_paged(k_cache, v_cache, args.block_table, lens, args.layout, Lk=int(lens.max(initial=0)))
    return self.native_attention(q, k, v, replace(call, positions="per_sequence", kv_lengths=lens,
                                                  kv_starts=args.cache_leftpad))


def tiled_packed(self, q, k, v, args, call):
    """numpy-tiled: its online softmax on each sequence's own slice of the token axes."""
    cu_q, cu_k, used = _packed_extents(args)
    seq = replace(call, positions="per_sequence", q_lengths=None, kv_lengths=None, kv_starts=None)
    B = cu_q.size - 1
    outs, lses = [], []
    for b in range(B):
        qb = np.swapaxes(q[cu_q[b]:cu_q[b + 1]], 0, 1)[None]  # (1, Hq, n_q, E)
        kb, vb = (np.swapaxes(x[cu_k[b]:cu_k[b] + used[b]], 0, 1)[None] for x in (k, v))  # (1, Hkv, n_k, D)
        y = self.native_attention(qb, kb, vb, replace(seq, **numpy_fp8.of_sequence(call, b, B)))
        out, lse = y if call.return_lse else (y, None)
        outs.append(out)
        lses.append(lse)
    return _packed_out(outs, lses, q.shape[0], q, call)


def _page(cache, page: int, n: int, layout: str, half: int) -> np.ndarray:
    """The first n slots of one page as (1, Hkv, n, D): of K (half 0) or V (half 1) in a stacked layout."""
    stacked, base = split_layout(layout)
    x = cache[page, half] if stacked else cache[page]  # (P, Hkv, D) NHD or (Hkv, P, D) HND
    x = x[:n] if base == "NHD" else np.swapaxes(x[:, :n], 0, 1)  # (n, Hkv, D)
    return np.swapaxes(x, 0, 1)[None]


def tiled_paged(self, q, k_cache, v_cache, args, call):
    """numpy-tiled: its key blocks are the pages, read through the block table sequence by sequence."""
    B, P = q.shape[0], args.page_size
    stacked, base = split_layout(args.layout)
    v_cache = k_cache if stacked else v_cache  # the one tensor: _page reads its V half
    Hkv = k_cache.shape[(2 if base == "NHD" else 1) + stacked]
    lens = np.asarray(args.cache_seqlens, np.int64)
    pads = np.zeros(B, np.int64) if args.cache_leftpad is None else np.asarray(args.cache_leftpad, np.int64)
    table = np.asarray(args.block_table, np.int64)
    q_lengths = _per(call.q_lengths, B)
    outs, lses = [], []
    for b in range(B):
        seq = replace(call, positions="per_sequence", kv_lengths=lens[b:b + 1], kv_starts=pads[b:b + 1],
                      q_lengths=None if q_lengths is None else q_lengths[b:b + 1], **numpy_fp8.of_sequence(call, b, B))
        tiles = []
        for c in range(int(-(-lens[b] // P))):
            j0, j1 = c * P, min((c + 1) * P, int(lens[b]))
            if j1 <= pads[b]:
                continue  # a page of left padding only: never read
            kb, vb = (_page(x, int(table[b, c]), j1 - j0, args.layout, half) for half, x in enumerate((k_cache, v_cache)))
            if j0 < pads[b]:  # the page's slots before the sequence's start: zeroed, never used
                before = (np.arange(j0, j1) < pads[b])[:, None]
                kb, vb = (np.where(before, x.dtype.type(0), x) for x in (kb, vb))
            tiles.append((j0, kb, vb))
        (wq,) = self._widen(q[b:b + 1])  # (1, Hq, Lq, E)
        fp8 = call.dtype in numpy_fp8.P_FORMATS  # FA3's fp8 forward (NumpyTiled.native_attention), page by page
        wq = numpy_fp8.dequantised_qk(wq, None, seq)[0]
        wide = [(j0, numpy_fp8.dequantised_qk(None, kb if fp8 else self._widen(kb)[0], seq)[1],
                 vb if fp8 else self._widen(vb)[0]) for j0, kb, vb in tiles]
        shape_k = np.zeros((1, Hkv, 0, k_cache.shape[-1]), dtype=wq.dtype)  # (1, Hkv, 0, E): shapes only
        shape_v = np.zeros((1, Hkv, 0, v_cache.shape[-1]), dtype=wq.dtype)  # (1, Hkv, 0, Ev)
        out, _, _, lse = self._forward(wq, shape_k, shape_v, seq if fp8 else self._wide_call(seq), tiles=wide,
                                       p_dtype=call.dtype if fp8 else None)
        outs.append(numpy_fp8.descaled_output(out, seq).astype(q.dtype, copy=False))
        lses.append(lse)
    out = np.concatenate(outs)  # (B, Hq, Lq, Ev)
    return (out, np.concatenate(lses)) if call.return_lse else out


def appended_paged(self, q, k_cache, v_cache, k_new, v_new, args, call):
    """Both numpy backends: the new keys written through the block table in place, then the paged call."""
    P, lens = args.page_size, np.asarray(args.cache_seqlens, np.int64)
    table = np.asarray(args.block_table, np.int64)
    kc, vc = kv_halves(k_cache, v_cache, args.layout)  # a stacked tensor's halves: views, written through
    nhd = split_layout(args.layout)[1] == "NHD"
    for b in range(table.shape[0]):
        for t in range(k_new.shape[1]):
            page, slot = table[b, (lens[b] + t) // P], (lens[b] + t) % P
            cut = (page, slot) if nhd else (page, slice(None), slot)
            kc[cut], vc[cut] = k_new[b, t], v_new[b, t]  # (Hkv, D)
    grown = replace(args, cache_seqlens=(lens + k_new.shape[1]).astype(np.int32))
    return self.native_paged(q, k_cache, v_cache, grown, call)
