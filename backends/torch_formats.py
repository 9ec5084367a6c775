"""torch-math's packed and paged calls (backends/serving.py's hooks), by its own gather in torch.

The packed sequences (or the pages a block table names) are copied with torch indexing into a
padded batch with per-sequence lengths and positions, then torch-math's padded kernel runs; the
output goes back onto the token axis.  Nothing is gathered through NumPy or `specs`: a slip in the
index arithmetic here is torch-math's, and the packed and paged families judge it.
"""
from __future__ import annotations

from dataclasses import replace


def _extents(torch, args) -> tuple:
    """(cu_q, cu_k, used_k) as Python ints: sequence b's rows and keys on the token axes."""
    cu_q = args.cu_seqlens_q.to(torch.int64).tolist()
    cu_k = args.cu_seqlens_k.to(torch.int64).tolist()
    used = [b - a for a, b in zip(cu_k[:-1], cu_k[1:], strict=True)] if args.seqused_k is None else \
        args.seqused_k.to(torch.int64).tolist()
    return cu_q, cu_k, used


def gathered_packed(self, q, k, v, args, call):
    """q (total_q, Hq, E), k/v (total_k, Hkv, D) -> (total_q, Hq, Ev) [, lse (Hq, total_q)]; rows no
    sequence owns are zeros (their LSE -inf)."""
    torch = self.torch
    cu_q, cu_k, used = _extents(torch, args)
    B, Hq, Hkv = len(cu_q) - 1, q.shape[1], k.shape[1]
    qp = q.new_zeros((B, Hq, args.max_seqlen_q, q.shape[2]))  # (B, Hq, Lq, E)
    kp = k.new_zeros((B, Hkv, args.max_seqlen_k, k.shape[2]))  # (B, Hkv, Lk, E)
    vp = v.new_zeros((B, Hkv, args.max_seqlen_k, v.shape[2]))  # (B, Hkv, Lk, Ev)
    for b in range(B):
        nq, nk = cu_q[b + 1] - cu_q[b], used[b]
        qp[b, :, :nq] = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1)  # (Hq, n_q, E)
        kp[b, :, :nk] = k[cu_k[b]:cu_k[b] + nk].transpose(0, 1)  # (Hkv, n_k, E)
        vp[b, :, :nk] = v[cu_k[b]:cu_k[b] + nk].transpose(0, 1)  # (Hkv, n_k, Ev)
    i32 = dict(dtype=torch.int32, device=q.device)
    padded = replace(call, positions="per_sequence", q_lengths=torch.tensor([cu_q[b + 1] - cu_q[b] for b in range(B)],
                                                                               **i32),
                     kv_lengths=torch.tensor(used, **i32), kv_starts=None)
    y = self.native_attention(qp, kp, vp, padded)
    out, lse = y if call.return_lse else (y, None)  # (B, Hq, Lq, Ev), (B, Hq, Lq)
    rows = q.new_zeros((q.shape[0], Hq, out.shape[-1]))  # (total_q, Hq, Ev)
    lses = torch.full((Hq, q.shape[0]), float("-inf"), dtype=torch.float32 if lse is None else lse.dtype,
                      device=q.device)  # (Hq, total_q)
    for b in range(B):
        nq = cu_q[b + 1] - cu_q[b]
        rows[cu_q[b]:cu_q[b + 1]] = out[b, :, :nq].transpose(0, 1)  # (n_q, Hq, Ev)
        if lse is not None:
            lses[:, cu_q[b]:cu_q[b + 1]] = lse[b, :, :nq]  # (Hq, n_q)
    return (rows, lses) if call.return_lse else rows


def gathered_paged(self, q, k_cache, v_cache, args, call):
    """q (B, Hq, Lq, E), caches (pages, P, Hkv, D) NHD or (pages, Hkv, P, D) HND -> (B, Hq, Lq, Ev)
    [, lse]: key j of sequence b read from page block_table[b, j // P], slot j % P."""
    torch = self.torch
    kc, vc = (x if args.layout == "NHD" else x.transpose(1, 2) for x in (k_cache, v_cache))  # (pages, P, Hkv, D)
    P = kc.shape[1]
    lens = args.cache_seqlens.to(torch.int64)  # (B,)
    table = args.block_table.to(torch.int64)  # (B, max_pages)
    Lk = int(lens.max()) if lens.numel() else 0
    j = torch.arange(Lk, device=q.device)  # (Lk,)
    inside = j[None, :] < lens[:, None]  # (B, Lk)
    cols = torch.clamp(j // P, max=table.shape[1] - 1)  # (Lk,) a slot past a sequence reads no column
    page = torch.where(inside, table[:, cols], torch.zeros_like(table[:, cols]))  # (B, Lk)
    k, v = kc[page, j % P], vc[page, j % P]  # (B, Lk, Hkv, D)
    k, v = (torch.where(inside[..., None, None], x, torch.zeros_like(x)).transpose(1, 2) for x in (k, v))  # (B, Hkv, Lk, D)
    starts = None if args.cache_leftpad is None else args.cache_leftpad.to(torch.int32)
    return self.native_attention(q, k, v, replace(call, positions="per_sequence", kv_lengths=lens.to(torch.int32),
                                                  kv_starts=starts))
